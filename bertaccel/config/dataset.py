"""dataset=<name>: the data and its tokenization. Its option: bertaccel/options/dataset.py."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from omegaconf import MISSING

from bertaccel.option import bounded

DATASET_SOURCES = ("bundled", "hub", "csv")


@dataclass
class DatasetConfig:
    """The text-classification data and how it is tokenized. Options in conf/dataset/; checks in
    bertaccel/options/dataset.py, reading in bertaccel/data/read.py."""
    name: str = MISSING  # the option that set this group (dataset=<name>)
    source: str = MISSING  # Where the data comes from. bundled: bertaccel/samples; hub: the Hugging Face hub; csv: local files
    hub_id: Optional[str] = None  # The dataset's hub id (source=hub)
    train_path: Optional[str] = None  # The training file. bundled: under bertaccel/samples; csv: relative to where you run
    test_path: Optional[str] = None  # The test file, as train_path
    # The columns holding the text; several are joined with a space
    text_columns: List[str] = field(default_factory=lambda: ["text"])
    label_column: str = "label"  # The column holding the class label
    max_length: int = bounded(128, ge=8, le=512, note="BERT positions")  # Longest tokenized text; longer ones are truncated
    train_subset: Optional[int] = bounded(None, gt=0, note="null: all rows")  # Train on the first N rows after a seeded shuffle
    test_subset: Optional[int] = bounded(None, gt=0, note="null: all rows")  # Test on the first N rows after a seeded shuffle
    # The subsets' shuffle seed. Not train.seed: runs that differ only in train.seed are repeats
    # (the report groups them) and must train and test on the same rows; a different sample of
    # the data is a different experiment, asked for by changing this.
    # Any integer: Python's random.Random takes any (negative, or past 64 bits) as its seed.
    subset_seed: int = 0
