"""How the report and the plan reach a store's runs: the one door to MLflow above record/.

report/ and plan/ import nothing of MLflow's (tests/test_typed_door.py counts it, import-linter's
`report and plan read runs through record` contract refuses it): what they read (an experiment, a
run, its start, a sweep's parent runs, a local artifact folder), what the report writes on a
sweep's parent run (its tags, its files) and what the plan times (a run's MLflow work on a scratch
store) are functions here, so a change of tracking library or of its API is a change of record/.
Reads take no lock, as they did before they moved here (a report reads a store another sweep may
be writing: SQLite gives each read a whole transaction); the report's writes hold store_lock.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, List, Mapping, Optional, Tuple

from mlflow.entities import Metric, Param, Run, RunTag
from mlflow.tracking import MlflowClient
from mlflow.utils.file_utils import local_file_uri_to_path

from bertaccel.store import store_lock

# What report/ and plan/ name a store's reading client and its runs by (MLflow's types, through this door).
Reader = MlflowClient
RecordedRun = Run
SWEEP_ROLE_FILTER = "tags.`bertaccel.role` = 'sweep'"  # a sweep's parent run (record/sweep.py tags it)


def reader(uri: str) -> Reader:
    """A client on the store at `uri` for reading runs, their metric histories and artifacts (the
    report's run_fields, the plan's predict_dp pass it on; they call its reading methods only)."""
    return MlflowClient(tracking_uri=uri)


def experiment_id(uri: str, name: str) -> Optional[str]:
    """The id of the experiment called `name` in the store, or None where it has none."""
    exp = MlflowClient(tracking_uri=uri).get_experiment_by_name(name)
    return None if exp is None else exp.experiment_id


def start_times_ms(uri: str, run_ids: Iterable[str]) -> List[int]:
    """When each run started (ms since the epoch), in the order given."""
    client = MlflowClient(tracking_uri=uri)
    return [client.get_run(run_id).info.start_time for run_id in run_ids]


def sweep_parents(uri: str, experiment: str, sweep_id: Optional[str] = None) -> List[Any]:
    """The parent runs of the experiment's sweeps (of one sweep where sweep_id is given)."""
    found = experiment_id(uri, experiment)
    if found is None:
        return []
    flt = SWEEP_ROLE_FILTER if sweep_id is None else f"tags.sweep_id = '{sweep_id}' and {SWEEP_ROLE_FILTER}"
    return MlflowClient(tracking_uri=uri).search_runs([found], flt)


def local_path(artifact_uri: str) -> Path:
    """The folder a file: artifact URI names on this machine."""
    return Path(local_file_uri_to_path(artifact_uri))


def has_local_artifact(uri: str, run_id: str, folder: str, name: str) -> bool:
    """Whether the run lists `folder/name` among its artifacts, and, where its artifacts are local
    files, the file is there too (a store moved without its mlartifacts/ lists what it lacks)."""
    client = MlflowClient(tracking_uri=uri)
    if f"{folder}/{name}" not in [f.path for f in client.list_artifacts(run_id, folder)]:
        return False
    artifact_uri = client.get_run(run_id).info.artifact_uri
    return not artifact_uri.startswith("file:") or (local_path(artifact_uri) / folder / name).is_file()


def set_tags(uri: str, run_id: str, tags: Mapping[str, str]) -> None:
    """Set the run's tags; one given as "" is removed where the run has it."""
    with store_lock(uri):
        client = MlflowClient(tracking_uri=uri)
        present = client.get_run(run_id).data.tags
        client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items() if v])
        for k in (k for k, v in tags.items() if not v and k in present):
            client.delete_tag(run_id, k)


def attach_files(uri: str, run_id: str, files: Iterable[Path], folder: str,
                 subfolders: Iterable[Tuple[Path, str]] = ()) -> str:
    """Log `files` into the run's artifact `folder` and each (local folder, artifact path) of
    `subfolders`; the run's artifact URI ("" where it has none)."""
    with store_lock(uri):
        client = MlflowClient(tracking_uri=uri)
        for path in files:
            client.log_artifact(run_id, str(path), folder)
        for local, artifact_path in subfolders:
            client.log_artifacts(run_id, str(local), artifact_path)
        return client.get_run(run_id).info.artifact_uri or ""


def scratch_run_costs(steps: int, params: int) -> Tuple[float, float]:
    """(open_s, record_s): a run's MLflow work timed on a scratch SQLite store (never the user's):
    the look-up of an earlier run of its configuration and the run opened with `params` params and
    its tags (record.open_tracker); at its end the metrics, the lr series of `steps` values and the
    end (job._fill_record)."""
    with tempfile.TemporaryDirectory(prefix="bertaccel-plan-scratch-") as d:
        client = MlflowClient(tracking_uri=f"sqlite:///{d}/m.db")
        exp = client.create_experiment("scratch", artifact_location=f"file://{d}/art")
        client.create_run(exp)  # (the store's creation: a sweep's parent pays it, not a run)
        t0 = time.perf_counter()
        client.search_runs([exp], "tags.config_hash = 'x' and tags.status = 'finished'")
        run = client.create_run(exp, tags={f"t{i}": "x" * 40 for i in range(20)})
        client.log_batch(run.info.run_id, params=[Param(f"p{i}", "x" * 20) for i in range(params)])
        t1 = time.perf_counter()
        now = int(time.time() * 1000)
        client.log_batch(run.info.run_id, metrics=[Metric(f"m{i}", 1.0, now, 0) for i in range(60)],
                         tags=[RunTag(f"s{i}", "x" * 200) for i in range(60)])
        for i in range(0, steps, 1000):  # the lr series, as RunTracker.log_series batches it
            client.log_batch(run.info.run_id,
                             metrics=[Metric("lr", 1e-5, now, s) for s in range(i, min(steps, i + 1000))])
        client.set_terminated(run.info.run_id)
        t2 = time.perf_counter()
    return t1 - t0, t2 - t1
