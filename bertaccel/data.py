"""Text classification data: read the splits, tokenize once (cached on disk), batch with
dynamic padding.

Sources: the bundled AG News sample (offline default), a local CSV pair, or a hub dataset via
`datasets` (needs network). Whatever the source, a split becomes a `RawSplit` of texts and
contiguous integer labels; only then is it tokenized, so the cache key can be built from the
content itself rather than from a path that might point at changed files.
"""
from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import math
import os
import pickle
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset, Sampler

from bertaccel.distributed import shard

SAMPLES_DIR = Path(__file__).parent / "samples"


class DataError(ValueError):
    """Malformed input data; the message names the file and the problem in one line."""


class DatasetUnavailable(RuntimeError):
    """The dataset exists but cannot be reached from here (e.g. a hub dataset offline)."""


@dataclass
class RawSplit:
    texts: List[str]
    labels: List[int]


@dataclass
class RawData:
    train: RawSplit
    test: RawSplit
    label_names: List[str]  # label id -> the value found in the source
    train_rows_full: int = 0  # rows of the train split before dataset.train_subset (projections)

    @property
    def num_labels(self) -> int:
        return len(self.label_names)


def _open_text(path: Path):
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def read_csv_split(path: Path, text_columns: Sequence[str], label_column: str) -> Tuple[List[str], List[str]]:
    """Read one CSV file with a header row; returns texts (columns joined by a space) and raw labels."""
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    try:
        with _open_text(path) as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames
            if not header:
                raise DataError(f"{path}: empty file (expected a header row with "
                                f"{', '.join([*text_columns, label_column])})")
            missing = [c for c in [*text_columns, label_column] if c not in header]
            if missing:
                raise DataError(f"{path}: missing column(s) {', '.join(missing)}; the header has "
                                f"{', '.join(header)} (set dataset.text_columns / dataset.label_column)")
            texts, labels = [], []
            for line_no, row in enumerate(reader, start=2):
                if None in row or any(row[c] is None for c in header):
                    # DictReader files surplus fields under the key None and fills missing ones with None
                    fields = len(header) + len(row[None]) if None in row else sum(
                        row[c] is not None for c in header)
                    raise DataError(f"{path}: line {line_no} has {fields} fields but the header has {len(header)}")
                label = row[label_column].strip()
                if not label:
                    raise DataError(f"{path}: line {line_no} has an empty '{label_column}'")
                texts.append(" ".join(row[c] for c in text_columns))
                labels.append(label)
    except (UnicodeDecodeError, csv.Error, OSError, EOFError) as e:
        raise DataError(f"{path}: not a readable UTF-8 CSV ({type(e).__name__}: {e})") from None
    if not texts:
        raise DataError(f"{path}: no data rows after the header (empty split)")
    return texts, labels


def _label_order(values: Sequence[str]) -> List[str]:
    """Integer-looking labels sort numerically (so 0..K-1 keep their ids), others alphabetically."""
    unique = set(values)
    try:
        return sorted(unique, key=int)
    except ValueError:
        return sorted(unique)


def encode_labels(train_labels: Sequence[str], test_labels: Sequence[str], test_name: str) -> Tuple[List[int], List[int], List[str]]:
    names = _label_order(train_labels)
    if len(names) < 2:
        raise DataError(f"the train split has {len(names)} distinct label(s); classification needs at least 2")
    index = {n: i for i, n in enumerate(names)}
    unseen = sorted(set(test_labels) - set(index))
    if unseen:
        raise DataError(f"{test_name}: label(s) {', '.join(unseen[:5])} do not occur in the train split")
    return [index[v] for v in train_labels], [index[v] for v in test_labels], names


def _subset(texts: List[str], labels: List[int], n: Optional[int], seed: int) -> RawSplit:
    if n is None or n >= len(texts):
        return RawSplit(texts, labels)
    order = list(range(len(texts)))
    random.Random(seed).shuffle(order)  # the sources may be sorted by label (IMDb is)
    keep = sorted(order[:n])
    return RawSplit([texts[i] for i in keep], [labels[i] for i in keep])


def _read_hub(hub_id: str, text_columns: Sequence[str], label_column: str):
    try:
        import datasets

        ds = datasets.load_dataset(hub_id)
    except Exception as e:  # offline: ConnectionError, OfflineModeIsEnabled, FileNotFoundError...
        first = str(e).splitlines()[0] if str(e) else ""
        raise DatasetUnavailable(f"hub dataset {hub_id!r} cannot be loaded here "
                                 f"({type(e).__name__}: {first[:200]}); use dataset=csv with local files") from None
    out = []
    for split in ("train", "test"):
        if split not in ds:
            raise DataError(f"hub dataset {hub_id}: no '{split}' split (has {', '.join(ds)})")
        cols = ds[split].column_names
        missing = [c for c in [*text_columns, label_column] if c not in cols]
        if missing:
            raise DataError(f"hub dataset {hub_id}/{split}: missing column(s) {', '.join(missing)}; has {', '.join(cols)}")
        texts = [" ".join(parts) for parts in zip(*(ds[split][c] for c in text_columns))]
        out.append((texts, [str(v) for v in ds[split][label_column]]))
    return out


