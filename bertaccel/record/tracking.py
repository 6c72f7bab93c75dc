"""MLflow: one tracked run per configuration, through an explicit client.

An explicit MlflowClient (rather than mlflow's global "active run") keeps runs of one sweep
process from leaking into each other, and lets a skipped or failed run be written the same way
as a finished one.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import sqlite3
import subprocess
from pathlib import Path
from typing import Any, Callable, Concatenate, Dict, Iterable, List, Mapping, Optional, ParamSpec, Sequence, TypeVar

from mlflow.entities import DatasetInput, Experiment, Metric, Param, Run, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.file_utils import local_file_uri_to_path
from mlflow.utils.time import get_current_time_millis

from bertaccel.record.relocate import repoint_experiment
from bertaccel.store import store_lock
from bertaccel.store.file import sqlite_file
from bertaccel.store.keep import check_kept

INPUT_ATTEMPTS = 3  # log_inputs: a clash on a dataset's key is retried (RunTracker.log_inputs)

# What is not a run's identity (config_hash, config_key_noseed; the report's groups): a whole
# config root or one dotted field. A run's identity is what determines its result.
# - tracking, cache_dir, sweep: where results go and what a sweep does with earlier runs.
# - carbon: how co2e_kg is priced from the measured energy, not what is trained (a region change
#   neither re-runs a finished configuration nor splits its repeats).
# - search: what a trial returns to the sweeper, not what is trained.
# - launcher.runs_at_once, start_method: how many runs share the host and how a run's process
#   starts; each run still gets fresh processes (and on a GPU host GPUs of its own).
# - launcher.timeout_s, collective_timeout_s: watchdogs; a run they did not stop is the same run
#   (one they stopped is failed, rerun with sweep.retry_failed=true).
# Kept: launcher.name (inline runs share the sweep's process: compiled code, allocator and library
# state carry from one run to the next, which changes what is measured), and all of telemetry
# (enabled: energy and activity measured or null; interval_s: the samplers' period, their share of
# the GIL and the energy's resolution; rapl_root: whether the CPU's energy can be read at all).
LAUNCH_SETTINGS = ("launcher.runs_at_once", "launcher.start_method", "launcher.timeout_s",
                   "launcher.collective_timeout_s")
HASH_EXCLUDED_KEYS = ("tracking", "cache_dir", "sweep", "carbon", "search", *LAUNCH_SETTINGS)
# What versions before IDENTITY_VERSION left out: their config_hash tags are found by
# legacy_config_hashes (record/sweep.py previous_outcome), so their stores stay resumable.
LEGACY_HASH_EXCLUDED_KEYS = ("tracking", "cache_dir", "sweep", "carbon", "search")
# Keys the schema gained after IDENTITY_VERSION, with the value that leaves a run as it was before
# them: at that value they stay out of config_hash, so a store's earlier runs (which lack the key)
# are still found by resume and as a sweep's baseline; set to anything else, they are identity.
ADDED_AT_DEFAULT = {"precision.fp8_recipe": None}
# A run's tag: the identity its config_hash and config_key_noseed follow. Runs without it were
# recorded before: the report groups a mix of both by params (report/runinfo.py group_keys).
IDENTITY_VERSION_TAG = "identity_version"
IDENTITY_VERSION = "2"
# The experiment's kind, as MLflow records it (its UI's kind selector writes this tag): model
# training, not GenAI. MLflow 3.17's UI opens an experiment by its own GenAI / Model training switch
# instead, whatever the tag says: ui_address is the page that opens on the runs.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
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


def not_identity(key: str, excluded: Iterable[str] = HASH_EXCLUDED_KEYS) -> bool:
    """Whether a dotted config key (a flattened param) is left out of a run's identity."""
    return any(key == e or key.startswith(f"{e}.") for e in excluded)


def _kept(tree: Mapping[str, Any], excluded: Iterable[str], prefix: str = "") -> Dict[str, Any]:
    excluded = tuple(excluded)
    out: Dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if not_identity(name, excluded) or (name in ADDED_AT_DEFAULT and value == ADDED_AT_DEFAULT[name]):
            continue
        out[key] = _kept(value, excluded, f"{name}.") if isinstance(value, Mapping) else value
    return out


