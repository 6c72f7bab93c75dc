"""Where a run executes: what a run is (job.execute: a configuration -> an Outcome) apart from
where it runs.

- `inline`: in the calling process (the sweep's own). Cheapest; runs share the process, so
  train/isolation.py resets what it can between them, and a crash ends the sweep.
- `process` (default): a fresh Python process per run, and for num_gpus=N one per rank, started
  by torch.multiprocessing: forked from a server process that imported the libraries once
  (launcher.start_method=forkserver, the default) or spawned. Nothing of dynamo, the CUDA
  allocator, cuDNN or the RNGs carries from one run to the next, and a segfault, abort or
  OOM-kill costs that run only.

How a run executes in processes of its own, watched, stopped and recorded whatever becomes of
them: runs/worker_processes.py.

One finished run per configuration, also with two sweeps on one store: a configuration another
live process is running is waited for (or put off, in the sweep launcher's first pass), then taken
as already finished or run again (runs/claims.py, record/sweep.py previous_outcome, job.execute's
claim). The store or its disk failing under a run stops the sweep (record/store_failure.py).
"""
from __future__ import annotations

import logging
import os
import uuid
from typing import TYPE_CHECKING, Mapping, Optional, Sequence

import psutil
from omegaconf import DictConfig

from bertaccel.config import RunConfig
from bertaccel.runs.claims import second_turn, wait_for_others
from bertaccel.options.launcher import launcher_for
from bertaccel.runs.startup import LAUNCH_CHECKS, LAUNCH_RESUME, Mark, resume_collector, stamp
from bertaccel.runs.worker_processes import Job, in_processes
from bertaccel.record.store_failure import failed, quiet_store_errors, refuse_deleted_experiment
from bertaccel.record.sweep import RUNNING_ELSEWHERE

if TYPE_CHECKING:  # (record/run_record.py is imported at the launch, not with this module)
    from bertaccel.record.run_record import Outcome

log = logging.getLogger("bertaccel")


def launch(cfg: DictConfig, choices: Mapping[str, str], run_name: str, started_at: float,
           started_source: str, devices: Optional[Sequence[str]] = None, startup: Sequence[Mark] = (),
           typed: Optional[RunConfig] = None, untrained: Optional[str] = None) -> Outcome:
    """Run one configuration where cfg.launcher says; returns its record.Outcome. Bad input (ConfigError,
    DataError) is raised here, in the caller's process, before anything starts. devices: the GPUs the
    job's processes may see (the sweep launcher's share for this run). startup: the job's start-up marks
    so far (runs/startup.py). typed: cfg as the sweep's plan typed it, or None: typed here, once either way
    (runs/checked.py). untrained: why the plan leaves it (the added baseline) untrained: recorded skipped."""
    quiet_store_errors()
    try:
        return _launch(cfg, choices, run_name, started_at, started_source, devices, startup, typed, untrained)
    except Exception as e:
        stop = failed(e, cfg.tracking.uri, cfg.tracking.experiment)
        if stop is None:
            raise
        raise stop from None


def _launch(cfg: DictConfig, choices: Mapping[str, str], run_name: str, started_at: float,
            started_source: str, devices: Optional[Sequence[str]], startup: Sequence[Mark],
            typed: Optional[RunConfig], untrained: Optional[str]) -> Outcome:
    started_at, started_source, startup = second_turn(started_at, started_source, list(startup))
    startup = stamp(startup, LAUNCH_CHECKS)
    from bertaccel.options.hardware import check_gpu_count, resolve_device
    from bertaccel.runs.hub import hub_skip_reason
    from bertaccel.record.run_record import logged_config, record_skipped, resumed
    from bertaccel.runs.checked import typed_once
    from bertaccel.store import repair_store

    launcher = launcher_for(cfg.launcher.name)
    try:
        run, own = typed_once(cfg, typed)  # (own: asked in the run's process; a refusal comes back as bad input)
        cfg = logged_config(run)  # (what the record reads from here on: derived from the typed config)
        check_gpu_count(run.num_gpus, resolve_device(run.train.device))
        refuse_deleted_experiment(run.tracking.uri, run.tracking.experiment)
        repair_store(run.tracking.uri)  # a store left half-created by an older version: rebuilt (no runs in it)
        # Needs the hub and it is unreachable (probed once per sweep): skipped now, not after
        # each run's process waited on connection retries. (Or a baseline with nothing to compare.)
        hub_reason = untrained or hub_skip_reason(run)
    finally:
        resume_collector()  # (the main process's start-up is over: bertaccel.run paused the collector for it)
    if hub_reason is not None:
        log.warning(f"run {run_name} skipped: {hub_reason}")
        return record_skipped(cfg, choices, run_name, hub_reason, untrained=untrained is not None)
    startup = stamp(startup, LAUNCH_RESUME)  # (a wait on another sweep's run of it counts here too)
    while True:
        # A resumed sweep starts no process for a finished run, and none for a configuration that
        # another sweep on this store runs now: it waits for that run's end, then takes its outcome
        # (or runs it, if that run did not finish and its process is gone).
        earlier = wait_for_others(cfg, run_name, resumed)
        if earlier is not None:
            return earlier
        if launcher.shares_process:
            # (imported here, not above: the run's own code imports transformers' model classes,
            # seconds the launching process of a launcher=process sweep has no use for)
            from bertaccel.runs.job import execute

            outcome = execute(run, choices, run_name, started_at, started_source, startup=startup)
        else:
            me = psutil.Process()
            job = Job(run, dict(choices), run_name, started_at, started_source, uuid.uuid4().hex,
                      list(devices) if devices is not None else None, dict(os.environ), me.pid, me.create_time(),
                      list(startup), tuple(own))
            outcome = in_processes(job, cfg)
        if outcome.status != RUNNING_ELSEWHERE:  # (else another sweep opened it between look-up and start)
            return outcome
