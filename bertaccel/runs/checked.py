"""Where a run's config becomes typed, once, and which of the options' later checks (they build or
reach out: options/checks.py) are asked where.

- A single run: launch() types it (checks.validate), every check but those its launcher leaves to the run when the
  run has a process of its own (launcher=process): that process asks those (job.execute).
- A configuration of a grid sweep: the sweep's plan types it before the store is opened
  (runs/sweep_plan.py), leaving LEFT_TO_THE_RUNS; launch() asks those, less the run process's
  own, of the typed config (checks.ask_later): checks alone, not a second conversion.

The typed RunConfig is then what crosses to the run's process (runs/launch.py Job) and what the
DictConfig the record writes is derived from (record/run_record.py logged_config).
"""
from __future__ import annotations

from typing import Optional, Tuple

from omegaconf import DictConfig

from bertaccel.config import RunConfig
from bertaccel.runs import interrupt

# Not asked before a sweep: building the optimizer imports torch's compiler, and the store is the
# sweep's to ask next, once (runs/sweep_plan.py). Each run asks them at its turn.
LEFT_TO_THE_RUNS = ("optimizer.check_built", "tracking.check_store")


def typed_once(cfg: DictConfig, typed: Optional[RunConfig]) -> Tuple[RunConfig, Tuple[str, ...]]:
    """(cfg typed, the later checks its run's process is to ask). typed: cfg as the sweep's plan
    typed it, or None (typed here). Raises ConfigError saying every problem found."""
    from bertaccel.options.checks import ask_later, validate

    from bertaccel.options.launcher import launcher_for

    own = launcher_for(cfg.launcher.name).left_to_the_run  # (asked in the run's own process, if it has one)
    with interrupt.deferred():  # (OmegaConf's conversion: a signal raised inside it was lost)
        if typed is None:
            return validate(cfg, leave=own), own
        ask_later(typed, [name for name in LEFT_TO_THE_RUNS if name not in own])
    return typed, own
