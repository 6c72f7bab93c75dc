"""The `dataset` option's checks: its source and what that source needs (bertaccel/data/read.py
reads it); and the name a user reads for it (`imdb (csv)`: the data, then how it is read).
"""
from __future__ import annotations

import re
from pathlib import PurePath
from typing import TYPE_CHECKING, Any, List, Mapping

from bertaccel.config import DATASET_SOURCES, DatasetConfig, not_one_of
from bertaccel.option import Option

if TYPE_CHECKING:
    from bertaccel.config import RunConfig


def from_hub(ds: Any) -> bool:
    """The data comes from the Hugging Face hub (a run needs the hub, or its local cache)."""
    return bool(ds.source == "hub")


def check_dataset(ds: Any) -> List[str]:
    """Why the dataset settings cannot work, one line each."""
    why = not_one_of("dataset.source", ds.source, DATASET_SOURCES)
    found = [why] if why else []
    if ds.source == "hub" and not ds.hub_id:
        found.append(f"dataset={ds.name} (source=hub) needs dataset.hub_id")
    if ds.source == "csv" and not (ds.train_path and ds.test_path):
        missing = " and ".join(f"dataset.{k}=..." for k in ("train_path", "test_path") if not getattr(ds, k))
        found.append(f"dataset=csv needs {missing} (CSV files with a header row, plain or .gz; "
                     "relative paths are from the directory you run from)")
    if not ds.text_columns:
        found.append("dataset.text_columns is empty: name at least one text column")
    return found


class DatasetOption(Option):
    section, schema = "dataset", DatasetConfig

    def check(self, cfg: "RunConfig") -> List[str]:
        """Refuses an unknown source, hub without hub_id, csv without train_path and test_path, and
        an empty text_columns."""
        return check_dataset(cfg.dataset)


OPTION = DatasetOption()


# A CSV file's name that says which split it is, not which data: `train.csv.gz`, `imdb_test.csv`.
_SPLIT_WORDS = r"train|training|test|testing|valid|validation|val|dev|eval"
_SPLIT = re.compile(rf"^(?:{_SPLIT_WORDS})(?:[-_.]|$)|[-_.](?:{_SPLIT_WORDS})$", re.IGNORECASE)
_SUFFIXES = (".gz", ".bz2", ".xz", ".zip", ".csv", ".tsv", ".txt")


def data_name(path: Any) -> str:
    """Which data a local file holds, from its path: its name without the split word and the
    extensions (`data/sst2_train.csv` -> `sst2`), else its folder's (`imdb/train.csv.gz` -> `imdb`);
    "" when the path says neither (`train.csv` in the current directory)."""
    p = PurePath(str(path))
    stem = p.name
    while stem.lower().endswith(_SUFFIXES):
        stem = stem[: stem.rfind(".")]
    stem = _SPLIT.sub("", stem).strip("-_. ")
    if stem:
        return stem
    folder = p.parent.name
    return "" if folder in ("", ".", "..") else folder


def label(settings: Mapping[str, Any]) -> str:
    """The dataset as a user reads it, from a run's flattened settings (`dataset.name`, `.source`,
    `.train_path`) or a dataset config node's fields (`name`, ...): a CSV dataset by its data and
    its loader, `imdb (csv)` (dataset=csv names the loader, not the data); any other by its name."""
    def get(key: str) -> Any:
        return settings.get(f"dataset.{key}", settings.get(key))

    name, source = str(get("name") or ""), str(get("source") or "")
    if source != "csv":
        return name
    data = name if name and name != "csv" else data_name(get("train_path") or "")
    return f"{data} (csv)" if data else "csv"
