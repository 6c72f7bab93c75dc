"""The MLflow side of a sweep: one parent run per sweep, and resume by config_hash.

A sweep's id is its config name plus a hash of what it varies and fixes (the command-line
overrides and the sweeper's params), so running the same command again finds the same parent
run and the configurations that already finished.

Per configuration, `previous_outcome` looks at earlier runs with the same config_hash:
finished -> not run again; failed/skipped -> not run again unless sweep.retry_failed; a run
still marked "running" whose process is gone (same host, dead pid: e.g. a SIGKILLed sweep)
is marked "interrupted" and the configuration runs again.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

import psutil
from mlflow.entities import RunTag
from mlflow.tracking import MlflowClient

from .tracking import experiment_id, search_runs, store_lock

SWEEP_ENV = "BERTACCEL_SWEEP"  # JSON {sweep_id, parent_run_id, swept}: reaches jobs of other launchers too


@dataclass
class SweepContext:
    sweep_id: str
    parent_run_id: str
    swept: List[str] = field(default_factory=list)  # keys the sweep varies: they name its runs
    uri: str = ""  # the tracking store of the parent run (an interrupted sweep closes it from run.cli)


def sweep_identity(config_name: str, overrides: Sequence[str]) -> str:
    kept = sorted(o for o in overrides if not o.startswith(("tracking.", "hydra.", "sweep.")))
    digest = hashlib.sha256(json.dumps([config_name, kept]).encode()).hexdigest()[:10]
    return f"{config_name}-{digest}"


def open_parent(uri: str, experiment: str, sweep_id: str, overrides: Sequence[str], total: Optional[int],
                extra_tags: Optional[Mapping[str, str]] = None) -> str:
    """The sweep's parent run: reopened when the same sweep ran before, else created. extra_tags:
    a search's settings (search.parent_tags)."""
    with store_lock(uri):
        client = MlflowClient(tracking_uri=uri)
        found = search_runs(uri, experiment, f"tags.sweep_id = '{sweep_id}' and tags.`bertaccel.role` = 'sweep'")
        tags = {"bertaccel.role": "sweep", "sweep_id": sweep_id, "status": "running",
                "host": socket.gethostname(), "pid": str(os.getpid()), **(extra_tags or {})}
        if found:
            run_id = found[0].info.run_id
            client.update_run(run_id, status="RUNNING")
            client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
            return run_id
        exp_id = experiment_id(client, uri, experiment)
        run = client.create_run(exp_id, run_name=f"sweep {sweep_id}", tags=tags)
        client.log_param(run.info.run_id, "sweep_overrides", " ".join(overrides)[:6000])
        if total:
            client.log_param(run.info.run_id, "sweep_configurations", str(total))
        return run.info.run_id


def close_parent(uri: str, run_id: str, counts: Mapping[str, int]) -> None:
    """status says how many of the sweep's configurations have a finished run (this time or an
    earlier one): `finished (0 of 4 runs finished)` is a sweep that ran to its end with nothing to
    report; runs_<status> count each outcome."""
    done, total = counts.get("finished", 0) + counts.get("already_finished", 0), sum(counts.values())
    with store_lock(uri):
        client = MlflowClient(tracking_uri=uri)
        client.log_batch(run_id, tags=[RunTag("status", f"finished ({done} of {total} runs finished)")] +
                         [RunTag(f"runs_{k}", str(v)) for k, v in counts.items()])
        client.set_terminated(run_id, "FINISHED")


def interrupt_parent(uri: str, run_id: str, reason: str) -> None:
    """A sweep stopped by SIGINT / SIGTERM: its parent run ends KILLED, status=interrupted. The
    same command later reopens it and runs what did not finish (open_parent, previous_outcome)."""
    with store_lock(uri):
        client = MlflowClient(tracking_uri=uri)
        client.log_batch(run_id, tags=[RunTag("status", "interrupted"), RunTag("reason", reason)])
        client.set_terminated(run_id, "KILLED")


def _process_gone(run: Any) -> bool:
    tags = run.data.tags
    if tags.get("host") != socket.gethostname() or not tags.get("pid", "").isdigit():
        return False  # another machine's run: it may well be alive
    pid = int(tags["pid"])
    if pid == os.getpid():
        return False
    try:
        return not psutil.Process(pid).is_running()
    except psutil.NoSuchProcess:
        return True


@dataclass
class Previous:
    status: str  # already_finished | not_retried
    run_id: str
    reason: str
    metrics: Dict[str, float] = field(default_factory=dict)  # the earlier run's (the sweep's summary shows them)


def previous_outcome(uri: str, experiment: str, config_hash: str, retry_failed: bool) -> Optional[Previous]:
    """What earlier runs of this configuration mean for this sweep; None = run it."""
    runs: List[Any] = search_runs(uri, experiment, f"tags.config_hash = '{config_hash}'")
    runs = [r for r in runs if r.data.tags.get("bertaccel.role") != "sweep"]
    for r in runs:
        if r.data.tags.get("status") == "finished":
            return Previous("already_finished", r.info.run_id, f"already finished as run {r.info.run_id}",
                            dict(r.data.metrics))
    for r in runs:
        if r.data.tags.get("status") == "running" and _process_gone(r):
            with store_lock(uri):
                client = MlflowClient(tracking_uri=uri)
                client.log_batch(r.info.run_id, tags=[
                    RunTag("status", "interrupted"),
                    RunTag("reason", "its process ended before the run finished (found by a later sweep)")])
                client.set_terminated(r.info.run_id, "KILLED")
    if retry_failed:
        return None
    for r in reversed(runs):
        status = r.data.tags.get("status")
        if status in ("failed", "skipped"):
            return Previous("not_retried", r.info.run_id,
                            f"{status} before as run {r.info.run_id} ({r.data.tags.get('reason', '')[:120]}); "
                            "sweep.retry_failed=true runs it again")
    return None


def scheduler_tags() -> Dict[str, str]:
    """The submitit job a run executes in (hydra/launcher=slurm, local_jobs; its processes
    inherit the job's environment): the id leads to the job's log, <sweep dir>/.submitit/<id>/."""
    executor = os.environ.get("SUBMITIT_EXECUTOR")
    if not executor:
        return {}
    import submitit

    return {"scheduler": executor, "scheduler_job_id": submitit.JobEnvironment().job_id}


def context_from_env() -> Optional[SweepContext]:
    raw = os.environ.get(SWEEP_ENV)
    if not raw:
        return None
    d = json.loads(raw)
    return SweepContext(d["sweep_id"], d["parent_run_id"], list(d.get("swept", [])), d.get("uri", ""))


def set_env(ctx: Optional[SweepContext]) -> None:
    if ctx is None:
        os.environ.pop(SWEEP_ENV, None)
    else:
        os.environ[SWEEP_ENV] = json.dumps({"sweep_id": ctx.sweep_id, "parent_run_id": ctx.parent_run_id,
                                            "swept": sorted(ctx.swept), "uri": ctx.uri})
