"""Text classification data: read the splits, tokenize once (cached on disk), batch with
dynamic padding.

Sources: the bundled AG News sample (offline default), a local CSV pair, or a hub dataset via
`datasets` (needs network). Whatever the source, a split becomes a `RawSplit` of texts and
contiguous integer labels; only then is it tokenized, so the cache key can be built from the
content itself rather than from a path that might point at changed files.
"""
# The package's public names, from the module of each step (read -> tokens -> batches).
from bertaccel.data.batches import Batching, LengthGroupedBatches, PadCollator, ShuffledBatches, make_loader
from bertaccel.data.read import (DataError, DatasetSettings, DatasetUnavailable, RawData, RawSplit, encode_labels, file_digest, load_raw,
                                 read_csv_split, split_paths)
from bertaccel.data.tokens import TokenizedData, TokenizedSplit, split_fingerprint, tokenize_cached, tokenizer_fingerprint

__all__ = ["Batching", "DataError", "DatasetSettings", "DatasetUnavailable", "LengthGroupedBatches", "PadCollator", "RawData", "RawSplit",
           "ShuffledBatches", "TokenizedData", "TokenizedSplit", "encode_labels", "file_digest", "load_raw",
           "make_loader", "read_csv_split", "split_fingerprint", "split_paths", "tokenize_cached", "tokenizer_fingerprint"]
