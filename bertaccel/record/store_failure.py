"""A store or file system that fails under a run or a sweep: one line that names the cause and
what to do, the exit status 1, and the runs it opened closed as failed where the store still
takes a write, or named as left open where it does not (the next sweep on the store closes them:
sweep.previous_outcome marks a run whose process is gone, open_parent reopens its parent run).

The failures: the experiment deleted in the MLflow UI (MLflow keeps it in its trash, and its runs
with it: nothing can be written to them until it is restored); the disk full (SQLite's "database
or disk is full", or ENOSPC writing an artifact or a cache file); the store file deleted or
replaced while the sweep ran (store/keep.py StoreLost); a store that became read-only. None of them is a
run's own failure: every later run would meet it too, and a sweep that recorded one failed run
after another (or could not even record them) told nothing. So the sweep stops: StoreFailed is a
BaseException, as interrupt.Interrupted is, and passes through Hydra's job handling (which keeps
an Exception as the job's failure and goes on to the next job) up to run.cli, which calls stopped().

An experiment deleted before the run or the sweep starts is bad input: one line, exit 2, nothing
written (experiment_refusal).
"""
from __future__ import annotations

import errno
import logging
import os
import re
import sqlite3
import sys
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple

from bertaccel.store.file import sqlite_file
from bertaccel.store.keep import StoreLost, check_kept

DISK_FULL = ("database or disk is full", "No space left on device")
READ_ONLY = "attempt to write a readonly database"
INACTIVE = re.compile(r"The (experiment|run) \S+ must be in the 'active' state")
GONE, FULL, DELETED, READONLY = "gone", "full", "deleted_experiment", "read_only"  # StoreFailed.kind


class StoreFailed(BaseException):
    """The store failed under a run: the sweep stops (run.cli: stopped). Picklable (a run's
    process sends it to its launcher as its outcome). kind: GONE, FULL, DELETED, READONLY."""
    status = "store_failed"  # (runs/worker_processes.py _watch reads a status off whatever a run's process sends)

    def __init__(self, reason: str, left_open: Sequence[str] = (), kind: str = "") -> None:
        super().__init__(reason, tuple(left_open), kind)

    @property
    def reason(self) -> str:
        return str(self.args[0])

    @property
    def left_open(self) -> Tuple[str, ...]:
        return tuple(self.args[1])

    @property
    def kind(self) -> str:
        return str(self.args[2])

    def __str__(self) -> str:
        return self.reason

    def leaving(self, more: Sequence[str]) -> "StoreFailed":
        return StoreFailed(self.reason, tuple(dict.fromkeys([*self.left_open, *more])), self.kind)


def quiet_store_errors() -> None:
    """MLflow's SQL store logs every SQLite OperationalError (a full disk among them) as an ERROR with
    its traceback before it raises it: 80 lines on stderr per failed write. The exception carries
    the same words, and whoever handles it says them (one line here, a run's failure otherwise)."""
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)


def _restore_hint(uri: str, exp_id: str) -> str:
    return f"`MLFLOW_TRACKING_URI={uri} mlflow experiments restore --experiment-id {exp_id}`"


def _deleted_experiment(uri: str, name: str) -> Optional[str]:
    """The id of experiment `name` when it is deleted (in MLflow's trash), read without writing."""
    db = sqlite_file(uri)
    try:
        if db is not None:
            if not db.is_file():
                return None  # (no store yet: no experiment in it)
            con = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=30)
            try:
                row = con.execute("select experiment_id, lifecycle_stage from experiments where name = ?",
                                  (name,)).fetchone()
            finally:
                con.close()
            return str(row[0]) if row and row[1] == "deleted" else None
        from mlflow.tracking import MlflowClient

        exp = MlflowClient(tracking_uri=uri).get_experiment_by_name(name)
        return exp.experiment_id if exp is not None and exp.lifecycle_stage == "deleted" else None
    except Exception:  # noqa: BLE001 - a store that cannot say: the store's own checks speak for it
        return None


