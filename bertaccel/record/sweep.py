"""The MLflow side of a sweep: one parent run per sweep, and resume by config_hash.

A sweep's id is its config name plus a hash of what it varies and fixes (the command-line
overrides and the sweeper's params), so running the same command again finds the same parent
run and the configurations that already finished.

Per configuration, `previous_outcome` looks at earlier runs with the same config_hash (or the
hash an older version gave it: tracking.legacy_config_hashes) that read the same data (their
dataset digests equal the ones the run would read now, record/datasets.py; a run that recorded
none, e.g. of a version before the digests, is taken as the same data, with a log line):
finished -> not run again; failed/skipped -> not run again unless sweep.retry_failed; a run
still marked "running" whose process is gone (same host, dead pid: e.g. a SIGKILLed sweep)
is marked "interrupted" and the configuration runs again; one whose process is alive (another
sweep on this host is running it) -> "running_elsewhere": the launcher waits for it.

That "running" run is the claim on its configuration: job.execute looks up earlier runs and opens
its own under one store lock, so two sweeps on one store cannot both start a configuration, and a
claim whose process is gone is taken over. A process is identified by host, pid and the pid's
start time (a pid the kernel reused for another program is not mistaken for the run's).

Two identical sweeps share their parent run (same sweep id): each sweep process adds itself to
the parent's `sweep_processes` tag, and the last one to end closes it.

A sweep's configurations are the runs it opened (tag sweep_id) and the earlier runs it took
instead of running them (resumed, or run by another sweep meanwhile): each of those gets the tag
`in_sweep.<sweep id>` (adopt), so the sweep's report covers all of them (sweep_runs).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence

import psutil
from mlflow.entities import Run, RunTag
from mlflow.tracking import MlflowClient

from bertaccel.context import SweepContext, update
from bertaccel.record.tracking import LAUNCH_SETTINGS, experiment_id, search_runs
from bertaccel.store import store_lock
from bertaccel.store.keep import kept

log = logging.getLogger("bertaccel")

RUNNING_ELSEWHERE = "running_elsewhere"  # Previous / Outcome status: a live process runs this configuration
RUN_NAME_CHARS = 250  # MLflow's store keeps this much of a run's name
PROCESSES_TAG = "sweep_processes"  # on a parent run: the live sweep processes on it, host:pid:start
MEMBER_TAG = "in_sweep."  # + sweep id, on an earlier run a sweep took for a configuration: how it counted it
# On a baseline a sweep recorded skipped, untrained, for want of anything to compare it with
# (runs/untrained_baseline.py): not this machine's verdict on the configuration, so a later sweep
# that has something to compare trains it (previous_outcome does not take it as "skipped before").
UNTRAINED_TAG = "untrained_baseline"


def process_tags(pid: Optional[int] = None) -> Dict[str, str]:
    """Tags that identify a process on this host (a run's worker, a sweep): host, pid, start."""
    proc = psutil.Process(pid)
    return {"host": socket.gethostname(), "pid": str(proc.pid), "pid_started_at": f"{proc.create_time():.3f}"}


def process_alive(host: Optional[str], pid: Optional[str], started_at: Optional[str] = None) -> Optional[bool]:
    """Whether the process a run's tags name still runs: None when it cannot be told (another
    host's process). Without a start time (runs of older versions), the pid alone decides."""
    if host != socket.gethostname() or pid is None or not pid.isdigit():
        return None
    try:
        proc = psutil.Process(int(pid))
        if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return started_at is None or abs(proc.create_time() - float(started_at)) < 0.01
    except (psutil.NoSuchProcess, ValueError):
        return False


def sweep_identity(config_name: str, overrides: Sequence[str]) -> str:
    """The launcher's settings are not a run's identity (tracking.LAUNCH_SETTINGS), nor a sweep's:
    the same sweep with launcher.runs_at_once=2 reopens its parent run."""
    kept = sorted(o for o in overrides if not o.startswith(("tracking.", "hydra.", "sweep."))
                  and o.split("=", 1)[0].lstrip("+~") not in LAUNCH_SETTINGS)
    digest = hashlib.sha256(json.dumps([config_name, kept]).encode()).hexdigest()[:10]
    return f"{config_name}-{digest}"


def open_parent(uri: str, experiment: str, sweep_id: str, overrides: Sequence[str], total: Optional[int],
                extra_tags: Optional[Mapping[str, str]] = None, name: str = "") -> str:
    """The sweep's parent run: reopened when the same sweep ran before, else created. extra_tags:
    a search's settings (search.parent_tags). name: what the MLflow UI lists it as, the swept axes
    (progress.sweep_axes); a parent reopened gets it too (one an older version named `sweep <id>`).
    The sweep id stays its tag, which is what finds it again."""
    name = (name or f"sweep {sweep_id}")[:RUN_NAME_CHARS]
    with store_lock(uri):
        client = MlflowClient(tracking_uri=uri)
        found = search_runs(uri, experiment, f"tags.sweep_id = '{sweep_id}' and tags.`bertaccel.role` = 'sweep'")
        me = process_tags()
        tags = {"bertaccel.role": "sweep", "sweep_id": sweep_id, "status": "running", **me, **(extra_tags or {})}
        if found:
            run = found[0]
            run_id: str = run.info.run_id
            # Another sweep process of the same command may be on it now (two sweeps started together).
            tags[PROCESSES_TAG] = _processes_text(_live_processes(run.data.tags) + [_process_key(me)])
            client.update_run(run_id, status="RUNNING", name=name)
            client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
            if "reason" in run.data.tags:  # an interrupted sweep's reason is not this sweep's
                client.delete_tag(run_id, "reason")
            return run_id
        tags[PROCESSES_TAG] = _processes_text([_process_key(me)])
        exp_id = experiment_id(client, uri, experiment)
        new_id: str = client.create_run(exp_id, run_name=name, tags=tags).info.run_id
        client.log_param(new_id, "sweep_overrides", " ".join(overrides)[:6000])
        if total:
            client.log_param(new_id, "sweep_configurations", str(total))
        return new_id


def _process_key(tags: Mapping[str, str]) -> str:
    return f"{tags['host']}:{tags['pid']}:{tags['pid_started_at']}"


def _processes_text(keys: Sequence[str]) -> str:
    return " ".join(dict.fromkeys(keys))


def _live_processes(parent_tags: Mapping[str, str], leaving: str = "") -> List[str]:
    """The sweep processes on a parent run that still run (another host's: kept, it cannot be
    told), without `leaving`."""
    live = []
    for key in parent_tags.get(PROCESSES_TAG, "").split():
        host, pid, started = (key.split(":") + ["", ""])[:3]
        if key != leaving and process_alive(host, pid, started) is not False:
            live.append(key)
    return live


def _leave_parent(client: MlflowClient, run_id: str) -> List[str]:
    """This process leaves the parent run's processes; the ones still on it."""
    others = _live_processes(client.get_run(run_id).data.tags, leaving=_process_key(process_tags()))
    client.set_tag(run_id, PROCESSES_TAG, _processes_text(others))
    return others


def close_parent(uri: str, run_id: str, counts: Mapping[str, int]) -> None:
    """status says how many of the sweep's configurations have a finished run (this time or an
    earlier one): `finished (0 of 4 runs finished)` is a sweep that ran to its end with nothing to
    report; runs_<status> count each outcome. While another sweep process of the same command is
    still on the parent run, it stays running: the last one closes it (its counts cover every
    configuration: it ran or waited for each)."""
    done, total = counts.get("finished", 0) + counts.get("already_finished", 0), sum(counts.values())
    with store_lock(uri):
        client = MlflowClient(tracking_uri=uri)
        if _leave_parent(client, run_id):
            return
        client.log_batch(run_id, tags=[RunTag("status", f"finished ({done} of {total} runs finished)")] +
                         [RunTag(f"runs_{k}", str(v)) for k, v in counts.items()])
        if "reason" in client.get_run(run_id).data.tags:  # (from an earlier interruption)
            client.delete_tag(run_id, "reason")
        client.set_terminated(run_id, "FINISHED")


def interrupt_parent(uri: str, run_id: str, reason: str, status: str = "interrupted") -> None:
    """A sweep stopped by SIGINT / SIGTERM: its parent run ends KILLED, status=interrupted (unless
    another sweep process of the same command is still on it). The same command later reopens it
    and runs what did not finish (open_parent, previous_outcome). status "failed": a sweep its
    store stopped (record/store_failure.py), FAILED."""
    with store_lock(uri):
        client = MlflowClient(tracking_uri=uri)
        if _leave_parent(client, run_id):
            return
        client.log_batch(run_id, tags=[RunTag("status", status), RunTag("reason", reason)])
        client.set_terminated(run_id, "FAILED" if status == "failed" else "KILLED")


@dataclass
class Previous:
    status: str  # already_finished | not_retried | running_elsewhere
    run_id: str
    reason: str
    metrics: Dict[str, float] = field(default_factory=dict)  # the earlier run's (the sweep's summary shows them)


def _earlier_runs(uri: str, experiment: str, hashes: Sequence[str],
                  data: Optional[Mapping[str, str]]) -> List[Run]:
    """Configuration runs recorded under any of these config hashes, oldest first, but those that
    read other data than `data` (split -> digest; None: not compared)."""
    from bertaccel.record.datasets import recorded_digests, same_data  # (torch: not at a sweep's start-up)

    by_id: Dict[str, Run] = {}
    for h in dict.fromkeys(hashes):
        for r in search_runs(uri, experiment, f"tags.config_hash = '{h}'"):
            if r.data.tags.get("bertaccel.role") != "sweep":
                by_id[r.info.run_id] = r
    runs = sorted(by_id.values(), key=lambda r: r.info.start_time or 0)
    return [r for r in runs if same_data(recorded_digests(r), data) is not False]


def previous_outcome(uri: str, experiment: str, hashes: Sequence[str], retry_failed: bool,
                     data: Optional[Mapping[str, str]] = None) -> Optional[Previous]:
    """What earlier runs of this configuration mean for this sweep; None = run it. hashes: its
    config_hash first, then those older versions recorded for it (tracking.legacy_config_hashes).
    data: the digests of the rows the run would read (datasets.current_digests), None where they
    cannot be had (a hub dataset): an earlier run that read other rows is another configuration's."""
    from bertaccel.record.datasets import recorded_digests

    runs = _earlier_runs(uri, experiment, hashes, data)
    for r in runs:
        if r.data.tags.get("status") == "finished":
            if data and recorded_digests(r) is None:
                log.info(f"run {r.info.run_id} recorded no dataset digests (a version before them): "
                         "taken as trained on the data this run would read")
            return Previous("already_finished", r.info.run_id, f"already finished as run {r.info.run_id}",
                            dict(r.data.metrics))
    for r in runs:
        if r.data.tags.get("status") != "running":
            continue
        tags = r.data.tags
        alive = process_alive(tags.get("host"), tags.get("pid"), tags.get("pid_started_at"))
        if alive is False:
            with store_lock(uri):
                client = MlflowClient(tracking_uri=uri)
                client.log_batch(r.info.run_id, tags=[
                    RunTag("status", "interrupted"),
                    RunTag("reason", "its process ended before the run finished (found by a later sweep)")])
                client.set_terminated(r.info.run_id, "KILLED")
        elif alive and tags.get("pid") != str(os.getpid()):
            return Previous(RUNNING_ELSEWHERE, r.info.run_id,
                            f"running as run {r.info.run_id} in process {tags.get('pid')} (another sweep on this host)")
    if retry_failed:
        return None
    for r in reversed(runs):
        status = r.data.tags.get("status")
        if status in ("failed", "skipped") and UNTRAINED_TAG not in r.data.tags:
            return Previous("not_retried", r.info.run_id,
                            f"{status} before as run {r.info.run_id} ({r.data.tags.get('reason', '')[:120]}); "
                            "sweep.retry_failed=true runs it again")
    return None


def untrained_before(uri: str, experiment: str, sweep_id: str, hashes: Sequence[str]) -> Optional[str]:
    """The run id of this sweep's earlier untrained record of a baseline (UNTRAINED_TAG) under these
    config hashes, or None: a sweep run again with still nothing to compare takes it, not a second one."""
    for h in dict.fromkeys(hashes):
        runs = search_runs(uri, experiment, f"tags.config_hash = '{h}' and tags.{UNTRAINED_TAG} = 'true' "
                                            f"and tags.sweep_id = '{sweep_id}'")
        if runs:
            run_id: str = runs[-1].info.run_id
            return run_id
    return None


def adopt(uri: str, run_id: str, sweep_id: str, status: str) -> None:
    """An earlier run taken for one of a sweep's configurations (status: already_finished or
    not_retried): tagged as the sweep's, so the sweep's report covers it (sweep_runs)."""
    with store_lock(uri):
        client = MlflowClient(tracking_uri=uri)
        tags = client.get_run(run_id).data.tags
        if tags.get("sweep_id") != sweep_id and tags.get(MEMBER_TAG + sweep_id) != status:
            client.set_tag(run_id, MEMBER_TAG + sweep_id, status)


def in_sweep(run: Run, sweep_id: str) -> bool:
    """Whether a configuration run is one of a sweep's: opened by it, or adopted by it."""
    tags = run.data.tags
    return tags.get("bertaccel.role") != "sweep" and (tags.get("sweep_id") == sweep_id or MEMBER_TAG + sweep_id in tags)


def sweep_runs(uri: str, experiment: str, sweep_id: str, filter_string: str = "") -> List[Run]:
    """A sweep's configuration runs matching an MLflow filter: those it ran and those it took from
    earlier runs or another sweep (parents of older versions have only the first: sweep_id)."""
    return [r for r in search_runs(uri, experiment, filter_string) if in_sweep(r, sweep_id)]


def scheduler_tags() -> Dict[str, str]:
    """The submitit job a run executes in (hydra/launcher=slurm, local_jobs; its processes
    inherit the job's environment): the id leads to the job's log, <sweep dir>/.submitit/<id>/."""
    executor = os.environ.get("SUBMITIT_EXECUTOR")
    if not executor:
        return {}
    import submitit

    return {"scheduler": executor, "scheduler_job_id": submitit.JobEnvironment().job_id}


def set_sweep(ctx: Optional[SweepContext]) -> None:
    """This process and the processes it starts run in sweep `ctx` from now on (None: in none);
    read back with bertaccel.context.current().sweep. The sweep's store is kept with it: not made
    again if it goes (store/keep.py)."""
    update(sweep=ctx, kept_store=kept(None if ctx is None else ctx.uri))
