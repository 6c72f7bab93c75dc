"""A configuration another live sweep runs now (its `running` run is the claim: record/sweep.py
previous_outcome, job.execute): this sweep waits for that run's end, then takes its outcome or runs
the configuration again (runs/launch.py). In a job's first turn (job_turn: the sweep launcher's
first pass over its jobs, hydra_plugins/bertaccel_launcher) the configuration is put off instead
(Deferred): the sweep runs those it is free to run first and comes back to it, so a suspended
sweep (Ctrl-Z, SIGSTOP) holds up only the configuration it holds. A wait on a stopped process
says so in the log, once per stop: it lasts until someone continues or ends that process.
"""
from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator, List, Optional, Tuple

import psutil
from omegaconf import DictConfig

from bertaccel.runs import interrupt
from bertaccel.runs.startup import Mark, job_marks
from bertaccel.record.sweep import RUNNING_ELSEWHERE

if TYPE_CHECKING:
    from bertaccel.record.run_record import Outcome

log = logging.getLogger("bertaccel")

CLAIM_POLL_S = 2.0  # how often a sweep waiting on another sweep's run of a configuration looks again


class Deferred(Exception):
    """launch() in a job's first turn (job_turn): another live sweep runs this configuration now.
    An Exception: Hydra keeps it as the job's return (SweepProgress counts no outcome of it), and
    the sweep launcher runs the job again after the others (deferred)."""


_turn = threading.local()  # .first / .second: this thread's job's turn (set by job_turn only)


@contextmanager
def job_turn(first: bool) -> Iterator[None]:
    """A job's turn in the sweep launcher, in this thread. first: launch() puts off a
    configuration another live sweep runs (raises Deferred) instead of waiting for it. Not first:
    the job's second turn, after it was put off: it waits, and its start-up counts from now
    (second_turn), not from the process's start or the job's first turn."""
    _turn.first, _turn.second = first, not first
    try:
        yield
    finally:
        _turn.first = _turn.second = False


def second_turn(started_at: float, started_source: str, startup: List[Mark]) -> Tuple[float, str, List[Mark]]:
    """launch()'s start time, its source and start-up marks; in a job's second turn, from now:
    the configurations run in between are no part of this run's start-up."""
    if not getattr(_turn, "second", False):
        return started_at, started_source, startup
    now = time.time()
    return now, "job start (a later job of a multirun: put off while another sweep ran it)", job_marks(now, False)


def deferred(job_return: Any) -> bool:
    """Whether a Hydra JobReturn is of a job put off (Deferred), to run again after the others."""
    return isinstance(getattr(job_return, "_return_value", None), Deferred)


def wait_for_others(cfg: DictConfig, run_name: str,
                    resumed: Callable[[DictConfig, str], Optional[Outcome]]) -> Optional[Outcome]:
    """resumed()'s outcome, once no other live process runs this configuration (in a job's
    first turn: Deferred at once instead)."""
    told, stopped_told = False, None
    while True:
        earlier = resumed(cfg, run_name)
        if earlier is None or earlier.status != RUNNING_ELSEWHERE:
            return earlier
        if getattr(_turn, "first", False):
            log.info(f"run {run_name}: {earlier.reason}; put off until the sweep's other configurations ran")
            raise Deferred(run_name)
        if not told:
            log.info(f"run {run_name}: {earlier.reason}; waiting for it to end")
            told = True
        stopped = _stopped_holder(cfg, earlier.run_id)
        if stopped is not None and stopped != stopped_told:  # (said once per stop, not per look)
            log.warning(f"run {run_name} is held by pid {stopped}, which is stopped (Ctrl-Z?): waiting; "
                        f"`kill -CONT {stopped}` (or `fg` in its terminal) or end it")
        stopped_told = stopped
        interrupt.STOP.wait(CLAIM_POLL_S)  # (a signal in the main thread raises Interrupted here)
        interrupt.check()


def _stopped_holder(cfg: DictConfig, run_id: Optional[str]) -> Optional[int]:
    """The pid of the process running `run_id` on this host when it is stopped (SIGSTOP, Ctrl-Z),
    else None: a wait on it lasts until someone continues or ends it."""
    if run_id is None:  # (no run to look at: nothing the log could say)
        return None
    from mlflow.tracking import MlflowClient

    from bertaccel.record.sweep import process_alive
    from bertaccel.store import store_lock

    try:
        with store_lock(cfg.tracking.uri):
            tags = MlflowClient(tracking_uri=cfg.tracking.uri).get_run(run_id).data.tags
    except Exception:  # noqa: BLE001 - only what the log says depends on it; the next look tells the rest
        return None
    if not process_alive(tags.get("host"), tags.get("pid"), tags.get("pid_started_at")):
        return None
    try:
        return int(tags["pid"]) if psutil.Process(int(tags["pid"])).status() == psutil.STATUS_STOPPED else None
    except psutil.Error:
        return None
