"""A grid sweep's jobs: the basic sweeper's cross product, plus the user's baseline and repeats
(issue 44). One home for the list: bertaccel's sweeper (hydra_plugins/bertaccel_sweeper)
launches it, the sweep's plan (runs/sweep_plan.py) composes and checks it, `bertaccel.plan`
expands it.

- **The baseline** (`sweep.baseline=true`, the default). Speed-ups mean something against what
  the user runs today: the config groups' defaults (options/baseline.py). For every context the
  sweep trains (model, dataset, hardware profile, num_gpus: options/baseline.py LIKE_FOR_LIKE)
  where no job has the defaults, it adds that configuration: each job with its technique choices
  (the groups precision, attention, encoder, compile, freezing, optimizer, preset and their
  settings; accumulation) and every other swept key (train.batch_size=8,32: the default batch;
  optimizer.lr=1e-4,2e-4: the default learning rate) taken off, the rest kept (model, dataset,
  train.epochs=1, ...). A job has the defaults when what its baseline takes off is at its
  default values (a swept learning rate too, not only the groups' choices). Added after the grid: where a grid job already
  is that configuration, the plan finds the same config_hash and the added job is not run; where
  it is new, it runs like any job (resumed, retried, failed with its reason). The report picks it
  as its baseline (report/baseline.py). `sweep.baseline=false` adds nothing.
- **Repeats** (`sweep.repeats=N`). Each configuration N times with seeds train.seed, +1, ...,
  interleaved: the whole list, then the whole list again (A B C D A B C D), never back to back,
  so drift on the host (clocks, other tenants, a warming room) falls on every configuration alike
  and not on one. The first round has no seed override: a sweep run before without repeats is its
  first round, resumed. Seeds differ per repeat, so the data order and the initialisation do too;
  the report groups runs that differ only in their seed (report/repeats.py).
"""
from __future__ import annotations

import decimal
import math
from dataclasses import dataclass, field, fields
from typing import Dict, List, Optional, Sequence, Set, Tuple

from hydra.core.override_parser.types import ChoiceSweep, Override, RangeSweep
from omegaconf import DictConfig, OmegaConf

from bertaccel.config import TECHNIQUE_GROUPS, ConfigError, SweepConfig, TrainConfig
from bertaccel.hydra_adapter import BasicSweeper
from bertaccel.options.baseline import LIKE_FOR_LIKE, defaults_wanted, on_defaults

# What the baseline takes off: the techniques a sweep compares (config groups and their settings),
# and keeps even where swept: one baseline per model, dataset, hardware profile and GPU count.
TECHNIQUE_ROOTS = TECHNIQUE_GROUPS + ("accumulation",)
CONTEXT_ROOTS = LIKE_FOR_LIKE
SEED = "train.seed"


class SweepJobsRefused(ValueError):
    """sweep.repeats or sweep.baseline cannot make a sweep of these overrides (the message says
    what to change); the sweep's plan turns it into its one-line refusal."""


@dataclass
class SweepJobs:
    overrides: List[List[str]]                       # in launch order
    baseline: Set[int] = field(default_factory=set)  # the indices of the added baseline jobs
    repeats: int = 1
    defaulted: List[str] = field(default_factory=list)  # settings, not group choices, a baseline takes off


def naming_keys(jobs: Sequence[Sequence[str]]) -> Set[str]:
    """The keys whose value (or presence) differs among these jobs' overrides: a run's name says
    them all, so no two configurations of a sweep share a name (an added baseline takes off a
    precision=bf16 every grid job has: precision then names the runs too)."""
    given = [{key_of(o): o.split("=", 1)[1] if "=" in o else "" for o in job} for job in jobs]
    keys = {k for job in given for k in job}
    return {k for k in keys if len({job.get(k) for job in given}) > 1}


def key_of(override: str) -> str:
    """`+optimizer.lr=1e-4` -> `optimizer.lr`; `model@x=y` -> `model`."""
    return override.split("=", 1)[0].lstrip("+~").split("@", 1)[0]