def load_raw(ds_cfg: Any, cache_dir: Optional[str] = None) -> RawData:
    """Read train and test splits as the dataset config says; raises DataError / DatasetUnavailable.

    With a cache_dir, local files (csv, bundled) are parsed once per content: the parsed splits
    are kept under cache_dir/raw, keyed by the files' bytes (file_digest), so later runs skip the
    CSV parse, and a file edited in place is parsed again whatever its size and mtime say."""
    if ds_cfg.source == "hub":
        (tr_texts, tr_raw), (te_texts, te_raw) = _read_hub(ds_cfg.hub_id, ds_cfg.text_columns, ds_cfg.label_column)
        test_name = f"{ds_cfg.hub_id}/test"
    else:
        base = SAMPLES_DIR if ds_cfg.source == "bundled" else Path.cwd()
        train_path = base / os.path.expanduser(ds_cfg.train_path)
        test_path = base / os.path.expanduser(ds_cfg.test_path)
        for key, path in (("train_path", train_path), ("test_path", test_path)):
            if ds_cfg.source == "csv" and not path.is_file():
                what = "a directory, not a file" if path.is_dir() else "no such file"
                raise DataError(f"dataset.{key}={getattr(ds_cfg, key)}: {what}"
                                + ("" if path == Path(getattr(ds_cfg, key)) else f" ({path})"))
        (tr_texts, tr_raw), (te_texts, te_raw) = _read_files(train_path, test_path, ds_cfg.text_columns,
                                                             ds_cfg.label_column, cache_dir)
        test_name = str(test_path)
    tr_labels, te_labels, names = encode_labels(tr_raw, te_raw, test_name)
    seed = ds_cfg.subset_seed
    return RawData(train=_subset(tr_texts, tr_labels, ds_cfg.train_subset, seed),
                   test=_subset(te_texts, te_labels, ds_cfg.test_subset, seed),
                   label_names=names, train_rows_full=len(tr_texts))


def _read_files(train_path: Path, test_path: Path, text_columns: Sequence[str], label_column: str,
                cache_dir: Optional[str]):
    """((train texts, labels), (test texts, labels)) from the CSVs, or from the parse cache."""
    if cache_dir is None:
        return (read_csv_split(train_path, text_columns, label_column),
                read_csv_split(test_path, text_columns, label_column))
    # The files' bytes, not their path, size and mtime: a file edited in place with its size and
    # mtime put back (touch -r, a copy that keeps times, a coarse-mtime file system) would
    # otherwise train on the old rows. Reading them costs little next to the parse it saves: the
    # IMDb train file (12.8 MB gzip) hashes in 13 ms warm / 36 ms cold, its parse takes 0.45 s
    # (measured on this project's 2-core CI machine).
    digests = [file_digest(p) for p in (train_path, test_path)]
    key = hashlib.sha256(json.dumps([digests, list(text_columns), label_column]).encode()).hexdigest()[:24]
    path = Path(os.path.expanduser(cache_dir)) / "raw" / f"{key}.pkl"
    if path.is_file():
        with open(path, "rb") as f:
            return pickle.load(f)
    parsed = (read_csv_split(train_path, text_columns, label_column),
              read_csv_split(test_path, text_columns, label_column))
    _write_atomic(path, lambda tmp: tmp.write_bytes(pickle.dumps(parsed, protocol=pickle.HIGHEST_PROTOCOL)))
    return parsed


