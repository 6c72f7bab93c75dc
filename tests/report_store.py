"""A real MLflow store in a temp sqlite file, written the way job.py records a run, for the
report's tests (no mock: the report reads it through the mlflow client as it reads a sweep)."""
from __future__ import annotations

import json
from typing import Mapping, Optional, Sequence


class Store:
    def __init__(self, tmp_path):
        from mlflow import MlflowClient

        self.uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
        self.client = MlflowClient(tracking_uri=self.uri)
        self.exp = self.client.create_experiment("bertaccel", artifact_location=(tmp_path / "artifacts").as_uri())

    def log(self, name: str, params: Mapping[str, str], metrics: Mapping[str, float], tags: Mapping[str, str] = {},
            epoch_accuracy: Sequence[float] = (), windows: Optional[Sequence[Sequence[float]]] = None) -> str:
        """One finished run; epoch_accuracy is logged as test_accuracy with step = epoch (0-based)
        and windows as the train_windows_unix tag, as job.py does."""
        c = self.client
        run = c.create_run(self.exp, run_name=name, tags={"status": "finished", **tags})
        rid = run.info.run_id
        for k, v in params.items():
            c.log_param(rid, k, v)
        for k, v in metrics.items():
            c.log_metric(rid, k, v)
        for epoch, acc in enumerate(epoch_accuracy):
            c.log_metric(rid, "test_accuracy", acc, step=epoch)
        if windows is not None:
            c.set_tag(rid, "train_windows_unix", json.dumps([list(w) for w in windows]))
        c.set_terminated(rid)
        return rid
