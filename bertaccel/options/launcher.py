"""The `launcher` block's checks: where a run executes (bertaccel/runs/launch.py), how its
processes start, and the runs that need processes of their own (side by side, one per rank)."""
from __future__ import annotations

from typing import Any, Optional

from bertaccel.config import LAUNCHERS, START_METHODS, not_one_of


def check(cfg: Any) -> Optional[str]:
    """Refuses an unknown name or start_method, and launcher=inline with runs_at_once > 1 or
    num_gpus > 1, which need processes of their own."""
    launcher = cfg.launcher
    why = (not_one_of("launcher.name", launcher.name, LAUNCHERS)
           or not_one_of("launcher.start_method", launcher.start_method, START_METHODS))
    if why or launcher.name != "inline":
        return why
    if launcher.runs_at_once > 1:
        return (f"launcher.runs_at_once={launcher.runs_at_once} runs configurations side by side, each "
                "in processes of its own: launcher=inline would run them in one process; use "
                "launcher=process (the default)")
    if cfg.num_gpus > 1:
        return (f"num_gpus={cfg.num_gpus} needs a process per rank: launcher=inline runs in the sweep's "
                "own process; use launcher=process (the default)")
    return None