def experiment_refusal(uri: str, name: str, while_sweeping: bool = False) -> Optional[str]:
    """Why experiment `name` of the store cannot take runs (it is deleted), in one line, or None.
    while_sweeping: it went while a sweep ran (the sweep refused it before its start)."""
    exp_id = _deleted_experiment(uri, name)
    if exp_id is None:
        return None
    if while_sweeping:
        return (f"experiment '{name}' was deleted in the store while the sweep ran (MLflow keeps it in its trash, "
                f"its runs with it): restore it with {_restore_hint(uri, exp_id)}, then run the same command again: "
                "it resumes")
    return (f"experiment '{name}' is deleted in the store {uri} (MLflow keeps it in its trash): restore it with "
            f"{_restore_hint(uri, exp_id)} or give another tracking.experiment=")


def refuse_deleted_experiment(uri: str, name: str) -> None:
    """A deleted experiment: bad input (ConfigError) before a run; in a sweep, which refused it
    before its start (exit_if_experiment_deleted), it went while the sweep ran: StoreFailed."""
    from bertaccel.option import ConfigError
    from bertaccel.context import current as run_context

    sweeping = run_context().sweep is not None
    why = experiment_refusal(uri, name, while_sweeping=sweeping)
    if why:
        raise StoreFailed(why, kind=DELETED) if sweeping else ConfigError(why)


def exit_if_experiment_deleted(uri: str, name: str) -> None:
    """experiment_refusal for a sweep, before its parent run is opened: one line, exit 2."""
    why = experiment_refusal(uri, name)
    if why:
        print(f"error: {why}", file=sys.stderr)
        sys.exit(2)


def _chain(first: BaseException) -> Iterator[BaseException]:
    seen = set()
    e: Optional[BaseException] = first
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _disk_full(x: BaseException, uri: str) -> str:
    db = sqlite_file(uri)
    path = getattr(x, "filename", None) or (str(db) if db is not None else uri)
    enospc = isinstance(x, OSError) and x.errno == errno.ENOSPC
    cause = DISK_FULL[1] if enospc else next(c for c in DISK_FULL if c in str(x))
    on_store = db is not None and str(path).startswith(str(db.parent))
    where, folder = ("the store's disk", db.parent) if on_store and db is not None else ("that disk", Path(path).parent)
    return (f"the disk holding {path} is full ({cause}): free space on {where} (`df -h {folder}`)"
            f"{' or give a tracking.uri= on another disk' if on_store else ''}, then run the same command again: it "
            "resumes")


def failure_reason(e: BaseException, uri: str, experiment: str) -> Optional[Tuple[str, str]]:
    """(reason, kind) when `e` is the store or the file system failing (see the module's
    docstring), else None: a run's own failure."""
    db = sqlite_file(uri)
    try:
        if db is not None:
            # First: SQLite's own words for a store replaced under an open connection are
            # "attempt to write a readonly database", and a deleted one may read as anything.
            check_kept(db)
    except StoreLost as lost:
        return str(lost), GONE
    for x in _chain(e):
        text = str(x)
        if isinstance(x, StoreFailed):
            return x.reason, x.kind
        if isinstance(x, StoreLost):
            return text, GONE
        if (isinstance(x, OSError) and x.errno == errno.ENOSPC) or any(c in text for c in DISK_FULL):
            return _disk_full(x, uri), FULL
        if INACTIVE.search(text):
            deleted = experiment_refusal(uri, experiment, while_sweeping=True)
            if deleted is not None:
                return deleted, DELETED
        if READ_ONLY in text:
            return (f"the store {sqlite_file(uri) or uri} became read-only while the sweep ran ({READ_ONLY}): make it "
                    "writable again (its file and its folder), then run the same command again: it resumes"), READONLY
    return None


def failed(e: BaseException, uri: str, experiment: str) -> Optional[StoreFailed]:
    """failure_reason as a StoreFailed to raise, or None."""
    why = failure_reason(e, uri, experiment)
    return None if why is None else StoreFailed(why[0], kind=why[1])


