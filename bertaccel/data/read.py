"""Read a dataset's splits into texts and contiguous integer labels (RawData): the bundled AG News
sample, a local CSV pair (its parse cached by the file's content) or a hub dataset (`datasets`,
needs network). Bad input is a DataError in one line naming the file and the problem.
"""
from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import pickle
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Protocol, Sequence, Tuple

from bertaccel.config import first_line
from bertaccel.data.cache import cached, entry_path
from bertaccel.data.csv_text import CsvTextError, read_path

SAMPLES_DIR = Path(__file__).resolve().parents[1] / "samples"  # bertaccel/samples


class DatasetSettings(Protocol):
    """What reading a dataset reads of its config: the typed DatasetConfig, or the section as
    composed where validate() refused the config (a sweep records the refused run, and resume
    compares the rows it would read: record/datasets.py current_digests)."""

    @property
    def source(self) -> str: ...
    @property
    def hub_id(self) -> Optional[str]: ...
    @property
    def train_path(self) -> Optional[str]: ...
    @property
    def test_path(self) -> Optional[str]: ...
    @property
    def text_columns(self) -> Sequence[str]: ...
    @property
    def label_column(self) -> str: ...
    @property
    def train_subset(self) -> Optional[int]: ...
    @property
    def test_subset(self) -> Optional[int]: ...
    @property
    def subset_seed(self) -> int: ...


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


SHOWN_PROBLEMS = 20  # bad lines named one line each; past it, one more line says how many more


def read_csv_split(path: Path, text_columns: Sequence[str], label_column: str) -> Tuple[List[str], List[str]]:
    """Read one CSV file with a header row; returns texts (columns joined by a space) and raw labels.
    Read as data/csv_text.py reads a spreadsheet's or pandas' CSV (gzip-compressed or not, whatever
    its name); every bad line is named at once, a line each."""
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    needed = [*text_columns, label_column]
    try:
        table = read_path(path, needed, gzip_ok=True)
    except CsvTextError as e:
        raise DataError(f"{path}: not a readable UTF-8 CSV: {e}") from None
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({type(e).__name__}: {e.strerror or e})") from None
    header = table.header
    if not header or header == [""]:
        raise DataError(f"{path}: empty file (expected a header row with {', '.join(needed)})")
    missing = [c for c in needed if c not in header]
    if missing:
        raise DataError(f"{path}: missing column(s) {', '.join(missing)}; the header has "
                        f"{', '.join(header)} (set dataset.text_columns / dataset.label_column)")
    at = {c: header.index(c) for c in needed}
    texts, labels, problems = [], [], []
    try:
        for line_no, row in table.records:
            if not row:
                continue  # a blank line
            if len(row) != len(header):
                problems.append(f"{path}: line {line_no} has {len(row)} fields but the header has {len(header)}")
                continue
            label = row[at[label_column]].strip()
            if not label:
                problems.append(f"{path}: line {line_no} has an empty '{label_column}'")
                continue
            value, problem = label_value(label)
            if problem:
                problems.append(f"{path}: line {line_no}, column '{label_column}': {problem}")
                continue
            texts.append(" ".join(row[at[c]] for c in text_columns))
            labels.append(value)
    except csv.Error as e:
        problems.append(f"{path}: not a readable CSV ({e})")
    if problems:
        more = len(problems) - SHOWN_PROBLEMS
        raise DataError("\n".join(problems[:SHOWN_PROBLEMS]
                                  + ([f"{path}: and {more} more bad line(s) after these"] if more > 0 else [])))
    if not texts:
        raise DataError(f"{path}: no data rows after the header (empty split)")
    return texts, labels


def label_value(label: str) -> Tuple[str, Optional[str]]:
    """(the class a label names, None) or (label, why it is refused). Text is a class name as it
    stands; a number is a class id and must be a finite integer: NaN, inf, 1e400 (inf as a
    float) and 2.5 are refused, as a NaN a spreadsheet or pandas wrote for a missing value
    would otherwise become a class of its own. An integer is kept by its value (01, 1.0 and 1e0
    are class 1), so one class is never split by how it was written."""
    try:
        return str(int(label)), None
    except ValueError:
        pass
    try:
        number = float(label)
    except ValueError:
        return label, None
    if not math.isfinite(number):
        return label, (f"label {label!r} is not a finite number (a missing value?); give every row "
                       "a class name or an integer class id")
    if not number.is_integer():
        return label, f"label {label!r} is not an integer; a numeric label is a class id (0, 1, 2, ...)"
    return str(int(number)), None


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
        first = first_line(e, default="")
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
        labels = []
        for row, raw_label in enumerate(ds[split][label_column]):
            value, problem = label_value(str(raw_label).strip())
            if problem:
                raise DataError(f"hub dataset {hub_id}/{split}: row {row}, column '{label_column}': {problem}")
            labels.append(value)
        out.append((texts, labels))
    return out


def split_paths(ds_cfg: DatasetSettings) -> Tuple[Path, Path]:
    """The train and test files a local dataset (csv, bundled) reads: bundled ones from the
    package's samples, csv ones relative to the directory the run starts from."""
    base = SAMPLES_DIR if ds_cfg.source == "bundled" else Path.cwd()
    # Set once validated: options/dataset.py refuses csv without them, and each bundled dataset's
    # YAML names its files. A refused config's are read too (record/datasets.py current_digests).
    if ds_cfg.train_path is None or ds_cfg.test_path is None:
        raise DataError(f"dataset={ds_cfg.source} needs dataset.train_path and dataset.test_path")
    return base / os.path.expanduser(ds_cfg.train_path), base / os.path.expanduser(ds_cfg.test_path)


def load_raw(ds_cfg: DatasetSettings, cache_dir: Optional[str] = None) -> RawData:
    """Read train and test splits as the dataset config says; raises DataError / DatasetUnavailable.

    With a cache_dir, local files (csv, bundled) are parsed once per content: the parsed splits
    are kept under cache_dir/raw, keyed by the files' bytes (file_digest), so later runs skip the
    CSV parse, and a file edited in place is parsed again whatever its size and mtime say."""
    if ds_cfg.source == "hub":
        assert ds_cfg.hub_id is not None  # options/dataset.py refuses source=hub without it
        (tr_texts, tr_raw), (te_texts, te_raw) = _read_hub(ds_cfg.hub_id, ds_cfg.text_columns, ds_cfg.label_column)
        test_name = f"{ds_cfg.hub_id}/test"
    else:
        train_path, test_path = split_paths(ds_cfg)
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
    parsed, _ = cached(entry_path(cache_dir, "raw", key, ".pkl"),
                       lambda: (read_csv_split(train_path, text_columns, label_column),
                                read_csv_split(test_path, text_columns, label_column)),
                       lambda obj: pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), pickle.loads, _check_parsed)
    return parsed


def _check_parsed(parsed: Any) -> None:
    """Raises unless a cached parse is two splits of texts and labels that read_csv_split could
    have returned (an entry of an older version may hold labels it did not check)."""
    (tr_texts, tr_labels), (te_texts, te_labels) = parsed
    for texts, labels in ((tr_texts, tr_labels), (te_texts, te_labels)):
        if len(texts) != len(labels) or not texts:
            raise ValueError(f"a split of {len(texts)} texts and {len(labels)} labels")
        if not all(isinstance(t, str) for t in texts) or any(label_value(v) != (v, None) for v in labels):
            raise ValueError("texts or labels this version reads otherwise (an entry of an older version?)")


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
