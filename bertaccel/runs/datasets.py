"""A run's dataset as MLflow inputs: one per split (context train / test), so the MLflow UI's
Dataset column names what a run trained and tested on, and its dataset filter finds runs by it.

The digest is the split's content fingerprint (data.split_fingerprint: the same hash keys the
token cache), taken after dataset.train_subset / test_subset: two runs share a digest exactly when
they saw the same rows. MLflow keeps 36 characters of a digest, so its first DIGEST_CHARS are logged.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List

from mlflow.data.dataset_source import DatasetSource
from mlflow.data.dataset_source_registry import get_registered_sources
from mlflow.data.huggingface_dataset_source import HuggingFaceDatasetSource
from mlflow.data.meta_dataset import MetaDataset
from mlflow.entities import DatasetInput, InputTag

from bertaccel.data import RawData, split_fingerprint, split_paths

DIGEST_CHARS = 16  # of the sha256 hex; MLflow's store column holds 36
CONTEXT_TAG = "mlflow.data.context"  # the input tag MLflow's UI shows as the dataset's role


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
    cls = next(c for c in get_registered_sources() if c._get_source_type() == "local")
    return cls(path)


def _sources(ds_cfg: Any) -> Dict[str, DatasetSource]:
    if ds_cfg.source == "hub":
        return {split: HuggingFaceDatasetSource(ds_cfg.hub_id, split=split) for split in ("train", "test")}
    train_path, test_path = split_paths(ds_cfg)
    return {"train": _local_source(str(train_path.resolve())), "test": _local_source(str(test_path.resolve()))}


def dataset_inputs(ds_cfg: Any, raw: RawData) -> List[DatasetInput]:
    """The train and test splits a run read, as MLflow dataset inputs (name: the dataset option)."""
    inputs = []
    for split, source in _sources(ds_cfg).items():
        rows = getattr(raw, split)
        ds = SplitDataset(source, str(ds_cfg.name), split_fingerprint(rows)[:DIGEST_CHARS], len(rows.texts))
        inputs.append(DatasetInput(ds._to_mlflow_entity(), tags=[InputTag(CONTEXT_TAG, split)]))
    return inputs
