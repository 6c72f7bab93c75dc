"""A grid sweep's configurations, known before its store is opened (runs/progress.py's
on_multirun_start asks plan_sweep, before the parent run):

- a sweep with no configuration (`train.seed=range(1,1)`) is refused: one line, exit 2;
- a sweep past sweep.max_runs runs (configurations x repeats, counted before anything is listed:
  runs/sweep_jobs.py) is refused the same way;
- a sweep whose every requested configuration is bad input (`-m train.epochs=0 precision=fp32,bf16`,
  a key the schema lacks, or what this machine's checks refuse before a run trains where the
  runs run here: `num_gpus=2,3 train.batch_size=auto` on a CPU) is refused the same way, as a
  single run with that input is: no store, no parent run, no failed runs. The baseline the sweep
  adds does not count: alone it answers nothing asked. When only some are bad, the sweep goes on
  and records each bad one failed with its reason, at its turn (run.run_one);
- a configuration given twice (same config_hash: `train.seed=1,1`) runs once, and the sweep's
  log says so once; the sweep's counts are of its distinct configurations.

The checks asked here are checks.validate's, less the two that are slow or not the input's own
(the optimizer's build, which imports torch's compiler, and the store's, which the sweep asks
next, once); each run asks those two alone at its turn. The sweep configs composed here (as
Hydra's launchers compose them: config_loader.load_sweep_config), and typed here (the one
conversion of each: runs/checked.py), are handed to bertaccel's launchers, which skip the repeats
and compose nothing again. A search (hydra/sweeper=optuna_*)
makes its trials one by one: nothing is planned for it.
"""
from __future__ import annotations

import copy
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, TextIO, Tuple

from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException
from yaml import YAMLError

from bertaccel.config import RunConfig
from bertaccel.hydra_adapter import BasicSweeper, basic_sweeper_name
from bertaccel.runs import interrupt
from bertaccel.runs.checked import LEFT_TO_THE_RUNS
from bertaccel.runs.sweep_jobs import SweepJobs, SweepJobsRefused, refuse_oversized, sweep_jobs
from bertaccel.runs.untrained_baseline import untrained_reason

BASIC_SWEEPER = basic_sweeper_name()
BERTACCEL_SWEEPER = "hydra_plugins.bertaccel_sweeper.bertaccel_sweeper.BertaccelSweeper"
# The launchers that run a sweep's runs on this machine: its devices are theirs (_machine_refusal).
LOCAL_LAUNCHERS = ("BertaccelLauncher", "BasicLauncher")
# The launcher that leaves an untrained baseline untrained (it hands the plan's reason to launch).
UNTRAINED_BY = "BertaccelLauncher"
KEPT_CONFIGS = 100     # the composed configs held for the launcher: the first jobs' (~0.3 MB each)
SAID_FROM = 50         # a sweep of more configurations says its planning as it goes (PlanningSaid)
PROGRESS_EVERY_S = 30.0


class SweepRefused(BaseException):
    """The whole sweep refused before it starts: its one line (why), or the composition error
    run.cli says in one line (error). A BaseException: raised from a Hydra callback, an Exception
    would become a warning and the sweep would go on."""

    def __init__(self, why: str = "", error: Optional[BaseException] = None) -> None:
        super().__init__(why)
        self.why, self.error = why, error


@dataclass
class PlannedJob:
    idx: int  # as the sweeper numbers it: its place in the grid
    overrides: List[str]
    config: Optional[DictConfig]  # the job's sweep config (hydra node included) for the launcher; None: compose it again
    config_hash: str
    refusal: Optional[str] = None  # bad input: the reason
    # The config typed (validate(leave=LEFT_TO_THE_RUNS)): what the launcher hands the run, which
    # converts nothing again (runs/launch.py). None: refused, or a repeat.
    run: Optional[RunConfig] = None
    repeat_of: Optional[int] = None  # the job of the same configuration that runs instead