def _hash(resolved: Mapping[str, Any], excluded: Iterable[str]) -> str:
    kept = _kept(resolved, excluded)
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


def config_hash(resolved: Mapping[str, Any]) -> str:
    """Stable across processes and key order; same hash = same experiment configuration."""
    return _hash(resolved, HASH_EXCLUDED_KEYS)


def legacy_config_hash(resolved: Mapping[str, Any]) -> str:
    """config_hash as versions before IDENTITY_VERSION computed it (launcher settings included)."""
    return _hash(resolved, LEGACY_HASH_EXCLUDED_KEYS)


def legacy_config_hashes(resolved: Mapping[str, Any]) -> List[str]:
    """The config_hash an older version recorded for this configuration: with the launcher
    settings as given now, and with their defaults (a sweep run before with the defaults, rerun
    now with e.g. launcher.runs_at_once=2, as docs/scale.md recommends)."""
    from bertaccel.config import LauncherConfig

    defaults = LauncherConfig()
    launcher = dict(resolved.get("launcher") or {})
    for key in LAUNCH_SETTINGS:
        name = key.split(".", 1)[1]
        launcher[name] = getattr(defaults, name)
    hashes = [legacy_config_hash(resolved), legacy_config_hash({**resolved, "launcher": launcher})]
    return list(dict.fromkeys(hashes))


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


def artifact_folder(experiment: str) -> str:
    """The folder under mlartifacts/ for an experiment's artifacts: its name when that is one plain
    folder name, else a folder made of the name's letters and digits and a hash of the name
    (`../../x`, `/Users/me/exp` and `a/../../b` stay inside mlartifacts/; two names never share a
    folder). The experiment keeps its name as typed in MLflow."""
    if experiment not in ("", ".", "..") and not re.search(r"[/\\\x00-\x1f\x7f]", experiment) \
            and len(experiment.encode()) <= 120:
        return experiment
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", experiment).strip("._-")[:60]
    digest = hashlib.sha256(experiment.encode()).hexdigest()[:8]
    return f"{slug}-{digest}" if slug else digest


def _artifact_location(uri: str, experiment: str) -> Optional[str]:
    """Keep artifacts beside a SQLite store instead of in whatever directory the run started from."""
    db = sqlite_file(uri)
    return None if db is None else (db.parent / "mlartifacts" / artifact_folder(experiment)).as_uri()


def _moved_artifacts(uri: str, location: str) -> Optional[Path]:
    """Where a SQLite store's experiment now keeps its artifacts, when the folder the store names
    (an absolute file:// path) is gone because the store was moved with its mlartifacts folder:
    the store's own mlartifacts/<that folder's name>. Also when that folder is gone with its
    mlartifacts/ (a store moved without it): writing there would recreate the old project folder.
    None when the named folder exists, or is not of that kind (a folder of the user's choosing)."""
    db = sqlite_file(uri)
    if db is None or not location.startswith("file:"):
        return None
    old = Path(local_file_uri_to_path(location))
    here = db.parent / "mlartifacts" / old.name
    if old == here or old.exists():
        return None
    return here if here.is_dir() or (old.parent.name == "mlartifacts" and not old.parent.exists()) else None


def _follow_moved_store(uri: str, exp: Experiment) -> None:
    """Points an experiment of a moved SQLite store, and its runs, at the store's own mlartifacts
    folder (_moved_artifacts). MLflow keeps each run's artifact location as the absolute URI it
    was given and has no call to change it: it is updated in the store's tables, so that new runs
    write beside the store (not into a recreated old folder) and earlier runs' artifacts are
    found again. Called under the store's lock."""
    db = sqlite_file(uri)
    here = _moved_artifacts(uri, exp.artifact_location)
    if db is None or here is None:  # (here is None where db is: only a SQLite store moves)
        return
    old, new = exp.artifact_location.rstrip("/"), here.as_uri()
    try:  # (the one place that rewrites artifact locations: record/relocate.py)
        repoint_experiment(db, int(exp.experiment_id), exp.artifact_location, new)
    except sqlite3.Error as e:  # a store that cannot be written fails on the run's own first write
        logging.getLogger("bertaccel").warning(f"experiment {exp.name!r}: its artifacts folder is gone and the store "
                                               f"cannot be pointed at {here} ({e})")
        return
    logging.getLogger("bertaccel").info(f"experiment {exp.name!r}: its artifacts folder {local_file_uri_to_path(old)} is gone; the store's "
             f"own {here} is used instead (the store was moved): its runs now point there")


