"""A run in processes of its own (launcher=process): one per rank, started by torch.multiprocessing,
forked from the server (runs/forkserver.py) or spawned, watched until they end, stopped and their
run recorded when they cannot end it themselves. launch.py decides where a run executes; this is
how it executes when that is not the calling process.

Each worker returns its Outcome (picklable) over a queue; the launching process keeps no state
between runs. Failure handling, so that one bad run never stops a sweep:
- a worker that dies (signal, non-zero exit) ends the job: the other ranks are stopped, and the
  run is recorded failed with the rank and the signal;
- a rank whose run fails (an exception inside execute) ends the job at once (its peers would
  otherwise wait for it in the next all-reduce until launcher.collective_timeout_s);
- a job past launcher.timeout_s is stopped and recorded failed.
The MLflow run a dead worker may have left "running" is found by its launch_id tag and marked
failed; if it died before opening one, a failed run is opened for it. SIGINT / SIGTERM to the
launching process (interrupt.py) stops the workers the same way and marks their run interrupted.
A launching process killed outright (SIGKILL) cannot stop anything: each worker watches it and,
once it is gone, marks its run interrupted and exits (_die_with_launcher).
"""
from __future__ import annotations

import gc
import logging
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.queues import SimpleQueue
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple, Union

from omegaconf import DictConfig
from torch.multiprocessing import ProcessContext, ProcessExitedException

from bertaccel.config import RunConfig
from bertaccel.distributed import Rank
from bertaccel.options.launcher import runs_side_by_side
from bertaccel.record.store_failure import StoreFailed, close_left_open, failed, quiet_store_errors
from bertaccel.runs import interrupt
from bertaccel.runs.cores import share_the_cores
from bertaccel.runs.forkserver import start_forkserver
from bertaccel.runs.startup import (PROCESS_FORK, PROCESS_IMPORTS, PROCESS_SETUP, PROCESS_SPAWN, Mark, fork_marks,
                                    process_started_at, stamp)

if TYPE_CHECKING:  # (record/run_record.py is imported where a run is recorded, not with this module)
    from bertaccel.record.run_record import Outcome

log = logging.getLogger("bertaccel")

POLL_S = 0.2          # how often the launcher looks at its workers
STRAGGLER_GRACE_S = 60.0  # how long the other ranks may take to exit once rank 0 has its outcome
LAUNCH_TAG = "launch_id"
TERMINATE_GRACE_S = 10.0  # an interrupted run's workers get this long to exit before SIGKILL
WATCH_S = 0.5  # how often a worker looks whether its launching process is still there


@dataclass
class BadInput:
    """A worker's ConfigError / DataError, re-raised in the launching process."""
    error: Exception
    status: str = "bad_input"


# What a worker sends its launcher: the run's Outcome, bad input, or the store failing under it.
WorkerResult = Union["Outcome", BadInput, StoreFailed]


@dataclass
class Job:
    """Everything a worker needs, picklable: the typed config as it is (a dataclass pickles)."""
    run: RunConfig
    choices: Dict[str, str]
    run_name: str
    started_at: float
    started_source: str
    launch_id: str
    # The GPUs (CUDA_VISIBLE_DEVICES names) this job's processes see; None: whatever the sweep sees.
    devices: Optional[List[str]] = None
    # The launching process's environment now: a forkserver worker would otherwise have the
    # environment of when the server started (the sweep's parent-run id is set after that).
    env: Optional[Dict[str, str]] = None
    # The launching process (pid and start time): a worker whose launcher is gone (SIGKILL) marks
    # its run interrupted and ends, rather than finishing a run that nobody waits for.
    launcher_pid: int = 0
    launcher_started_at: float = 0.0
    # Where the start-up went so far (runs/startup.py); the worker adds its own marks.
    startup: List[Mark] = field(default_factory=list)
    later: Tuple[str, ...] = ()  # the later checks this job's process asks (runs/checked.py)