@dataclass
class SweepPlan:
    jobs: List[PlannedJob] = field(default_factory=list)
    said: List[str] = field(default_factory=list)  # the repeats dropped, each said once
    baseline: Set[int] = field(default_factory=set)  # the jobs sweep.baseline added (runs/sweep_jobs.py)
    repeats: int = 1                                 # sweep.repeats: the job list is this many rounds
    defaulted: List[str] = field(default_factory=list)  # swept settings the baseline has at their defaults
    # Why the added baseline is not trained (every other configuration skipped or refused here:
    # runs/untrained_baseline.py), or None: it trains.
    untrained: Optional[str] = None
    _composed: Optional[Set[Tuple[str, ...]]] = field(default=None, repr=False)  # (composed(): built once)

    def distinct(self) -> List[PlannedJob]:
        return [j for j in self.jobs if j.repeat_of is None]

    def composed(self, overrides: Sequence[str]) -> bool:
        """Whether the plan composed a job of these overrides (Hydra could: nothing to ask again)."""
        if self._composed is None:
            self._composed = {tuple(j.overrides) for j in self.jobs}
        return tuple(overrides) in self._composed

    def planned(self, idx: int, overrides: Sequence[str]) -> Optional[PlannedJob]:
        """The job the sweeper launches as #idx with these overrides, if it is the one planned."""
        job = self.jobs[idx] if 0 <= idx < len(self.jobs) else None
        return job if job is not None and job.overrides == list(overrides) else None


def grid_jobs(config: DictConfig) -> Optional[SweepJobs]:
    """The jobs in the order the sweeper launches them (runs/sweep_jobs.py: bertaccel's sweeper
    adds the baseline and the repeats; the basic one, chosen by hand, only crosses), or None for
    another sweeper (a search)."""
    target = config.hydra.sweeper.get("_target_")
    if target not in (BASIC_SWEEPER, BERTACCEL_SWEEPER):
        return None
    params = [f"{k}={v}" for k, v in (config.hydra.sweeper.get("params") or {}).items()]
    parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    parsed = parser.parse_overrides(params + list(config.hydra.overrides.task))
    try:
        if target == BASIC_SWEEPER:
            refuse_oversized(config, parsed)
            return SweepJobs([job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch])
        return sweep_jobs(config, parsed)
    except SweepJobsRefused as e:
        raise SweepRefused(str(e)) from e


def plan_sweep(config: DictConfig) -> Optional[SweepPlan]:
    """Compose and check every configuration of a grid sweep (None: not a grid). Raises
    SweepRefused for an empty sweep, one whose every configuration is refused, or one Hydra
    cannot compose."""
    from bertaccel.config import ConfigError
    from bertaccel.options.checks import validate
    from bertaccel.record.run_record import cfg_hash

    try:
        jobs = grid_jobs(config)
        if jobs is None:
            return None
        grid = jobs.overrides
        if not grid:
            raise SweepRefused(f"the sweep has no configurations ({empty_axes(config)} gives no value); "
                               "give every swept key at least one value")
        loader = GlobalHydra.instance().config_loader()
        plan = SweepPlan(baseline=set(jobs.baseline), repeats=jobs.repeats, defaulted=list(jobs.defaulted))
        first: Dict[str, int] = {}  # config_hash -> its first job: one look-up per job, linear
        said = PlanningSaid(len(grid))
        local = str(config.hydra.launcher.get("_target_", "")).endswith(LOCAL_LAUNCHERS)
        for idx, overrides in enumerate(grid):
            said.checked(idx)
            sweep_cfg = loader.load_sweep_config(config, list(overrides))
            task_cfg = task_config(sweep_cfg)
            job = PlannedJob(idx, list(overrides), sweep_cfg, cfg_hash(task_cfg))
            job.repeat_of = first.setdefault(job.config_hash, idx)
            if job.repeat_of == idx:
                job.repeat_of = None
                try:
                    with interrupt.deferred():  # (OmegaConf's conversion: a signal inside it was lost)
                        job.run = validate(task_cfg, leave=LEFT_TO_THE_RUNS)
                    job.refusal = _machine_refusal(job.run) if local else None
                except ConfigError as e:
                    job.refusal = str(e)
            if idx not in plan.baseline and (job.repeat_of is not None or idx >= KEPT_CONFIGS):
                job.config = None  # (composed again at its turn: a big sweep's configs are not all held)
            plan.jobs.append(job)
    except (HydraException, OmegaConfBaseException, YAMLError) as e:  # a job Hydra cannot compose: run.cli says it
        raise SweepRefused(error=e) from e
    plan.said = _repeats_said(config, plan) + _baseline_said(plan)
    _refuse_if_nothing_to_run(plan)
    if str(config.hydra.launcher.get("_target_", "")).endswith(UNTRAINED_BY):
        # (the baseline trains here only if something else does: runs/untrained_baseline.py)
        # (said once the store is open: a finished earlier run of another configuration is one to
        # compare with, runs/progress.py asks the store)
        plan.untrained = untrained_reason(plan.baseline, plan.distinct())
    return plan


