"""The grid of a sweep, expanded as `python -m bertaccel.run -m` would expand it.

Hydra's own machinery does it, nothing hand-split: the primary config (a study such as `quick`
or conf/config.yaml) is loaded in MULTIRUN mode, its `hydra.sweeper.params` and the command
line are parsed by Hydra's override parser and crossed by the basic sweeper's own
`split_arguments`, and each job's config is composed by `load_sweep_config`, as bertaccel's
launcher does. So a planned configuration has the run name, the choices and the config_hash its
run will have, which is how a prediction meets its measurement later.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set

from omegaconf import DictConfig, OmegaConf, open_dict

from bertaccel.config import RunConfig


class PlanInputError(ValueError):
    """Bad plan input; the message is the one line the user sees."""


@dataclass
class PlannedConfig:
    number: int                      # Hydra's job number in the sweep
    name: str                        # the run name the sweep will give it (record.run_label)
    overrides: List[str]             # the job's overrides, as Hydra hands them to the job
    cfg: DictConfig                  # the job's config, without the `hydra` node (what the run gets)
    choices: Dict[str, str]          # config group -> option, as the run logs them
    config_hash: str
    invalid: Optional[str] = None    # why the project's validation refuses it (then nothing is predicted)
    run: Optional[RunConfig] = None  # the config typed by that validation (None: invalid): what is predicted


@dataclass
class Grid:
    config_name: str
    configs: List[PlannedConfig]
    swept: List[str] = field(default_factory=list)
    sweep_id: str = ""               # the id `bertaccel.run -m` gives this sweep (record/sweep.py: sweep_identity)

    def refusal(self) -> Optional[str]:
        """Bad input in every configuration: the first one's problems, a line each, worded as
        `run -m` refuses that sweep (runs/sweep_plan.py); None when one can run."""
        if not self.configs or not all(c.invalid for c in self.configs):
            return None
        why = self.configs[0].invalid or ""
        if len(self.configs) > 1:
            others = len(self.configs) - 1
            why += (" (in every configuration of the sweep: nothing to run)"
                    if len({c.invalid for c in self.configs}) == 1 else
                    f" (the other {others} configuration{'s are' if others > 1 else ' is'} refused too: nothing to run)")
        return why


def _sweeper_jobs(master: DictConfig, arguments: Sequence[str], config_loader: Any) -> List[List[str]]:
    """The job override lists the sweep launches: its params first, the command line after (a key
    in both takes the command line's value at the params' place), crossed, with bertaccel's
    sweeper's baseline and repeats (runs/sweep_jobs.py)."""
    from bertaccel.hydra_adapter import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from bertaccel.runs.sweep_jobs import SweepJobsRefused, refuse_oversized, sweep_jobs

    target = master.hydra.sweeper.get("_target_", "")
    if not target.endswith(("BasicSweeper", "BertaccelSweeper")):
        raise PlanInputError(f"hydra/sweeper is {target}: plan expands the basic sweeper's grids only")
    params = master.hydra.sweeper.get("params") or {}
    spec = [f"{k}={v}" for k, v in params.items()] + list(arguments)
    parsed = OverridesParser.create(config_loader=config_loader).parse_overrides(spec)
    try:
        if target.endswith("BasicSweeper"):
            refuse_oversized(master, parsed)
            (batch,) = BasicSweeper.split_arguments(parsed, None)
            return [list(job) for job in batch]
        return sweep_jobs(master, parsed).overrides
    except SweepJobsRefused as e:
        raise PlanInputError(str(e)) from e


def expand(config_name: str = "config", overrides: Sequence[str] = (), config_dir: Optional[str] = None) -> Grid:
    """Every configuration of the sweep. Raises Hydra's own exceptions for a command line it
    cannot compose (the caller words them as the run CLI does: run.input_error), and StudyError
    for a config_dir that is not a folder. config_dir: the user's folder of studies, on the
    search path where run's --config-dir puts it (runs/command_config.py)."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    from bertaccel.options.checks import validate
    from bertaccel.runs.command_config import composing
    from bertaccel.runs.progress import swept_keys
    from bertaccel.runs.sweep_jobs import naming_keys
    from bertaccel.runs.sweep_plan import PlanningSaid
    from bertaccel.record.run_record import cfg_hash, group_choices, run_label
    from bertaccel.record.sweep import sweep_identity

    from ..config import GROUPS, ConfigError

    arguments = list(overrides)
    try:
        with composing(config_dir or None, job_name="plan") as loader:
            master = loader.load_configuration(config_name, arguments, run_mode=RunMode.MULTIRUN)
            jobs = _sweeper_jobs(master, arguments, loader)
            params = master.hydra.sweeper.get("params") or {}
            every = list(master.hydra.overrides.task) + [f"{k}={v}" for k, v in params.items()]
            swept = sorted(swept_keys(every) | naming_keys(jobs))  # (as the sweep names its runs: progress.py)
            grid = Grid(config_name, [], swept, sweep_identity(config_name, every))
            _check_store(str(master.tracking.uri))
            seen: Set[str] = set()
            said = PlanningSaid(len(jobs), "plan: ", sys.stderr)
            for number, job in enumerate(jobs):
                said.checked(number)
                cfg = loader.load_sweep_config(master, job)  # (it adds the master's hydra.* overrides)
                choices = group_choices(cfg.hydra.runtime.choices, GROUPS)
                name = run_label(cfg.hydra.overrides.task, swept)
                with open_dict(cfg):
                    del cfg["hydra"]  # what the run's task function gets (Hydra's run_job drops it)
                OmegaConf.set_readonly(cfg, False)
                invalid, run = None, None
                try:
                    # (not whether the store can be written: the plan only reads it, _check_store
                    # above, and a read-only store is the run's refusal at its turn, not the plan's)
                    run = validate(cfg, leave=("tracking.check_store",))
                except ConfigError as e:
                    invalid = str(e)
                digest = cfg_hash(cfg)  # (once per configuration: the plan is linear in them)
                if digest in seen:
                    continue  # (given twice, or the added baseline is a grid job: the sweep runs it once)
                seen.add(digest)
                grid.configs.append(PlannedConfig(number, name, job, cfg, choices, digest, invalid, run))
    finally:
        GlobalHydra.instance().clear()
    return grid


def _check_store(uri: str) -> None:
    """The store the plan calibrates from: none yet is fine (a plan before the first run), one
    that is not an MLflow store is bad input (nothing is read from it, nothing written to it)."""
    from bertaccel.store import sqlite_file, sqlite_state, store_problem

    db = sqlite_file(uri)
    if db is not None and sqlite_state(db)[0] == "missing":
        return
    why = store_problem(uri, create=False)
    if why:
        raise PlanInputError(f"tracking.uri={uri}: {why}")
