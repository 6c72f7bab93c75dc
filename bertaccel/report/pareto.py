"""The Pareto front over time, cost, energy (lower is better) and accuracy (higher is better):
the runs (or configurations) no other one beats on every objective at once.

No weights are needed for it: every weighted score's best (for any weights >= 0 on these
objectives) lies on it. A missing value is never guessed: an objective no point has is left
out of the comparison (said in the note), and a point missing an objective others have is left
off the front, with the reason, rather than compared on fewer objectives than the others.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Set, Tuple

# (column, direction): the thesis' T, C, E and the test accuracy.
OBJECTIVES: Tuple[Tuple[str, str], ...] = (("time_s", "min"), ("cost_usd", "min"), ("energy_kwh", "min"),
                                           ("accuracy", "max"))
TIME_ACCURACY = (("time_s", "min"), ("accuracy", "max"))
DOMINATORS_KEPT = 20     # Front.dominated_by keeps the first this many of a point's dominators (input order)
BLOCK_CELLS = 2_000_000  # comparisons held in memory at once


@dataclass
class Front:
    objectives: List[str]                                  # the objectives compared
    dropped: Dict[str, str] = field(default_factory=dict)  # objective -> why it was not compared
    on_front: List[int] = field(default_factory=list)      # point indices, in input order
    dominated_by: Dict[int, List[int]] = field(default_factory=dict)  # point -> the first points that beat it
    more_dominators: Set[int] = field(default_factory=set)           # points beaten by more than those
    left_out: Dict[int, str] = field(default_factory=dict)  # point -> why it was not compared


def _lower_is_better(value: Optional[float], direction: str) -> float:
    assert value is not None  # a complete point's: every objective used is set
    return value if direction == "min" else -value


def pareto(points: Sequence[Mapping[str, Optional[float]]], why_null: Sequence[Mapping[str, str]] = (),
           objectives: Sequence[Tuple[str, str]] = OBJECTIVES) -> Front:
    """points: one {column: value or None} per run or group; why_null: per point, why a
    column is None (shown in left_out). Two points with equal values are both on the front."""
    import numpy as np

    used = [(c, d) for c, d in objectives if any(p.get(c) is not None for p in points)]
    out = Front([c for c, _ in used], {c: "no point has it" for c, d in objectives if (c, d) not in used})
    if not used:
        return out
    complete = []
    for i, p in enumerate(points):
        missing = [c for c, _ in used if p.get(c) is None]
        if missing:
            reasons = why_null[i] if i < len(why_null) else {}
            out.left_out[i] = "; ".join(f"{c} null ({reasons.get(c, 'not measured')})" for c in missing)
        else:
            complete.append(i)
    if not complete:
        return out
    # Every objective as "lower is better", one row per complete point.
    x = np.array([[_lower_is_better(p[c], d) for c, d in used] for p in (points[i] for i in complete)])
    on = _front(x)
    out.on_front = [complete[k] for k in sorted(on)]
    # Each dominated point's first dominators in input order, for a block of points at once:
    # memory linear in the points, numpy's speed for the n x n comparisons.
    dominated = [k for k in range(len(complete)) if k not in on]
    cols = [np.ascontiguousarray(x[:, j]) for j in range(len(used))]
    block = max(1, BLOCK_CELLS // (len(complete) * len(used)))
    for at in range(0, len(dominated), block):
        ks = dominated[at:at + block]
        no_worse = np.ones((len(ks), len(complete)), dtype=bool)  # [k, a]: a is nowhere worse than k
        better = np.zeros_like(no_worse)                              # [k, a]: a is somewhere better
        for j in range(len(used)):  # (one objective at a time: numpy is slow along a short last axis)
            no_worse &= cols[j][None, :] <= cols[j][ks][:, None]
            better |= cols[j][None, :] < cols[j][ks][:, None]
        beats = no_worse & better
        if beats.sum(axis=1).max() > DOMINATORS_KEPT + 1:
            beats &= np.cumsum(beats, axis=1) <= DOMINATORS_KEPT + 1
        found: Dict[int, List[int]] = {}
        for row, a in zip(*np.nonzero(beats)):
            found.setdefault(ks[row], []).append(complete[a])
        for k in ks:
            out.dominated_by[complete[k]] = found[k][:DOMINATORS_KEPT]
            if len(found[k]) > DOMINATORS_KEPT:
                out.more_dominators.add(complete[k])
    return out


def _front(x) -> Set[int]:
    """Rows of x (lower is better on every column) that no row beats. In lexicographic order a
    row's dominators all come before it, and a dominated row is beaten by some row of the front,
    so each row is checked against the front found so far only: n x front, not n x n."""
    import numpy as np

    front = np.empty_like(x)
    kept: List[int] = []
    for k in sorted(range(len(x)), key=lambda k: tuple(x[k])):
        rows = front[:len(kept)]
        if kept and bool(((rows <= x[k]).all(axis=1) & (rows < x[k]).any(axis=1)).any()):
            continue
        front[len(kept)] = x[k]
        kept.append(k)
    return set(kept)


def row_points(rows: Sequence) -> Tuple[List[Dict[str, Optional[float]]], List[Dict[str, str]]]:
    """(points, why each null is null) of report rows."""
    cols = [c for c, _ in OBJECTIVES]
    return [{c: r.get(c) for c in cols} for r in rows], [dict(r.extra) for r in rows]
