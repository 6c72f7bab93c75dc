"""The launcher block: where each run's processes start. Its option: bertaccel/options/launcher.py."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from bertaccel.option import bounded

START_METHODS = ("forkserver", "spawn")


@dataclass
class LauncherConfig:
    """Where and how each run's processes start (checks: bertaccel/options/launcher.py)."""
    # Where a run executes (bertaccel/runs/launch.py): inline = in the sweep's own process;
    # process = a fresh Python process per run (one per rank for num_gpus > 1).
    name: str = "process"
    # A run (all its ranks) still going after this many seconds is stopped and recorded failed.
    # No "infinite" (the finite check refuses inf): give a long time instead, e.g. 864000 (ten days).
    timeout_s: float = bounded(86400.0, gt=0)
    # Seconds a collective may wait on a peer before it fails, so a dead or hung rank ends the job
    # (num_gpus > 1). At most what a datetime.timedelta holds: torch.distributed takes it as one.
    collective_timeout_s: float = bounded(300.0, gt=0, le=timedelta.max.total_seconds())
    # A sweep (-m) runs this many configurations at a time, each in processes of its own and, on
    # a GPU host, on num_gpus GPUs of its own (hydra_plugins/bertaccel_launcher). 1: one by one.
    runs_at_once: int = bounded(1, ge=1, note="1: one run at a time")
    # How run processes start. forkserver: forked from a server process that imported torch,
    # transformers, mlflow and bertaccel once, so a later run of a sweep starts in well under a
    # second instead of re-importing them (seconds to tens of seconds); the server never touches
    # CUDA, so each run still gets a fresh CUDA context, allocator and dynamo. spawn: a fresh
    # interpreter per run, for a library that misbehaves after fork.
    start_method: str = "forkserver"
