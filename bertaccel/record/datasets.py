"""A run's dataset as MLflow inputs: one per split (context train / test), so the MLflow UI's
Dataset column names what a run trained and tested on, and its dataset filter finds runs by it.

The digest is the split's content fingerprint (data.split_fingerprint: the same hash keys the
token cache), taken after dataset.train_subset / test_subset: two runs share a digest exactly when
they saw the same rows. MLflow keeps 36 characters of a digest, so its first DIGEST_CHARS are logged.

The same digests decide resume (record/sweep.py previous_outcome): an earlier run is this
configuration's only when it read the rows this run would read (current_digests, taken before the
run starts, as cheaply as the run's own read: the parse cache keyed by the files' bytes).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Dict, List, Mapping, Optional

from mlflow.data.dataset_source import DatasetSource
from mlflow.data.dataset_source_registry import get_registered_sources
from mlflow.data.huggingface_dataset_source import HuggingFaceDatasetSource
from mlflow.data.meta_dataset import MetaDataset
from mlflow.entities import DatasetInput, InputTag, Run

from bertaccel.config import DatasetConfig
from bertaccel.data import DataError, DatasetSettings, RawData, load_raw, split_fingerprint, split_paths
from bertaccel.options.dataset import label as dataset_label

DIGEST_CHARS = 16  # of the sha256 hex; MLflow's store column holds 36
CONTEXT_TAG = "mlflow.data.context"  # the input tag MLflow's UI shows as the dataset's role
SPLITS = ("train", "test")
# current_digests of data that cannot be read now (bad CSV, a bad dataset setting): no run recorded
# it, so no earlier run is taken for this one (the run then fails on the same error, as bad input).
UNREADABLE = "unreadable"


class SplitDataset(MetaDataset):
    """A dataset known by its metadata (the rows are not logged) with its row count as profile,
    which the UI shows beside the digest."""

    def __init__(self, source: DatasetSource, name: str, digest: str, rows: int):
        self.rows = rows
        super().__init__(source=source, name=name, digest=digest)

    @property
    def profile(self) -> Dict[str, int]:
        return {"num_rows": self.rows}

    def to_dict(self) -> Dict[str, str]:
        # (MetaDataset's leaves the profile out of what is logged)
        return {**super().to_dict(), "profile": json.dumps(self.profile)}


def _local_source(path: str) -> DatasetSource:
    # MLflow registers its local-file source class twice (resolving a path by name warns that it
    # is ambiguous): the first class that calls itself "local" is taken.
    cls: Any = next(c for c in get_registered_sources() if c._get_source_type() == "local")
    source: DatasetSource = cls(path)  # (the registry's classes are typed as instances)
    return source


def _sources(ds_cfg: DatasetConfig) -> Dict[str, DatasetSource]:
    if ds_cfg.source == "hub":
        assert ds_cfg.hub_id is not None  # options/dataset.py refuses source=hub without it
        return {split: HuggingFaceDatasetSource(ds_cfg.hub_id, split=split) for split in ("train", "test")}
    train_path, test_path = split_paths(ds_cfg)
    return {"train": _local_source(str(train_path.resolve())), "test": _local_source(str(test_path.resolve()))}


def data_digests(raw: RawData) -> Dict[str, str]:
    """split -> the digest a run records for the rows it read (after the subsets)."""
    return {split: split_fingerprint(getattr(raw, split))[:DIGEST_CHARS] for split in SPLITS}


def current_digests(ds_cfg: DatasetSettings, cache_dir: Optional[str]) -> Optional[Dict[str, str]]:
    """The digests of the rows a run of this dataset config would read now, read as the run reads
    them (load_raw: subsets included, CSVs parsed once per content in cache_dir). None for a hub
    dataset: reading it means a download, and its hub id in the config names it (not compared).
    Data that cannot be read: UNREADABLE per split, which no recorded digest equals. ds_cfg: typed,
    or as composed where validate() refused the config (record_bad_input records it)."""
    if ds_cfg.source == "hub":
        return None
    try:
        return data_digests(load_raw(ds_cfg, cache_dir))
    except (DataError, TypeError, ValueError, OSError):  # bad input of any kind (e.g. a null path) reads no rows
        return {split: UNREADABLE for split in SPLITS}


def recorded_digests(run: Run) -> Optional[Dict[str, str]]:
    """split -> digest as an MLflow run recorded them (dataset_inputs); None when it recorded none
    (a run that never reached its data, or one of a version before the digests)."""
    inputs = getattr(getattr(run, "inputs", None), "dataset_inputs", None) or []
    found = {}
    for di in inputs:
        context = next((t.value for t in di.tags if t.key == CONTEXT_TAG), None)
        if context in SPLITS:
            found[context] = di.dataset.digest
    return found or None


def same_data(recorded: Optional[Mapping[str, str]], current: Optional[Mapping[str, str]]) -> Optional[bool]:
    """Whether a run read the data a run would read now; None when it cannot be told (no digests
    on either side)."""
    if not recorded or not current:
        return None
    return all(recorded.get(split) == current.get(split) for split in SPLITS)


def data_key(run: Run) -> str:
    """A short name for the rows a run read (both splits' digests), "" when it recorded none: the
    report keeps runs on other data apart (report/runinfo.py group_keys)."""
    digests = recorded_digests(run)
    if not digests:
        return ""
    return hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest()[:8]


def dataset_inputs(ds_cfg: DatasetConfig, raw: RawData) -> List[DatasetInput]:
    """The train and test splits a run read, as MLflow dataset inputs (name: the dataset as a user
    reads it, `imdb (csv)`: options/dataset.py label)."""
    inputs = []
    digests = data_digests(raw)
    for split, source in _sources(ds_cfg).items():
        rows = getattr(raw, split)
        ds = SplitDataset(source, dataset_label(dataclasses.asdict(ds_cfg)), digests[split], len(rows.texts))
        inputs.append(DatasetInput(ds._to_mlflow_entity(), tags=[InputTag(CONTEXT_TAG, split)]))
    return inputs