def _refuse_if_nothing_to_run(plan: SweepPlan) -> None:
    """Every requested configuration refused: the sweep is, in one line. The baseline the sweep
    adds does not count: alone it answers nothing the user asked."""
    requested = [j for j in plan.distinct() if j.idx not in plan.baseline]
    if requested and not all(j.refusal for j in requested):
        return
    refused = requested or plan.distinct()
    reasons = Counter(j.refusal for j in refused)
    why = str(refused[0].refusal)
    if len(refused) > 1:
        others = "the other configuration is" if len(refused) == 2 else f"the other {len(refused) - 1} configurations are"
        why += (" (in every configuration of the sweep: nothing to run)" if len(reasons) == 1 else
                f" ({others} refused too: nothing to run)")
    raise SweepRefused(why)


def _machine_refusal(run: RunConfig) -> Optional[str]:
    """What the run's own checks on this machine refuse before it trains (runs/launch.py,
    runs/job.py): a device that is not here, more GPUs than are visible, train.batch_size=auto off
    a GPU. Asked only where the sweep's runs run on this machine (not a cluster's launcher)."""
    from bertaccel.config import ConfigError
    from bertaccel.options.hardware import check_gpu_count, resolve_device
    from bertaccel.options.train import fits_batch
    from bertaccel.train.batch_fit import cpu_refusal

    try:
        device = resolve_device(run.train.device)
        check_gpu_count(run.num_gpus, device)
    except ConfigError as e:
        return str(e)
    return cpu_refusal(device) if fits_batch(run.train) and device.type != "cuda" else None


class PlanningSaid:
    """A big sweep's planning, said as it goes (Hydra composes each configuration: a few a second),
    so its first line comes within seconds, not after the whole list. prefix and stream: the
    sweep's ("[sweep] ", stdout) or the plan's ("plan: ", stderr: its stdout is the plan)."""

    def __init__(self, total: int, prefix: str = "[sweep] ", stream: Optional[TextIO] = None) -> None:
        self.total, self.prefix, self.stream = total, prefix, stream
        self.next_at = time.monotonic() + PROGRESS_EVERY_S
        if total > SAID_FROM:
            self._say(f"composing and checking {total} configurations before anything is written "
                      f"(a few a second; sweep.max_runs caps a sweep)")

    def checked(self, done: int) -> None:
        if self.total > SAID_FROM and time.monotonic() >= self.next_at:
            self._say(f"checked {done} of {self.total} configurations")
            self.next_at = time.monotonic() + PROGRESS_EVERY_S

    def _say(self, line: str) -> None:
        print(self.prefix + line, file=self.stream or sys.stdout, flush=True)


def task_config(sweep_cfg: DictConfig) -> DictConfig:
    """The run's configuration: the job's sweep config without its hydra node (as run_job hands it);
    every launcher's one home for it."""
    cfg = copy.deepcopy(sweep_cfg)
    with read_write(cfg), open_dict(cfg):
        del cfg["hydra"]
    return cfg


