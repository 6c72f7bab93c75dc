"""Repeats (thesis section 5.5: the same configuration gives different accuracy run to run):
runs that differ only in their seed form a group; each metric and each strategy's score is
given per group as a mean with a 95% t-interval, and verdict.py calls a winner tied when its
interval overlaps another's.

Scores are computed per run first (max-normalized over all runs, as the thesis does:
scoring.score_rows), then averaged per group: the normalization never mixes groups and runs.
"""
from __future__ import annotations

import functools
import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from .scoring import Row, Scored

LEVEL = 0.95
# The columns summarized per group; occupancy_pct is whatever plays O (--occupancy-metric).
GROUP_METRICS = ("time_s", "cost_usd", "energy_kwh", "occupancy_pct", "accuracy")
_SEED_ITEM = re.compile(r"(^|,)train\.seed=[^,]*")


@dataclass(frozen=True)
class Interval:
    """A mean over n values and its two-sided t-interval; null parts say why."""
    n: int
    mean: Optional[float]
    low: Optional[float] = None
    high: Optional[float] = None
    why: str = ""           # why low/high (or the mean) are null

    def overlaps(self, other: "Interval") -> Optional[bool]:
        """Whether the two intervals share a point; None when either has none."""
        low, high, other_low, other_high = self.low, self.high, other.low, other.high
        if low is None or high is None or other_low is None or other_high is None:
            return None
        return low <= other_high and other_low <= high


def t_interval(values: Sequence[float], level: float = LEVEL) -> Interval:
    """Mean and Student-t interval, mean ± t(level, n-1) x s / sqrt(n) with s the sample
    standard deviation (n - 1 in the denominator): the t rather than the normal quantile, since
    repeats are few (2-5) and the spread is estimated from them."""
    n = len(values)
    if n == 0:
        return Interval(0, None, why="no run has it")
    if n == 1:  # (the common case of a big sweep without repeats: no numpy call per run)
        return Interval(1, float(values[0]), why="one run")
    import numpy as np

    mean = float(np.mean(values))
    half = float(_t_quantile(0.5 + level / 2, n - 1) * np.std(values, ddof=1) / math.sqrt(n))
    return Interval(n, mean, mean - half, mean + half)


@functools.lru_cache(maxsize=256)
def _t_quantile(q: float, dof: int) -> float:
    """Student's t quantile; scipy's ppf costs ~50 us a call, and a report asks for few distinct ones."""
    from scipy import stats

    return float(stats.t.ppf(q, dof))


@dataclass
class Group:
    key: str
    label: str
    members: List[int]          # row indices
    seeds: List[str]


def run_label(r: Row, repeated: bool) -> str:
    """A single run's name in a table of runs: with repeats its label with its seed, since the
    label alone names its configuration's every run ('fp32 / triton (seed 43)')."""
    return f"{r.name} (seed {r.seed})" if repeated and r.seed else r.name


def group_label(names: Sequence[str]) -> str:
    """The runs' common name without its train.seed=N item (a sweep's run names are its swept
    overrides), e.g. 'accumulation=2,train.seed=1' -> 'accumulation=2'."""
    stripped = [_SEED_ITEM.sub("", n).strip(",") or "defaults" for n in names]
    return stripped[0] if len(set(stripped)) == 1 else f"{stripped[0]} (+{len(set(stripped)) - 1} other names)"


def group_rows(rows: Sequence[Row]) -> List[Group]:
    """Rows with the same group key (else the same name) are one group, in order of first row."""
    by_key: Dict[str, Group] = {}
    for i, r in enumerate(rows):
        key = r.group or f"name:{r.name}"
        g = by_key.setdefault(key, Group(key, "", [], []))
        g.members.append(i)
        g.seeds.append(r.seed or "?")
    groups = list(by_key.values())
    for g in groups:
        first = rows[g.members[0]]
        # A CSV's group column names its configuration; MLflow's group is a hash: its run names do.
        g.label = first.group if first.group and not first.run_id else group_label([rows[i].name for i in g.members])
    labels = Counter(g.label for g in groups)
    for g in groups:  # two configurations with one name (e.g. 'defaults' runs of two commits)
        if labels[g.label] > 1:
            g.label = f"{g.label} [{g.key.split(':')[-1][:8]}]"
    return groups


@dataclass
class RepeatStats:
    """The configurations and their means with intervals; which one wins is verdict.py's."""
    groups: List[Group]
    metrics: Dict[str, List[Interval]]              # column -> one interval per group
    scores: Dict[str, List[Interval]]               # strategy -> one interval per group

    @functools.cached_property
    def repeated(self) -> bool:
        # Cached: the tables ask once per row, and a pass over every configuration each time was
        # quadratic (a 10,000-row CSV: 0.9 billion steps, 5 minutes of its report). The groups are
        # whole once repeat_stats returns them.
        return any(len(g.members) > 1 for g in self.groups)


def repeat_stats(rows: Sequence[Row], scored: Scored) -> RepeatStats:
    groups = group_rows(rows)
    metrics = {m: [t_interval([v for v in (rows[i].get(m) for i in g.members) if v is not None]) for g in groups]
               for m in GROUP_METRICS}
    scores = {s: [t_interval([x for x in (v[i] for i in g.members) if x is not None]) for g in groups]
              for s, v in scored.scores.items()}
    return RepeatStats(groups, metrics, scores)
