"""What a launcher is, as one object chosen once from launcher.name (launcher_for), so the code that
runs a configuration asks the object, not the name: whether the run shares the sweep's process
(train/isolation.py resets what it can between runs then) and which of the options' later checks
the launching process leaves to the run's own process (runs/launch.py).

- `inline`: in the calling process (the sweep's own);
- `process` (default): a process per run, one per rank for num_gpus=N (DDP), forked from the
  forkserver or spawned (runs/launch.py _in_processes). A submitit job (hydra_plugins) runs its
  configuration with one of these two in the job's own process.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

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
    """The launcher launcher.name names (validated already: options/launcher.py)."""
    return LAUNCHERS[name]