def empty_axes(config: DictConfig) -> str:
    """The swept overrides that give no value (what makes a grid empty), as typed."""
    params = [f"{k}={v}" for k, v in (config.hydra.sweeper.get("params") or {}).items()]
    empty = [o.input_line for o in OverridesParser.create().parse_overrides(params + list(config.hydra.overrides.task))
             if o.input_line is not None and o.is_sweep_override() and not _values(o)]  # (parsed: each has its line)
    return ", ".join(empty) or "its sweep"


def _values(override: Override) -> List[str]:
    try:
        return [str(v) for v in override.sweep_iterator()]
    except Exception:  # noqa: BLE001 - a sweep Hydra cannot enumerate (interval): not a grid's
        return ["?"]


def _repeats_said(config: DictConfig, plan: SweepPlan) -> List[str]:
    """One line per repeat: a value given more than once on one key (`train.seed=1 given twice:
    run once`), or configurations that differ as typed but not as composed."""
    said: List[str] = []
    if not any(j.repeat_of is not None for j in plan.jobs):
        return said
    params = [f"{k}={v}" for k, v in (config.hydra.sweeper.get("params") or {}).items()]
    for o in OverridesParser.create().parse_overrides(params + list(config.hydra.overrides.task)):
        if o.is_sweep_override():
            for value, n in Counter(o.sweep_string_iterator() if o.is_discrete_sweep() else []).items():
                if n > 1:
                    times = "twice" if n == 2 else f"{n} times"
                    said.append(f"{o.get_key_element()}={value} given {times}: run once")
    for job in plan.jobs:
        if job.idx in plan.baseline:  # (said by _baseline_said)
            continue
        if job.repeat_of is not None and job.overrides != plan.jobs[job.repeat_of].overrides:
            twin = plan.jobs[job.repeat_of].overrides
            theirs = [o for o in twin if o not in job.overrides]
            mine = [o for o in job.overrides if o not in twin]
            line = f"{' '.join(theirs)} and {' '.join(mine)} are one configuration: run once"
            if line not in said:
                said.append(line)
    return said


def _baseline_said(plan: SweepPlan) -> List[str]:
    """What sweep.repeats and sweep.baseline did, once (of the first round)."""
    said = []
    if plan.repeats > 1:
        said.append(f"each configuration {plan.repeats} times (seeds train.seed, +1, ...), interleaved: the whole "
                    f"list, then again, so host drift falls on all alike")
    for job in plan.jobs[:len(plan.jobs) // plan.repeats]:  # (the first round: the others repeat it)
        if job.idx not in plan.baseline or job.refusal or job.config is None:  # (a baseline's is kept: plan_sweep)
            continue
        shown = _technique_choices(job.config, plan.defaulted)
        if job.repeat_of is not None:
            twin = plan.jobs[job.repeat_of]
            if twin.idx in plan.baseline:
                continue
            line = (f"baseline: {' '.join(twin.overrides) or 'no override'} has the config groups' defaults; "
                    "the report's speed-ups are against it")
        else:
            line = (f"baseline added: the config groups' defaults ({shown}), which no configuration has; the report's "
                    "speed-ups are against it (sweep.baseline=false leaves it out)")
        if line not in said:
            said.append(line)
    return said


def _technique_choices(sweep_cfg: DictConfig, defaulted: Sequence[str] = ()) -> str:
    """`precision=fp32 attention=eager ... accumulation=1 optimizer.lr=5e-05 on model=tiny
    dataset=ag_news_sample hardware=auto num_gpus=1`: what the baseline trains, as the user would
    type it (defaulted: the swept settings it has at their defaults)."""
    from bertaccel.runs.sweep_jobs import CONTEXT_ROOTS, TECHNIQUE_ROOTS

    choices = sweep_cfg.hydra.runtime.choices

    def said(keys: Sequence[str]) -> List[str]:
        out = [f"{g}={choices[g]}" for g in keys if g in choices and g != "preset"]
        return out + [f"{k}={OmegaConf.select(sweep_cfg, k)}" for k in keys
                      if k not in choices and OmegaConf.select(sweep_cfg, k) is not None]
    return " ".join(said(TECHNIQUE_ROOTS) + said(defaulted)) + " on " + " ".join(said(CONTEXT_ROOTS))