def _worker(local_rank: int, job: Job, results: SimpleQueue[Tuple[int, WorkerResult]], init_method: str,
            world: int, timeout_s: float) -> None:
    """One process of a job (torch.multiprocessing entry point: module level, picklable)."""
    # This process's start (the fork, or the spawn) and its first line of ours: the start-up's
    # marks in between are multiprocessing's (the main module run again, the job unpickled).
    started_at = process_started_at()
    startup = [*job.startup, *fork_marks(started_at), (PROCESS_SETUP, started_at), (PROCESS_IMPORTS, time.time())]
    interrupt.in_worker()  # Ctrl-C reaches the whole process group: the launcher stops this process
    quiet_store_errors()
    _die_with_launcher(job)
    # Hydra configured logging in the launching process only; rank 0 speaks for the job, on
    # stdout as Hydra's console handler does (stderr stays for errors: "error: ..." one-liners).
    logging.basicConfig(stream=sys.stdout, level=logging.INFO if local_rank == 0 else logging.WARNING,
                        format=f"[%(asctime)s][%(name)s][%(levelname)s]{'' if world == 1 else f'[rank {local_rank}]'}"
                               " - %(message)s")
    if job.env is not None:
        os.environ.clear()
        os.environ.update(job.env)
    if job.devices is not None:
        # Before anything touches CUDA in this process (torch reads the variable when it first
        # initializes CUDA): this job's GPUs only, numbered from 0 as the run expects.
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(job.devices)
    import torch

    from bertaccel.runs.job import execute

    if world > 1:
        # NVLink multicast (NVLS) off unless the user's environment says otherwise: it needs
        # fabric-manager multicast support that shared GPU hosts often lack (and the machines
        # this was built on forbid), and plain ring/tree all-reduce is what the thesis measured.
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # this worker's own environment only
    if not torch.cuda.is_available():
        share_the_cores(world * runs_side_by_side(job.run))
    from bertaccel.config import ConfigError
    from bertaccel.data import DataError

    # What this process has imported stays for its life: no collection walks it again (forked
    # from the server, that heap is frozen there already: runs/preload.py).
    gc.freeze()
    rank = Rank(local_rank, world, init_method, timeout_s) if world > 1 else None
    outcome: WorkerResult
    try:
        outcome = execute(job.run, job.choices, job.run_name, job.started_at, job.started_source, rank=rank,
                          launch_tags={LAUNCH_TAG: job.launch_id, **_device_tag(job)}, startup=startup, later=job.later)
    except (ConfigError, DataError) as e:
        # Bad input, found before anything was written (a malformed CSV): back to the caller,
        # who decides between "one line, exit 2" and "record it and go on", as inline.
        outcome = BadInput(e)
    except StoreFailed as e:  # the store failed under the run: the launcher stops the sweep
        outcome = e
    except Exception as e:
        store = failed(e, job.run.tracking.uri, job.run.tracking.experiment)
        if store is None:
            raise  # (a run's own failure that execute did not record: the launcher records it)
        outcome = store
    results.put((local_rank, outcome))


def _die_with_launcher(job: Job) -> None:
    """A thread that ends this worker when its launching process is gone (SIGKILL leaves no
    chance to stop it): the run is marked interrupted first, under the store's lock, so a run
    that is being marked finished at that moment either is finished or stays interrupted, and a
    later sweep runs the configuration again instead of counting an orphan's result twice."""
    if not job.launcher_pid:
        return
    uri = job.run.tracking.uri
    experiment = job.run.tracking.experiment

    def watch() -> None:
        from bertaccel.record.sweep import process_alive
        from bertaccel.record.tracking import finish_run, search_runs
        from bertaccel.store import store_lock

        me = socket.gethostname()
        while process_alive(me, str(job.launcher_pid), f"{job.launcher_started_at:.3f}"):
            time.sleep(WATCH_S)
        try:
            with store_lock(uri):
                for run in search_runs(uri, experiment, f"tags.{LAUNCH_TAG} = '{job.launch_id}'"):
                    if run.data.tags.get("status") == "running":
                        finish_run(uri, run.info.run_id, "interrupted",
                                   f"its sweep's process (pid {job.launcher_pid}) ended before the run did "
                                   "(killed); the run's worker stopped with it")
                os._exit(137)  # (inside the lock: nothing of this process writes after the mark)
        finally:
            os._exit(137)

    threading.Thread(target=watch, name="bertaccel-die-with-launcher", daemon=True).start()


