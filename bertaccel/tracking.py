"""MLflow: one tracked run per configuration, through an explicit client.

An explicit MlflowClient (rather than mlflow's global "active run") keeps runs of one sweep
process from leaking into each other, and lets a skipped or failed run be written the same way
as a finished one.
"""
from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import logging
import socket
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence
from urllib.parse import urlparse

from hydra.core.utils import env_override
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.time import get_current_time_millis

from .config import ConfigError

# Values that say where results go, not what was run: left out of the config hash.
# carbon: how co2e_kg is priced from the measured energy, not what is trained (a region change
# neither re-runs a finished configuration nor splits its repeats).
# search: what a trial returns to the sweeper, not what is trained.
HASH_EXCLUDED_KEYS = ("tracking", "cache_dir", "sweep", "carbon", "search")
MLFLOW_BATCH = 100  # log_batch accepts at most 100 params per call


def flatten(tree: Mapping[str, Any], prefix: str = "") -> Dict[str, str]:
    out: Dict[str, str] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        elif isinstance(value, (list, tuple)):
            out[name] = json.dumps(list(value))
        else:
            out[name] = "null" if value is None else str(value)
    return out


def config_hash(resolved: Mapping[str, Any]) -> str:
    """Stable across processes and key order; same hash = same experiment configuration."""
    kept = {k: v for k, v in resolved.items() if k not in HASH_EXCLUDED_KEYS}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


def git_sha() -> str:
    repo = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"
    return f"{sha}-dirty" if dirty else sha


def sqlite_file(uri: str) -> Optional[Path]:
    """The database file of a `sqlite:///` URI (relative to the working directory), else None."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri[len("sqlite:///"):]).expanduser().resolve()


def _artifact_location(uri: str, experiment: str) -> Optional[str]:
    """Keep artifacts beside a SQLite store instead of in whatever directory the run started from."""
    db = sqlite_file(uri)
    return None if db is None else (db.parent / "mlartifacts" / experiment).as_uri()


CHECK_TIMEOUT_S = 5.0  # how long the store check waits on a tracking server


def server_problem(uri: str, timeout_s: float = CHECK_TIMEOUT_S) -> Optional[str]:
    """Why the MLflow tracking server of an http(s) URI cannot be used ("unreachable (...)"), or
    None; None for any other kind of URI. Takes at most about 2 x timeout_s: without it a dead
    server costs minutes of MLflow's retries and then a long traceback."""
    parsed = urlparse(uri)
    if parsed.scheme not in ("http", "https"):
        return None
    host = parsed.hostname or ""
    try:
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        socket.create_connection((host, port), timeout=timeout_s).close()
    except (OSError, ValueError) as e:  # refused, timed out, unknown host; ValueError: a bad port
        why = getattr(e, "strerror", None) or str(e) or type(e).__name__
        return f"unreachable ({why})"
    # Something listens: one request of MLflow's own API, with MLflow's own settings for no retries
    # and a short timeout, set for this call only (the runs keep MLflow's retries for a blip).
    from mlflow.environment_variables import MLFLOW_HTTP_REQUEST_MAX_RETRIES, MLFLOW_HTTP_REQUEST_TIMEOUT

    with env_override({MLFLOW_HTTP_REQUEST_MAX_RETRIES.name: "0",
                       MLFLOW_HTTP_REQUEST_TIMEOUT.name: str(max(1, round(timeout_s)))}):
        try:
            MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
        except Exception as e:  # noqa: BLE001 - any answer but a good one: not a usable MLflow server
            text = str(e).strip().splitlines()
            return f"unreachable as an MLflow tracking server ({(text[0] if text else type(e).__name__)[:300]})"
    return None


def check_store(uri: str) -> None:
    """A run's tracking.uri: ConfigError (one line) if it is a tracking server that cannot be used.
    (A sqlite:/// store that does not exist yet is fine here: the first run creates it.)"""
    why = server_problem(uri)
    if why:
        raise ConfigError(f"tracking.uri={uri}: {why}; start the tracking server (mlflow server --host ... "
                          "--port ...) or use tracking.uri=sqlite:///mlflow.db (a local file, no server)")


def exit_if_store_unusable(uri: str) -> None:
    """check_store for a sweep, before its parent run is opened: one line on stderr and exit 2
    (an exception there would reach Hydra, which prints a traceback)."""
    try:
        check_store(uri)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def experiment_id(client: MlflowClient, uri: str, name: str) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        return client.create_experiment(name, artifact_location=_artifact_location(uri, name))
    except MlflowException:  # created meanwhile by a parallel run
        return client.get_experiment_by_name(name).experiment_id


_held = threading.local()


@contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Serialize access to one SQLite store across processes.

    SQLite allows one writer at a time and MLflow's retries give up under contention, so
    parallel sweeps on one `sqlite:///` store take an exclusive flock on `<db>.lock` around
    every store call. Re-entrant within a thread. Other stores (a tracking server) serialize
    themselves: no lock.
    """
    if not uri.startswith("sqlite:///") or getattr(_held, "depth", 0):
        _held.depth = getattr(_held, "depth", 0) + 1
        try:
            yield
        finally:
            _held.depth -= 1
        return
    db = sqlite_file(uri)
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        _held.depth = 1
        try:
            yield
        finally:
            _held.depth = 0
            fcntl.flock(f, fcntl.LOCK_UN)


def _locked(method):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with store_lock(self.uri):
            return method(self, *args, **kwargs)
    return wrapper


class RunTracker:
    def __init__(self, uri: str, experiment: str, run_name: str, params: Mapping[str, str],
                 tags: Mapping[str, str], config_yaml: str):
        logging.getLogger("alembic").setLevel(logging.WARNING)  # store creation chatter
        self.uri = uri
        self.experiment = experiment
        with store_lock(uri):
            self.client = MlflowClient(tracking_uri=uri)
            exp_id = experiment_id(self.client, uri, experiment)
            self.run_id = self.client.create_run(exp_id, run_name=run_name, tags=dict(tags)).info.run_id
            items = [Param(k, v) for k, v in params.items()]
            for i in range(0, len(items), MLFLOW_BATCH):
                self.client.log_batch(self.run_id, params=items[i:i + MLFLOW_BATCH])
            self.client.log_text(self.run_id, config_yaml, "config.yaml")

    @_locked
    def log_params(self, params: Mapping[str, Any]) -> None:
        """Params known only once the run has started (the built model's shape)."""
        items = [Param(k, str(v)) for k, v in params.items()]
        for i in range(0, len(items), MLFLOW_BATCH):
            self.client.log_batch(self.run_id, params=items[i:i + MLFLOW_BATCH])

    @_locked
    def log_metrics(self, metrics: Mapping[str, Optional[float]], step: int = 0) -> None:
        """None means "not measured" and is not logged as a number (its tag says why)."""
        now = get_current_time_millis()
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items() if v is not None]
        for i in range(0, len(batch), MLFLOW_BATCH):
            self.client.log_batch(self.run_id, metrics=batch[i:i + MLFLOW_BATCH])

    @_locked
    def log_series(self, key: str, values: Sequence[float]) -> None:
        """One metric per step (step = index), in batches: a per-step lr costs a few writes."""
        now = get_current_time_millis()
        batch = [Metric(key, float(v), now, i) for i, v in enumerate(values)]
        for i in range(0, len(batch), MLFLOW_BATCH):
            self.client.log_batch(self.run_id, metrics=batch[i:i + MLFLOW_BATCH])

    @_locked
    def log_artifacts(self, local_dir: str, artifact_path: str) -> None:
        self.client.log_artifacts(self.run_id, local_dir, artifact_path)

    @_locked
    def set_tags(self, tags: Mapping[str, str]) -> None:
        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    @_locked
    def finish(self, status: str, reason: Optional[str] = None) -> None:
        tags = {"status": status}
        if reason:
            tags["reason"] = reason[:5000]
        self.set_tags(tags)
        self.client.set_terminated(self.run_id, mlflow_status(status))


def mlflow_status(status: str) -> str:
    """MLflow's run status for ours: failed -> FAILED, interrupted (SIGINT/SIGTERM) -> KILLED,
    finished and skipped -> FINISHED (a skipped run ended as it should)."""
    return {"failed": "FAILED", "interrupted": "KILLED"}.get(status, "FINISHED")


def finish_run(uri: str, run_id: str, status: str, reason: Optional[str] = None) -> None:
    """End a run some other process opened (launch.py: its worker died before ending it)."""
    with store_lock(uri):
        client = MlflowClient(tracking_uri=uri)
        tags = [RunTag("status", status)] + ([RunTag("reason", reason[:5000])] if reason else [])
        client.log_batch(run_id, tags=tags)
        client.set_terminated(run_id, mlflow_status(status))


def search_runs(uri: str, experiment: str, filter_string: str = "") -> List[Any]:
    """Runs of an experiment matching an MLflow filter ([] when the experiment does not exist)."""
    with store_lock(uri):
        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            return []
        return client.search_runs([exp.experiment_id], filter_string=filter_string, max_results=50000,
                                  order_by=["attributes.start_time ASC"])


def runs_by_status(uri: str, experiment: str) -> Dict[str, Iterable[Any]]:
    """The configuration runs of an experiment (not sweep parent runs) grouped by status tag."""
    grouped: Dict[str, list] = {}
    for run in search_runs(uri, experiment):
        if run.data.tags.get("bertaccel.role") == "sweep":
            continue
        grouped.setdefault(run.data.tags.get("status", "unknown"), []).append(run)
    return grouped
