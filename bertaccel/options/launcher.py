"""The `launcher` block's checks: where a run executes (bertaccel/runs/launch.py), how its
processes start, and the runs that need processes of their own (side by side, one per rank)."""
from __future__ import annotations

from typing import TYPE_CHECKING, List

from bertaccel.config import LAUNCHERS, START_METHODS, LauncherConfig, not_one_of
from bertaccel.option import Option, problems

if TYPE_CHECKING:
    from bertaccel.config import RunConfig


def runs_inline(launcher_cfg: LauncherConfig) -> bool:
    """launcher=inline: the run executes in the sweep's own process (runs/launchers.py INLINE)."""
    return launcher_cfg.name == "inline"


class LauncherOption(Option):
    section, schema = "launcher", LauncherConfig

    def check(self, cfg: "RunConfig") -> List[str]:
        """Refuses an unknown name or start_method, and launcher=inline with runs_at_once > 1, which
        needs processes of its own (inline with num_gpus > 1: a rule, options/rules.py)."""
        launcher = cfg.launcher
        found = problems(not_one_of("launcher.name", launcher.name, LAUNCHERS),
                         not_one_of("launcher.start_method", launcher.start_method, START_METHODS))
        if launcher.name == "inline" and launcher.runs_at_once > 1:
            found.append(f"launcher.runs_at_once={launcher.runs_at_once} runs configurations side by side, each "
                         "in processes of its own: launcher=inline would run them in one process; use "
                         "launcher=process (the default)")
        return found


OPTION = LauncherOption()