def _device_tag(job: Job) -> Dict[str, str]:
    """The GPUs a run was given by the sweep launcher (launcher.runs_at_once), for the record."""
    return {} if job.devices is None else {"cuda_visible_devices": ",".join(job.devices)}


def in_processes(job: Job, cfg: DictConfig) -> Outcome:
    """Run the job in job.run.num_gpus processes of its own; its Outcome, recorded whatever became
    of them. cfg: the DictConfig the record writes (record/run_record.py logged_config of job.run),
    for a run whose process ended before it opened its record."""
    import torch.multiprocessing as mp

    world = job.run.num_gpus
    method = job.run.launcher.start_method
    if method == "forkserver":
        start_forkserver()
    ctx = mp.get_context(method)
    results: SimpleQueue[Tuple[int, WorkerResult]] = ctx.SimpleQueue()
    # The ranks meet through a file store in a directory of the job's own, not a TCP port: a
    # port probed free here could be taken by another program before rank 0 binds it. (All ranks
    # are on this host.) The directory goes with the job.
    rendezvous = tempfile.mkdtemp(prefix="bertaccel-rendezvous-")
    # (the start of the worker's start-up phases: the fork waits for the server's preload, if not done)
    job.startup = stamp(job.startup, PROCESS_FORK if method == "forkserver" else PROCESS_SPAWN)
    procs: ProcessContext = mp.start_processes(_worker, args=(job, results, f"file://{rendezvous}/store", world,
                                                              job.run.launcher.collective_timeout_s),
                                               nprocs=world, join=False, start_method=method)
    deadline = time.monotonic() + job.run.launcher.timeout_s
    outcomes: Dict[int, WorkerResult] = {}
    stopped: Optional[interrupt.Interrupted] = None  # SIGINT / SIGTERM to the launching process
    try:
        failure = _watch(job, procs, results, outcomes, deadline)
    except interrupt.Interrupted as e:
        stopped = e
    finally:
        _stop(procs, interrupted=stopped is not None)
        shutil.rmtree(rendezvous, ignore_errors=True)
    if stopped is not None:
        # The worker is gone; its run, left RUNNING, ends as interrupted (found by launch_id).
        marked = _mark(job, stopped.reason, "interrupted")
        stopped.run_id, stopped.run_name = marked.run_id if marked is not None else None, job.run_name
        # Let go of the queue and the process handles now: the exception's traceback keeps this
        # frame until the program exits, and a queue alive then is "leaked semaphore" noise.
        del results, procs
        raise stopped.with_traceback(None)
    while not results.empty():  # outcomes sent just before the end
        r, outcome = results.get()
        outcomes[r] = outcome
    main = outcomes.get(0)
    if isinstance(main, BadInput):
        raise main.error
    if isinstance(main, StoreFailed):
        raise close_left_open(job.run.tracking.uri, job.run.tracking.experiment,
                              f"tags.{LAUNCH_TAG} = '{job.launch_id}'", job.run_name, main)
    if failure is None and main is not None:
        return main
    failure = failure or "no outcome from rank 0 (its process ended without one)"
    return _record_failure(job, cfg, failure, main)


