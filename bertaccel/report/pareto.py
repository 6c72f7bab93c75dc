"""The Pareto front over time, cost, energy (lower is better) and accuracy (higher is better):
the runs (or configurations) no other one beats on every objective at once.

No weights are needed for it: every weighted score's best (for any weights >= 0 on these
objectives) lies on it. A missing value is never guessed: an objective no point has is left
out of the comparison (said in the note), and a point missing an objective others have is left
off the front, with the reason, rather than compared on fewer objectives than the others.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

# (column, direction): the thesis' T, C, E and the test accuracy.
OBJECTIVES: Tuple[Tuple[str, str], ...] = (("time_s", "min"), ("cost_usd", "min"), ("energy_kwh", "min"),
                                           ("accuracy", "max"))
TIME_ACCURACY = (("time_s", "min"), ("accuracy", "max"))


@dataclass
class Front:
    objectives: List[str]                                  # the objectives compared
    dropped: Dict[str, str] = field(default_factory=dict)  # objective -> why it was not compared
    on_front: List[int] = field(default_factory=list)      # point indices, in input order
    dominated_by: Dict[int, List[int]] = field(default_factory=dict)  # point -> points that beat it
    left_out: Dict[int, str] = field(default_factory=dict)  # point -> why it was not compared


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
    x = np.array([[p[c] if d == "min" else -p[c] for c, d in used] for p in (points[i] for i in complete)])
    no_worse = (x[:, None, :] <= x[None, :, :]).all(axis=2)   # [a, b]: a is nowhere worse than b
    better = (x[:, None, :] < x[None, :, :]).any(axis=2)      # [a, b]: a is somewhere better than b
    beats = no_worse & better
    for col, j in enumerate(complete):
        winners = [complete[a] for a in np.flatnonzero(beats[:, col])]
        if winners:
            out.dominated_by[j] = winners
        else:
            out.on_front.append(j)
    return out


def row_points(rows: Sequence) -> Tuple[List[Dict[str, Optional[float]]], List[Dict[str, str]]]:
    """(points, why each null is null) of report rows."""
    cols = [c for c, _ in OBJECTIVES]
    return [{c: r.get(c) for c in cols} for r in rows], [dict(r.extra) for r in rows]