def experiment_id(client: MlflowClient, uri: str, name: str) -> str:
    """The experiment's id, created when missing; either way it is marked model training
    (EXPERIMENT_KIND): one an older version created is marked when the next run goes into it.
    The experiment of a SQLite store moved with its mlartifacts/ follows it (_follow_moved_store)."""
    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            return client.create_experiment(name, artifact_location=_artifact_location(uri, name),
                                            tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
        except MlflowException:  # created meanwhile by a parallel run
            exp = client.get_experiment_by_name(name)
            if exp is None:  # not created meanwhile: the create itself failed
                raise
    _follow_moved_store(uri, exp)
    # A kind someone chose stays; none, or one MLflow's UI only guessed, is replaced.
    kind = exp.tags.get(EXPERIMENT_KIND_TAG, "")
    if not kind or kind.endswith("inferred") or kind == "no_inferred_type":
        client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return exp.experiment_id


def ui_address(uri: str, experiment_id: str) -> str:
    """Where the MLflow UI lists an experiment's runs. MLflow 3.17's UI opens every experiment on
    its GenAI view (traces) whatever the experiment's kind tag says: its GenAI / Model training
    switch decides, per browser, and `workflowType=machine_learning` in the address sets it."""
    page = f"#/experiments/{experiment_id}/runs?workflowType=machine_learning"
    if uri.startswith(("http://", "https://")):  # a tracking server serves the UI itself
        return f"{uri.rstrip('/')}/{page}"
    return f"http://127.0.0.1:5000/{page} (after `mlflow ui --backend-store-uri {uri}`)"


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _locked(method: Callable[Concatenate[RunTracker, _P], _R]) -> Callable[Concatenate[RunTracker, _P], _R]:
    """A RunTracker method run under its store's lock."""
    @functools.wraps(method)
    def wrapper(self: RunTracker, *args: _P.args, **kwargs: _P.kwargs) -> _R:
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
    def log_inputs(self, datasets: Sequence[DatasetInput]) -> None:
        """The run's datasets (record/datasets.py: DatasetInput per split).

        Once more after a unique-key clash: MLflow's store looks a dataset up and then inserts it
        in two steps, so runs of a parallel sweep on a tracking server (no store lock there) that
        log the same new dataset at once clash on its key (seen on PostgreSQL: "duplicate key value
        violates unique constraint dataset_pk"); by then the row exists and the second call links it."""
        for attempt in range(INPUT_ATTEMPTS):
            try:
                self.client.log_inputs(self.run_id, datasets=list(datasets))
                return
            except MlflowException as e:
                if attempt + 1 == INPUT_ATTEMPTS or "unique" not in str(e).lower():
                    raise

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


def experiment_id_of(uri: str, run_id: str) -> str:
    with store_lock(uri, shared=True):
        return MlflowClient(tracking_uri=uri).get_run(run_id).info.experiment_id


def search_runs(uri: str, experiment: str, filter_string: str = "") -> List[Run]:
    """Runs of an experiment matching an MLflow filter ([] when the experiment does not exist).
    A read: a shared lock (report and plan read a store in a read-only folder, store_lock), and
    no store made where there is none (a run stopped before its store was made leaves none)."""
    db = sqlite_file(uri)
    if db is not None and not (db.is_file() and db.stat().st_size > 0):
        check_kept(db)  # (a sweep's store deleted under it is StoreLost, not "no runs yet")
        return []
    with store_lock(uri, shared=True):
        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            return []
        return client.search_runs([exp.experiment_id], filter_string=filter_string, max_results=50000,
                                  order_by=["attributes.start_time ASC"])


def runs_by_status(uri: str, experiment: str) -> Dict[str, List[Run]]:
    """The configuration runs of an experiment (not sweep parent runs) grouped by status tag."""
    grouped: Dict[str, List[Run]] = {}
    for run in search_runs(uri, experiment):
        if run.data.tags.get("bertaccel.role") == "sweep":
            continue
        grouped.setdefault(run.data.tags.get("status", "unknown"), []).append(run)
    return grouped
