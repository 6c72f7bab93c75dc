"""The `launcher` option, in one home: what each launcher is (an object chosen once from
launcher.name, so the code that runs a configuration asks the object, not the name), and the
block's checks: where a run executes (bertaccel/runs/launch.py), how its processes start, and the
runs that need processes of their own (side by side, one per rank).

- `inline`: in the calling process (the sweep's own); train/isolation.py resets what it can
  between the runs that share it;
- `process` (default): a process per run, one per rank for num_gpus=N (DDP), forked from the
  forkserver or spawned (runs/worker_processes.py in_processes). A submitit job (hydra_plugins) runs its
  configuration with one of these two in the job's own process.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Tuple

from bertaccel.config import START_METHODS, LauncherConfig, not_one_of
from bertaccel.option import Option, problems

if TYPE_CHECKING:
    from bertaccel.config import RunConfig

# The optimizer's later check builds it, whose import of torch._dynamo (3.4 s on an H100 host) was
# the longest part of a sweep's first-run start-up: a run of its own process asks it there.
BUILT_IN_THE_RUN = ("optimizer.check_built",)


@dataclass(frozen=True)
class Launcher:
    """One way to run a configuration (launcher.name)."""
    name: str
    shares_process: bool  # the run executes in the launching process (a sweep's runs share it)
    left_to_the_run: Tuple[str, ...]  # later checks (validate(leave=...)) the run's own process asks


INLINE = Launcher("inline", shares_process=True, left_to_the_run=())
PROCESS = Launcher("process", shares_process=False, left_to_the_run=BUILT_IN_THE_RUN)
LAUNCHERS: Dict[str, Launcher] = {launcher.name: launcher for launcher in (INLINE, PROCESS)}


def launcher_for(name: str) -> Launcher:
    """The launcher launcher.name names (validated already: LauncherOption.check)."""
    return LAUNCHERS[name]


def runs_inline(launcher_cfg: LauncherConfig) -> bool:
    """The run executes in the launching process (launcher=inline), so it cannot have processes of
    its own: one per rank, or several configurations side by side."""
    return launcher_cfg.name in LAUNCHERS and launcher_for(launcher_cfg.name).shares_process


def runs_side_by_side(cfg: "RunConfig") -> int:
    """How many runs of a sweep train at once (hydra_plugins/bertaccel_launcher, and the CPU
    cores each gets: runs/cores.py): launcher.runs_at_once, each GPU shared by sweep.concurrent of
    them (options/sweep.py)."""
    return int(cfg.launcher.runs_at_once) * int(cfg.sweep.concurrent)


class LauncherOption(Option):
    section, schema = "launcher", LauncherConfig

    def check(self, cfg: "RunConfig") -> List[str]:
        """Refuses an unknown name or start_method, and launcher=inline with runs_at_once > 1, which
        needs processes of its own (inline with num_gpus > 1: a rule, options/rules.py)."""
        launcher = cfg.launcher
        found = problems(not_one_of("launcher.name", launcher.name, LAUNCHERS),
                         not_one_of("launcher.start_method", launcher.start_method, START_METHODS))
        if runs_inline(launcher) and launcher.runs_at_once > 1:
            found.append(f"launcher.runs_at_once={launcher.runs_at_once} runs configurations side by side, each "
                         "in processes of its own: launcher=inline would run them in one process; use "
                         "launcher=process (the default)")
        return found


OPTION = LauncherOption()
