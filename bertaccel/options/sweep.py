"""The `sweep` block's option: its declared ranges are its checks (what cannot share a GPU is a rule
between sections: options/rules.py), and the predicates the code reads sweep.concurrent through.

sweep.concurrent=N (N > 1): a sweep runs up to N runs at once on each GPU (launcher.runs_at_once
x N in all: options/launcher.py runs_side_by_side), each in processes of its own; every run's timed
window of sweep.window_steps steady steps holds the device alone (bertaccel/train/exclusive.py)
and its time, energy and samples/s are projected from that window (bertaccel/record/exclusive.py).
"""
from __future__ import annotations

from pathlib import Path

from bertaccel.config import SweepConfig
from bertaccel.option import Option, user_path


def shares_gpu(sweep: SweepConfig) -> bool:
    """Runs share the device and are timed over an exclusive window, not their whole training."""
    return sweep.concurrent > 1


def lock_directory(cache_dir: str, sweep_id: str) -> Path:
    """The files of one sweep's exclusive-window lock (train/exclusive.py SweepLock)."""
    return user_path(cache_dir) / "exclusive-windows" / sweep_id


class SweepOption(Option):
    """No check of its own beyond the declared ranges; what cannot share a GPU (launcher=inline,
    num_gpus > 1) is a rule between sections (options/rules.py: concurrent_inline, concurrent_num_gpus)."""
    section, schema = "sweep", SweepConfig


OPTION = SweepOption()
