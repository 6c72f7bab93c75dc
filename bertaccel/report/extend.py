"""Adds to a built report what says how sure it is: repeats with intervals and ties, the Pareto
front, the best run per hardware, the weight-space shares, the time to a target accuracy and
the O in use; returns the lines the console prints about them."""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence

from .figures import all_figures
from .occupancy import o_note
from .pareto import pareto, row_points
from .render import Report
from .repeats import repeat_stats
from .scoring import Row, Scored
from .sections import all_tables, best_tie_lines, notes
from .target import reach
from .weights import weight_map


def extend(rep: Report, rows: Sequence[Row], scored: Scored, measured: Sequence[Row], o_choice: str,
           o_label: str, target: Optional[float], lab: Callable[[str], str]) -> List[str]:
    """rows: the scored rows; measured: as loaded (their per-epoch accuracy and windows)."""
    st = repeat_stats(rows, scored)
    wm = weight_map(scored.normalized, [g.members for g in st.groups], [g.label for g in st.groups],
                    st.ineligible_reason)
    reaches = [reach(r, target) for r in measured] if target is not None else None
    rep.notes.extend(notes(o_note(o_choice), st))
    rep.tables.extend(all_tables(rows, scored, st, wm, lab, o_label, measured, reaches, target))
    points, why = row_points(rows)
    rep.plots.extend(all_figures(rows, pareto(points, why), wm, measured, target))
    # Strategies with the same tie share one line (as the best lines do when they rank alike).
    by_tie: dict = {}
    for s, who in best_tie_lines(st).items():
        by_tie.setdefault(who, []).append(s)
    lines = [f"{(f'all {len(ss)} strategies' if len(ss) == len(st.best) else ', '.join(ss)):18s} tied: {who} "
             "(95% intervals overlap)" for who, ss in by_tie.items()]
    if reaches is not None:
        got = sum(1 for x in reaches if x.reached)
        lines.append(f"target accuracy {target}: reached by {got} of {len(reaches)} runs")
    return lines