def _watch(job: Job, procs: ProcessContext, results: SimpleQueue[Tuple[int, WorkerResult]],
           outcomes: Dict[int, WorkerResult], deadline: float) -> Optional[str]:
    """Poll the job's workers until they have all exited, putting each rank's outcome into
    `outcomes` as it arrives. Returns why the job is to be stopped early (a rank failed, died or
    raised; launcher.timeout_s passed), or None: all exited, or rank 0 is done and its peers
    are left behind. Raises interrupt.Interrupted on SIGINT / SIGTERM to this process."""
    import torch.multiprocessing as mp

    world = job.run.num_gpus
    failure: Optional[str] = None
    main_done: Optional[float] = None  # when rank 0's outcome arrived
    while True:
        interrupt.check()  # (another thread's run: the main thread got the signal)
        while not results.empty():
            r, outcome = results.get()
            outcomes[r] = outcome
            if outcome.status in ("failed", "bad_input") and r != 0 and failure is None:
                why = outcome.error if isinstance(outcome, BadInput) else outcome.reason
                failure = f"rank {r} of {world}: {why}"
        if failure is not None:
            return failure
        try:
            if procs.join(timeout=POLL_S):
                return None
        except mp.ProcessExitedException as e:  # a worker died; join has stopped the others
            return _death(e, world)
        except mp.ProcessRaisedException as e:  # an exception outside execute's own handling
            last = [line for line in str(e).strip().splitlines() if line.strip()]
            return f"rank {e.error_index} of {world} raised: {last[-1] if last else e}"
        if time.monotonic() > deadline:
            return f"stopped after launcher.timeout_s={job.run.launcher.timeout_s:g} s"
        if 0 in outcomes and main_done is None:
            main_done = time.monotonic()
        if main_done is not None and time.monotonic() - main_done > STRAGGLER_GRACE_S:
            # Rank 0 has recorded the run; a peer still not done is stuck in its teardown.
            log.warning(f"run {job.run_name}: stopping {sum(p.is_alive() for p in procs.processes)} rank(s) "
                        f"still running {STRAGGLER_GRACE_S:g} s after rank 0 finished")
            return None


def _stop(procs: ProcessContext, interrupted: bool) -> None:
    """End the job's workers that still run and reap them all. interrupted: SIGTERM first, with
    TERMINATE_GRACE_S to exit, then SIGKILL; otherwise SIGKILL at once (a job stopped early:
    a failed rank's peers, launcher.timeout_s, a rank stuck after rank 0 finished)."""
    if interrupted:
        # SIGTERM first: a worker unwinds (interrupt.in_worker), so what it holds (tqdm's
        # lock, a semaphore) is given back rather than reported leaked at exit.
        for p in procs.processes:
            if p.is_alive():
                p.terminate()
        end = time.monotonic() + TERMINATE_GRACE_S
        for p in procs.processes:
            p.join(max(0.0, end - time.monotonic()))
    for p in procs.processes:
        if p.is_alive():
            p.kill()
    for p in procs.processes:
        p.join()


def _death(e: ProcessExitedException, world: int) -> str:
    who = f"rank {e.error_index} of {world}" if world > 1 else "the run's process"
    if e.signal_name:
        return f"{who} died from signal {e.signal_name} (pid {e.error_pid})"
    return f"{who} exited with code {e.exit_code} (pid {e.error_pid})"


def _mark(job: Job, reason: str, status: str) -> Optional[Outcome]:
    """The job's MLflow run (found by its launch_id), if its process opened one, ended with this
    status and reason; None if it opened none."""
    from bertaccel.record.run_record import Outcome
    from bertaccel.record.tracking import finish_run, search_runs

    uri = job.run.tracking.uri
    log.warning(f"run {job.run_name}: {status}: {reason}")
    runs = search_runs(uri, job.run.tracking.experiment, f"tags.{LAUNCH_TAG} = '{job.launch_id}'")
    if not runs:
        return None
    run = runs[0]
    recorded, earlier = run.data.tags.get("status"), run.data.tags.get("reason")
    if recorded == "failed" and earlier and earlier != reason:
        # Rank 0 may have recorded its own symptom first (a peer's closed connection): the
        # launcher's cause leads, rank 0's words stay.
        reason = f"{reason} (rank 0 reported: {earlier})"
    finish_run(uri, run.info.run_id, status, reason)
    return Outcome(status, job.run_name, reason, run.info.run_id)


def _record_failure(job: Job, cfg: DictConfig, reason: str, main: Optional[Outcome]) -> Outcome:
    """Mark the job's MLflow run failed with the reason, opening one if none was (cfg: what it
    records) unless rank 0's outcome says it never opened one of its own."""
    from bertaccel.record.run_record import record_bad_input

    marked = _mark(job, reason, "failed")
    if marked is not None:
        return marked
    if main is not None and main.run_id is None:
        return main
    return record_bad_input(cfg, job.choices, job.run_name, reason, {LAUNCH_TAG: job.launch_id})