def parent_failed(e: BaseException, uri: str, experiment: str, sweep_id: str) -> Optional[StoreFailed]:
    """The store failing while a sweep opens its parent run (sweep.open_parent) as the sweep's
    StoreFailed, naming the parent run where it was made and left open (its first write took, a
    later one did not: the same command reopens it); None for any other failure. Raised from a
    Hydra callback, which would turn an Exception into a warning and start the runs anyway."""
    stop = failed(e, uri, experiment)
    if stop is None:
        return None
    from bertaccel.record.tracking import search_runs

    try:
        found = search_runs(uri, experiment, f"tags.sweep_id = '{sweep_id}' and tags.`bertaccel.role` = 'sweep'")
    except Exception:  # noqa: BLE001 - a store that cannot be read either: the line says the cause
        return stop
    mine = [r for r in found if r.info.status == "RUNNING" and r.data.tags.get("pid") == str(os.getpid())]
    return stop.leaving([f"the sweep's parent run {r.info.run_id}" for r in mine])


def close_or_name(uri: str, runs: Sequence[Tuple[str, str]], reason: str) -> List[str]:
    """Close each (run id, run name) as interrupted with the reason; those the store does not take
    the write for, named for the one line ("run NAME (mlflow run id ID)"). Interrupted, not
    failed: the run did not fail on its own, and the same command runs it again once the store is
    usable (a failed configuration is re-run only with sweep.retry_failed=true); a run left open
    ends the same way, marked interrupted by the next sweep when it finds its process gone. Which
    of the two happens depends on whether SQLite still finds room for the write (a full disk may
    still take a write into pages the file already has)."""
    from bertaccel.record.tracking import finish_run

    left = []
    for run_id, name in runs:
        try:
            finish_run(uri, run_id, "interrupted", reason)
        except Exception:  # noqa: BLE001 - the store fails: the run is named instead
            left.append(f"run {name} (mlflow run id {run_id})")
    return left


def close_left_open(uri: str, experiment: str, job_filter: str, run_name: str, failure: StoreFailed) -> StoreFailed:
    """The store failed under a job (launch.py: its process sent `failure`): the job's run (found
    by `job_filter`), if its process opened one and could not close it, closed as close_or_name
    does, or named in the failure as left open where the store takes no write."""
    from bertaccel.record.tracking import search_runs

    try:
        runs = search_runs(uri, experiment, job_filter)
    except Exception:  # noqa: BLE001 - a store that cannot be read: the run's process named what it knew
        return failure
    open_runs = [(r.info.run_id, run_name) for r in runs if r.data.tags.get("status") == "running"]
    return failure.leaving(close_or_name(uri, open_runs, failure.reason))


def stopped(e: StoreFailed) -> int:
    """run.cli: a run or a sweep its store stopped. The sweep's parent run is closed as failed if
    the store takes it; one line says the cause, what to do, and what is left open; exit status 1."""
    from bertaccel.context import current as run_context
    from bertaccel.record.sweep import interrupt_parent, set_sweep

    left = list(e.left_open)
    sweep = run_context().sweep
    if sweep is not None and sweep.uri:
        try:
            interrupt_parent(sweep.uri, sweep.parent_run_id, e.reason[:5000], status="failed")
        except Exception:  # noqa: BLE001 - the same failure: the parent run is named instead
            left.append(f"the sweep's parent run {sweep.parent_run_id}")
        set_sweep(None)
    text = e.reason
    if left and e.kind != GONE:  # (a store that went holds nothing left open)
        text += (f"; left open, as the store took no write to them: {', '.join(left)}; the same command closes them "
                 "once it runs again")
    elif sweep is not None and e.kind != GONE:
        text += ("; the run it had open is recorded interrupted with this reason and the sweep's parent run failed: "
                 "the same command runs it again")
    print(f"\nerror: {text}", file=sys.stderr, flush=True)
    return 1
