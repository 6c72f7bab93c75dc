"""Weight sensitivity (thesis Table 5.4 generalized from its seven strategies to all of them):
over the simplex of (w1, w2, w3, w4) in steps of 0.05, which configuration has the lowest score
where, and the share of weight space each one wins.

The grid is enumerated in whole twentieths (a + b + c + d = 20, w = (a, b, c, d) / 20) so that
no point is lost or doubled to float drift: C(23, 3) = 1771 points. Every score is
scoring.score, the report's own (missing metrics renormalized, never taken as 0), over the
max-normalized table of all runs; a configuration of several runs scores the mean of its runs.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .scoring import METRICS, SIGNS

STEPS = 20            # 1 / 0.05
# Scores this close count as equal: the same score reached through different float sums
# (e.g. 0.5 w1 + w2 vs w1 + w2 - 0.5 w4 at w1 = w4) differs by ~1e-16, not by a real margin.
TIE_TOLERANCE = 1e-9
POINTS_AT_ONCE = 128  # weight points scored together (memory: this x the runs)


def simplex_grid(steps: int = STEPS, k: int = 4) -> List[Tuple[int, ...]]:
    """Every (a, b, c, d) of whole numbers >= 0 with sum `steps` (stars and bars: each choice of
    k - 1 bar positions among steps + k - 1 slots is one point), in lexicographic order."""
    points = []
    for bars in itertools.combinations(range(steps + k - 1), k - 1):
        edges = (-1,) + bars + (steps + k - 1,)
        points.append(tuple(edges[i + 1] - edges[i] - 1 for i in range(k)))
    return sorted(points, reverse=True)


@dataclass
class WeightMap:
    labels: List[str]                                     # the candidates (configurations or runs)
    points: List[Tuple[int, ...]]                         # in twentieths
    winners: List[Tuple[int, ...]]                        # per point: the candidates with the lowest score
    won: Dict[int, int] = field(default_factory=dict)     # candidate -> points it wins alone
    ties: Dict[Tuple[int, ...], int] = field(default_factory=dict)  # tied candidates -> points
    unscored: int = 0                                     # points where no candidate has a score
    left_out: Dict[int, str] = field(default_factory=dict)  # candidate -> why it does not compete

    def share(self, count: int) -> float:
        return count / len(self.points)

    def centroid(self, candidate: int) -> Optional[Tuple[float, ...]]:
        """Mean weights of the points a candidate wins alone: where its region lies."""
        mine = [p for p, w in zip(self.points, self.winners) if w == (candidate,)]
        if not mine:
            return None
        return tuple(sum(p[j] for p in mine) / len(mine) / STEPS for j in range(4))


def weight_map(normalized: Sequence[Mapping[str, Optional[float]]], members: Sequence[Sequence[int]],
               labels: Sequence[str], left_out: Optional[Mapping[int, str]] = None, steps: int = STEPS) -> WeightMap:
    """normalized: scoring.Scored.normalized (one per run); members: the run indices of each
    candidate; left_out: candidate -> why it may not win (accuracy floor, no T, ...)."""
    import numpy as np

    left_out = dict(left_out or {})
    points = simplex_grid(steps)
    competing = [k for k in range(len(members)) if k not in left_out and members[k]]
    table = np.full((len(points), len(members)), np.nan)
    if competing:
        order = [i for k in competing for i in members[k]]
        starts = np.cumsum([0] + [len(members[k]) for k in competing[:-1]])
        sizes = np.array([len(members[k]) for k in competing], dtype=float)
        weights = np.array(points, dtype=float) / steps
        for at in range(0, len(points), POINTS_AT_ONCE):
            runs = run_scores(normalized, order, weights[at:at + POINTS_AT_ONCE])
            # A configuration one of whose runs has no score here has none (nan): no mean of a part.
            table[at:at + POINTS_AT_ONCE, competing] = np.add.reduceat(runs, starts, axis=1) / sizes
    out = WeightMap(list(labels), points, [], left_out=left_out)
    for row in table:
        if np.isnan(row).all():
            out.winners.append(())
            out.unscored += 1
            continue
        best = np.nanmin(row)
        win = tuple(int(k) for k in np.flatnonzero(np.abs(row - best) <= TIE_TOLERANCE * max(1.0, abs(best))))
        out.winners.append(win)
        if len(win) == 1:
            out.won[win[0]] = out.won.get(win[0], 0) + 1
        else:
            out.ties[win] = out.ties.get(win, 0) + 1
    return out


def run_scores(normalized: Sequence[Mapping[str, Optional[float]]], runs: Sequence[int], weights) -> "Any":
    """scoring.score of each run (columns) at each weight point (rows of four weights), nan where a
    run has none, at once with numpy: 1771 points x 10,000 runs in a second rather than minutes
    of calls. The same rule: a run missing a weighted metric is scored over those it has, their
    weights scaled up to the strategy's absolute sum."""
    import numpy as np

    values = np.array([[np.nan if normalized[i].get(m) is None else normalized[i][m] for m in METRICS[:4]]
                       for i in runs], dtype=float).reshape(-1, 4)
    present = ~np.isnan(values)
    total = np.abs(weights).sum(axis=1)[:, None]
    have = np.abs(weights) @ present.T
    missing = (weights > 0).astype(float) @ (~present).T > 0
    raw = (weights * np.array(SIGNS[:4])) @ np.where(present, values, 0.0).T
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(missing, total / have, 1.0)
        return np.where(have == 0, np.nan, scale * raw)