def file_digest(path: Path) -> str:
    """sha256 of a file's bytes, read in 1 MiB chunks (a large CSV is never held whole)."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({type(e).__name__}: {e.strerror or e})") from None
    return h.hexdigest()


def _write_atomic(path: Path, write) -> None:
    """Write then rename: a killed run never leaves a truncated cache file behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class TokenizedSplit(Dataset):
    """Ragged token ids stored flat (ids + offsets) so a cached split is two tensors, not a list."""

    def __init__(self, ids: torch.Tensor, offsets: torch.Tensor, labels: torch.Tensor):
        self.ids, self.offsets, self.labels = ids, offsets, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.ids[self.offsets[i]:self.offsets[i + 1]], self.labels[i]

    @property
    def lengths(self) -> torch.Tensor:
        return self.offsets[1:] - self.offsets[:-1]


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """Identify a tokenizer by what it does (its serialized vocab and rules), not by its path."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return hashlib.sha256(json.dumps(tokenizer.get_vocab(), sort_keys=True).encode()).hexdigest()
    state = json.loads(backend.to_str())
    # Each call with truncation=True rewrites these settings on the backend; they are call
    # arguments (max_length is part of the cache key already), not what the tokenizer is.
    state.pop("truncation", None)
    state.pop("padding", None)
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()


def _split_fingerprint(split: RawSplit) -> str:
    """The rows' content, one to one: each text goes in behind its length, so no two different
    splits give the same bytes (with bare separators, a text holding them could pass for a row
    boundary: ["a<sep>0<sep>b"] labelled 1 and ["a", "b"] labelled 0, 1 hashed alike)."""
    h = hashlib.sha256()
    for text, label in zip(split.texts, split.labels):
        encoded = text.encode()
        h.update(b"%d:%d:" % (len(encoded), label))
        h.update(encoded)
    return h.hexdigest()


def _tokenize(split: RawSplit, tokenizer: Any, max_length: int) -> TokenizedSplit:
    # No padding here: each batch is padded to its own longest sequence by `collate`.
    enc = tokenizer(split.texts, truncation=True, max_length=max_length, padding=False)["input_ids"]
    lengths = torch.tensor([len(x) for x in enc], dtype=torch.int64)
    offsets = torch.zeros(len(enc) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)
    ids = torch.tensor([t for x in enc for t in x], dtype=torch.int32)
    return TokenizedSplit(ids, offsets, torch.tensor(split.labels, dtype=torch.int64))


@dataclass
class TokenizedData:
    train: TokenizedSplit
    test: TokenizedSplit
    cache_hit: bool
    cache_key: str
    tokenize_time_s: float


def tokenize_cached(raw: RawData, tokenizer: Any, max_length: int, cache_dir: str) -> TokenizedData:
    """Tokenize both splits once per (content, tokenizer, max_length); later runs load the file."""
    t0 = time.perf_counter()
    key = hashlib.sha256(json.dumps([_split_fingerprint(raw.train), _split_fingerprint(raw.test),
                                     tokenizer_fingerprint(tokenizer), max_length]).encode()).hexdigest()[:24]
    path = Path(os.path.expanduser(cache_dir)) / "tokens" / f"{key}.pt"
    if path.is_file():
        blob = torch.load(path)
        hit = True
    else:
        blob = {}
        for name in ("train", "test"):
            s = _tokenize(getattr(raw, name), tokenizer, max_length)
            blob[name] = {"ids": s.ids, "offsets": s.offsets, "labels": s.labels}
        _write_atomic(path, lambda tmp: torch.save(blob, tmp))
        hit = False
    splits = {n: TokenizedSplit(b["ids"], b["offsets"], b["labels"]) for n, b in blob.items()}
    return TokenizedData(splits["train"], splits["test"], hit, key, time.perf_counter() - t0)


class PadCollator:
    """Pads a batch to its own longest sequence (dynamic padding), rounded up to a multiple of
    `multiple`, with the attention mask.

    The rounding bounds the number of distinct shapes: kernels that plan or compile per shape
    (cuDNN attention, torch.compile) otherwise meet a new sequence length in nearly every batch.
    rows: fill a short batch up to this many rows (compiled runs: the batch dimension never
    changes, so a short last batch needs no graph of its own). Filler rows are one pad token
    wide in the mask (a row with nothing to attend to would divide by zero in softmax) and
    carry label -100, which the loss and the accuracy ignore.
    """

    def __init__(self, pad_token_id: int, multiple: int = 1, rows: Optional[int] = None):
        self.pad_token_id, self.multiple, self.rows = pad_token_id, multiple, rows

    def __call__(self, batch: List[Tuple[torch.Tensor, torch.Tensor]]) -> Dict[str, torch.Tensor]:
        seqs = [ids.long() for ids, _ in batch]
        labels = torch.stack([label for _, label in batch])
        lengths = torch.tensor([len(s) for s in seqs])
        input_ids = pad_sequence(seqs, batch_first=True, padding_value=self.pad_token_id)
        extra = -input_ids.shape[1] % self.multiple
        if extra:
            input_ids = F.pad(input_ids, (0, extra), value=self.pad_token_id)
        fill = (self.rows or 0) - len(seqs)
        if fill > 0:
            input_ids = F.pad(input_ids, (0, 0, 0, fill), value=self.pad_token_id)
            lengths = F.pad(lengths, (0, fill), value=1)
            labels = F.pad(labels, (0, fill), value=-100)
        attention_mask = (torch.arange(input_ids.shape[1])[None, :] < lengths[:, None]).long()
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


class LengthGroupedBatches(Sampler[List[int]]):
    """Shuffled batches of similar length, so dynamic padding pads little.

    Each epoch: a random permutation, cut into mega-batches of `MEGA` batches; each mega-batch
    sorted by length and cut into batches; then the batch order shuffled. On the AG News sample
    this brings the mean padded length per batch from ~102 to ~55 tokens (mean length 53).
    """

    MEGA = 50

    def __init__(self, lengths: torch.Tensor, batch_size: int, generator: torch.Generator,
                 rank: int = 0, world: int = 1):
        self.lengths, self.batch_size, self.generator = lengths, batch_size, generator
        # Data parallel: every rank draws the same permutation and batches (same seed), then
        # takes every world-th batch: disjoint shares, the same bucket structure, equal counts.
        self.rank, self.world = rank, world

    def __len__(self) -> int:
        return math.ceil(len(self.lengths) / self.batch_size) // self.world

    def __iter__(self) -> Iterator[List[int]]:
        perm = torch.randperm(len(self.lengths), generator=self.generator)
        # Data parallel: a step's N batches (one per rank) are N neighbours of one sorted
        # mega-batch, so every rank pads to about the same length. Each step's all-reduce makes
        # every rank wait for the slowest; batches drawn from unrelated places would make most
        # steps as slow as the longer one. Mega-batches hold a multiple of N batches for that.
        mega = -(-self.MEGA // self.world) * self.world * self.batch_size
        batches = []
        for start in range(0, len(perm), mega):
            chunk = perm[start:start + mega]
            chunk = chunk[torch.argsort(self.lengths[chunk], descending=True, stable=True)]
            batches += [chunk[i:i + self.batch_size].tolist() for i in range(0, len(chunk), self.batch_size)]
        # Steps of N neighbouring batches; the last < N batches are dropped so every rank takes
        # the same number of steps. A partial batch can only be the last of its mega-batch; the
        # shuffle may place it anywhere, which is harmless since accumulation weights every
        # sample exactly. One process (N = 1): one batch per step, the order as before.
        steps = [batches[i:i + self.world] for i in range(0, len(batches) - self.world + 1, self.world)]
        for i in torch.randperm(len(steps), generator=self.generator).tolist():
            yield steps[i][self.rank]


def make_loader(split: TokenizedSplit, batch_size: int, pad_token_id: int, shuffle: bool, seed: int,
                num_workers: int, pin_memory: bool, group_by_length: bool = False,
                pad_to_multiple_of: int = 1, fixed_rows: bool = False, rank: int = 0, world: int = 1,
                persistent_workers: bool = True, prefetch_factor: Optional[int] = None) -> DataLoader:
    """fixed_rows: every batch has batch_size rows (PadCollator's filler rows). rank/world: data
    parallel, this rank's share (training: equal batch counts per rank; evaluation: every row
    once over all ranks, the counts are summed afterwards)."""
    # A generator of the run's own: the data order depends on the seed only, not on what ran before.
    generator = torch.Generator().manual_seed(seed) if shuffle else None
    common = dict(collate_fn=PadCollator(pad_token_id, pad_to_multiple_of, batch_size if fixed_rows else None),
                  num_workers=num_workers, pin_memory=pin_memory,
                  persistent_workers=persistent_workers and num_workers > 0,
                  **({"prefetch_factor": prefetch_factor} if num_workers > 0 and prefetch_factor else {}))
    if shuffle and group_by_length:
        return DataLoader(split, batch_sampler=LengthGroupedBatches(split.lengths, batch_size, generator, rank, world),
                          **common)
    if shuffle:
        # Plain shuffle: a permutation per epoch from the run's generator, batched, sharded.
        return DataLoader(split, batch_sampler=ShuffledBatches(len(split), batch_size, generator, rank, world), **common)
    # Evaluation: order does not matter; grouped by length, rows sorted by length (least padding).
    order = torch.argsort(split.lengths, stable=True).tolist() if group_by_length else list(range(len(split)))
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    return DataLoader(split, batch_sampler=shard(batches, rank, world, equal=False), **common)


class ShuffledBatches(Sampler[List[int]]):
    """A fresh permutation per epoch cut into batches; under data parallel, every world-th batch."""

    def __init__(self, n: int, batch_size: int, generator: torch.Generator, rank: int = 0, world: int = 1):
        self.n, self.batch_size, self.generator, self.rank, self.world = n, batch_size, generator, rank, world

    def __len__(self) -> int:
        return math.ceil(self.n / self.batch_size) // self.world

    def __iter__(self) -> Iterator[List[int]]:
        perm = torch.randperm(self.n, generator=self.generator).tolist()
        batches = [perm[i:i + self.batch_size] for i in range(0, self.n, self.batch_size)]
        yield from shard(batches, self.rank, self.world, equal=True)