def _root(key: str) -> str:
    return key.replace("/", ".").split(".", 1)[0]


def _swept_keys(parsed: Sequence[Override]) -> Set[str]:
    """Keys given more than one value (`precision=fp16,fp32`); a one-value sweep fixes its key."""
    swept = set()
    for o in parsed:
        if o.is_sweep_override() and o.is_discrete_sweep() and len(set(o.sweep_string_iterator())) > 1:
            swept.add(key_of(o.get_key_element()))
    return swept


def baseline_of(job: Sequence[str], swept: Set[str]) -> List[str]:
    """The job with its techniques and other swept keys taken off: the defaults run of its model
    and dataset (and of its seed, where the user sweeps seeds)."""
    def kept(o: str) -> bool:
        key = key_of(o)
        root = _root(key)
        if root in TECHNIQUE_ROOTS:
            return False
        return key not in swept or root in CONTEXT_ROOTS or key == SEED or root == "hydra"
    return [o for o in job if kept(o)]


def _context(job: Sequence[str]) -> Tuple[str, ...]:
    return tuple(o for o in job if _root(key_of(o)) in CONTEXT_ROOTS)


def _with_seed(job: Sequence[str], seed: int) -> List[str]:
    return [o for o in job if key_of(o) != SEED] + [f"{SEED}={seed}"]


def _seed_of(job: Sequence[str], default: int) -> int:
    for o in job:
        if key_of(o) == SEED:
            return int(o.split("=", 1)[1])
    return default


def refuse_repeats_alone(cfg: DictConfig) -> None:
    """sweep.repeats on a single run (no -m): refused, not run once as if it were not there (asked
    of the config as composed, before it is typed: runs/launch.py)."""
    repeats = OmegaConf.select(cfg, "sweep.repeats", default=SweepConfig.repeats)
    if isinstance(repeats, int) and repeats > 1:
        raise ConfigError(f"sweep.repeats={repeats} needs -m (a sweep): a single run runs once; add -m to run "
                          f"it {repeats} times with seeds {SEED}, +1, ...")


def values_count(override: Override) -> Optional[int]:
    """How many values an override gives the grid, counted without listing them (range(0,10**9)
    is three numbers, not a billion strings); None for a sweep no grid enumerates (interval:
    the basic sweeper refuses it) or one Hydra cannot list (range with step 0: Hydra says it)."""
    if not override.is_sweep_override():
        return 1
    value = override.value()
    if isinstance(value, RangeSweep):
        if value.start is None or value.stop is None or not value.step:
            return None
        if isinstance(value.start, int) and isinstance(value.stop, int) and isinstance(value.step, int):
            return len(range(value.start, value.stop, value.step))
        start, stop, step = (decimal.Decimal(v) for v in (value.start, value.stop, value.step))
        return max(0, math.ceil((stop - start) / step))  # (as Hydra's FloatRange steps)
    if isinstance(value, ChoiceSweep):
        return len(value.list)
    if isinstance(value, list):
        return len(value)
    if override.is_discrete_sweep():  # a glob over a group's options: as many as the group has
        return sum(1 for _ in override.sweep_string_iterator())
    return None


def grid_axes(parsed: Sequence[Override]) -> Dict[str, int]:
    """Each key of the grid with its number of values, as the basic sweeper crosses them (a key
    given twice, in the params and on the command line, takes the later)."""
    axes: Dict[str, int] = {}
    for o in parsed:
        axes[o.get_key_element()] = values_count(o) or 1
    return axes


def refuse_oversized(config: DictConfig, parsed: Sequence[Override], repeats: int = 1) -> None:
    """Past sweep.max_runs runs (configurations x repeats), the one line that says so, before
    anything is listed: counted from the parsed overrides in constant time and memory."""
    axes = grid_axes(parsed)
    runs = math.prod(axes.values()) * repeats
    limit = (config.get("sweep") or {}).get("max_runs", SweepConfig.max_runs)
    if isinstance(limit, int) and runs <= limit:
        return
    said = [f"{key}: {n} values" for key, n in axes.items() if n > 1] or ["1 configuration"]
    said += [f"sweep.repeats={repeats}"] if repeats > 1 else []
    raise SweepJobsRefused(f"the sweep has {runs} runs ({' x '.join(said)}), more than "
                           f"sweep.max_runs={limit}: check the command for a typo, or raise the limit "
                           f"(sweep.max_runs={runs}) to run them all")


