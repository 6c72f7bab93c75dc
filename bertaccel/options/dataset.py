"""The `dataset` option's checks: its source and what that source needs (bertaccel/data/read.py
reads it)."""
from __future__ import annotations

from typing import Any, Optional

from bertaccel.config import DATASET_SOURCES, not_one_of


def check(cfg: Any) -> Optional[str]:
    """Refuses an unknown source, hub without hub_id, csv without train_path and test_path, and
    an empty text_columns."""
    ds = cfg.dataset
    why = not_one_of("dataset.source", ds.source, DATASET_SOURCES)
    if why:
        return why
    if ds.source == "hub" and not ds.hub_id:
        return f"dataset={ds.name} (source=hub) needs dataset.hub_id"
    if ds.source == "csv" and not (ds.train_path and ds.test_path):
        missing = " and ".join(f"dataset.{k}=..." for k in ("train_path", "test_path") if not ds[k])
        return (f"dataset=csv needs {missing} (CSV files with a header row, plain or .gz; "
                "relative paths are from the directory you run from)")
    if not ds.text_columns:
        return "dataset.text_columns is empty: name at least one text column"
    return None
