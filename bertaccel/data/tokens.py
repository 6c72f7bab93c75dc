"""Tokenize both splits once per (content, tokenizer, max_length) and keep them on disk: later runs
load the file. A split is stored flat (ids + offsets), two tensors instead of a list of lists.
"""
from __future__ import annotations

import hashlib
import io
import json
import time
from dataclasses import dataclass
from typing import Any, Dict, Tuple

import torch
from torch.utils.data import Dataset

from bertaccel.data.cache import cached, entry_path
from bertaccel.data.read import RawData, RawSplit


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


def split_fingerprint(split: RawSplit) -> str:
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
    key = hashlib.sha256(json.dumps([split_fingerprint(raw.train), split_fingerprint(raw.test),
                                     tokenizer_fingerprint(tokenizer), max_length]).encode()).hexdigest()[:24]

    def build() -> Dict[str, Dict[str, torch.Tensor]]:
        blob = {}
        for name in ("train", "test"):
            s = _tokenize(getattr(raw, name), tokenizer, max_length)
            blob[name] = {"ids": s.ids, "offsets": s.offsets, "labels": s.labels}
        return blob

    def check(blob: Any) -> None:
        """Raises unless each split is ids + offsets + labels that agree with each other, with
        the rows of the raw split and with the tokenizer's vocabulary."""
        for name in ("train", "test"):
            ids, offsets, labels = (blob[name][k] for k in ("ids", "offsets", "labels"))
            rows = getattr(raw, name).labels
            if offsets.ndim != 1 or len(offsets) != len(rows) + 1 or int(offsets[0]) != 0 \
                    or int(offsets[-1]) != len(ids) or bool((offsets[1:] < offsets[:-1]).any()):
                raise ValueError(f"{name}: offsets that do not cut {len(ids)} ids into {len(rows)} rows")
            if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= len(tokenizer)):
                raise ValueError(f"{name}: token ids outside the tokenizer's vocabulary")
            if not torch.equal(labels, torch.tensor(rows, dtype=torch.int64)):
                raise ValueError(f"{name}: labels that are not the split's")

    def dump(blob: Dict[str, Dict[str, torch.Tensor]]) -> bytes:
        buffer = io.BytesIO()
        torch.save(blob, buffer)
        return buffer.getvalue()

    blob, hit = cached(entry_path(cache_dir, "tokens", key, ".pt"), build, dump,
                       lambda payload: torch.load(io.BytesIO(payload)), check)
    splits = {n: TokenizedSplit(b["ids"], b["offsets"], b["labels"]) for n, b in blob.items()}
    return TokenizedData(splits["train"], splits["test"], hit, key, time.perf_counter() - t0)


