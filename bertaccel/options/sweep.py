"""The `sweep` block's option: its one check beyond the declared ranges (sweep.concurrent, runs
sharing a GPU, with what cannot share one), and the predicates the code reads the mode through.

sweep.concurrent=N (N > 1): a sweep runs up to N runs at once on each GPU (launcher.runs_at_once
x N in all: options/launcher.py runs_side_by_side), each in processes of its own; every run's timed
window of sweep.window_steps steady steps holds the device alone (bertaccel/train/exclusive.py)
and its time, energy and samples/s are projected from that window (bertaccel/record/exclusive.py).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, List

from bertaccel.config import SweepConfig
from bertaccel.option import Option, user_path
from bertaccel.options.launcher import runs_inline

if TYPE_CHECKING:
    from bertaccel.config import RunConfig


def shares_gpu(sweep: SweepConfig) -> bool:
    """Runs share the device and are timed over an exclusive window, not their whole training."""
    return sweep.concurrent > 1


def lock_directory(cache_dir: str, sweep_id: str) -> Path:
    """The files of one sweep's exclusive-window lock (train/exclusive.py SweepLock)."""
    return user_path(cache_dir) / "exclusive-windows" / sweep_id


class SweepOption(Option):
    section, schema = "sweep", SweepConfig

    def check(self, cfg: "RunConfig") -> List[str]:
        """Refuses sweep.concurrent > 1 with launcher=inline (the runs need processes of their own)
        and with num_gpus > 1 (a window times one GPU's run alone; a data-parallel run's ranks span
        several)."""
        n = cfg.sweep.concurrent
        if n <= 1:
            return []
        found = []
        if runs_inline(cfg.launcher):
            found.append(f"sweep.concurrent={n} trains runs side by side, each in processes of its own: "
                         "launcher=inline would run them in one process; use launcher=process (the default)")
        if cfg.num_gpus > 1:
            found.append(f"sweep.concurrent={n} shares one GPU between runs and times each alone, but num_gpus="
                         f"{cfg.num_gpus} is a data-parallel run over several; use num_gpus=1 or sweep.concurrent=1")
        return found


OPTION = SweepOption()