def _refuse_seeds(first_round: Sequence[Sequence[str]], default_seed: int, repeats: int) -> None:
    """The seeds the repeats derive (train.seed + 1 ... + repeats-1), checked against train.seed's
    range before the first run: past it, the last rounds would fail one by one after the first ran."""
    declared = next(f for f in fields(TrainConfig) if f.name == "seed").metadata["range"]
    top = max(_seed_of(job, default_seed) for job in first_round) + repeats - 1
    why = declared.refusal(SEED, top)
    if why:
        room = f"a {SEED} of at most {declared.le - repeats + 1}" if declared.le is not None else f"a smaller {SEED}"
        raise SweepJobsRefused(f"sweep.repeats={repeats} runs seeds {SEED}, +1, ... up to {top}, but {why}; "
                               f"give {room}, or fewer repeats")


def sweep_jobs(config: DictConfig, parsed: Sequence[Override]) -> SweepJobs:
    """config: the sweep's config (its `sweep` and `train.seed`); parsed: Hydra's parsed overrides,
    the sweeper's params first, as the basic sweeper reads them. Linear in the jobs."""
    # (the sweep block as composed, not typed yet: each value is checked where it is read)
    settings: Dict[str, object] = dict(config.get("sweep") or {})
    repeats = settings.get("repeats", SweepConfig.repeats)
    if not isinstance(repeats, int) or repeats < 1:
        raise SweepJobsRefused(f"sweep.repeats={repeats}: give the number of runs per configuration, 1 or more")
    refuse_oversized(config, parsed, repeats)  # (first: nothing below lists a sweep past the limit)
    (grid,) = BasicSweeper.split_arguments(list(parsed), None)
    jobs = [list(j) for j in grid]
    swept = _swept_keys(parsed)
    if repeats > 1 and SEED in swept:
        raise SweepJobsRefused(f"sweep.repeats={repeats} and a {SEED} sweep both set the seeds: give one of them "
                               f"(sweep.repeats=N runs seeds {SEED}, {SEED}+1, ...)")
    first_round = list(jobs)
    listed = {tuple(job) for job in jobs}  # (a set: the check below was a list scan per job)
    added: List[int] = []
    if settings.get("baseline", SweepConfig.baseline):
        # Per context (model, dataset, hardware, num_gpus): a job there on the defaults is the baseline.
        # (what a job's baseline takes off, at its defaults: a swept optimizer.lr too)
        wanted = defaults_wanted()  # (read once: per job it parsed conf/config.yaml twice, 40 s at 10,000 jobs)
        covered = {_context(job) for job in jobs if on_defaults(
            {key_of(o): o.split("=", 1)[1] for o in job if o not in set(baseline_of(job, swept))}, wanted)}
        for job in jobs:
            base = baseline_of(job, swept)
            if _context(job) not in covered and tuple(base) not in listed:
                added.append(len(first_round))
                first_round.append(base)
                listed.add(tuple(base))
    # (the settings a baseline takes off that are not a group's choice: the plan's line says their defaults)
    defaulted = sorted({key_of(o) for job in jobs for o in job if o not in set(baseline_of(job, swept))}
                       - set(TECHNIQUE_ROOTS)) if added else []
    out = SweepJobs(list(first_round), set(added), repeats, defaulted)
    default_seed = int(config.train.seed)
    if repeats > 1 and first_round:
        _refuse_seeds(first_round, default_seed, repeats)
    first_added = set(added)
    for r in range(1, repeats):
        for i, job in enumerate(first_round):
            if i in first_added:
                out.baseline.add(len(out.overrides))
            out.overrides.append(_with_seed(job, _seed_of(job, default_seed) + r))
    return out
