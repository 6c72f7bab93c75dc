"""Adds to a built report what says how sure it is: repeats with intervals and ties, the Pareto
front, the best run per hardware, the weight-space shares, the time to a target accuracy and
the O in use; returns the lines the console prints about them."""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence

from .figures import all_figures
from .occupancy import o_note
from .pareto import pareto, row_points
from .render import Report
from .scoring import Row, Scored
from .verdict import Verdict
from .sections import all_tables, notes
from .target import reach
from .weights import weight_map


def extend(rep: Report, rows: Sequence[Row], scored: Scored, v: Verdict, measured: Sequence[Row], o_choice: str,
           o_label: str, target: Optional[float], lab: Callable[[str], str]) -> List[str]:
    """rows: the scored rows; v: the verdict the answer rendered; measured: as loaded (their
    per-epoch accuracy and windows). Returns the console's lines about what was added."""
    st = v.stats
    wm = weight_map(scored.normalized, [g.members for g in st.groups], [g.label for g in st.groups], v.why_out)
    reaches = [reach(r, target) for r in measured] if target is not None else None
    rep.notes.extend(notes(o_note(o_choice), st))
    rep.tables.extend(all_tables(rows, v, wm, lab, o_label, measured, reaches, target))
    points, why = row_points(rows)
    rep.plots.extend(all_figures(rows, pareto(points, why), wm, measured, target))
    lines = []
    if reaches is not None:
        got = sum(1 for x in reaches if x.reached)
        lines.append(f"target accuracy {target}: reached by {got} of {len(reaches)} runs")
    return lines
