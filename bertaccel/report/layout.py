"""The order of the report's sections and where each figure sits. The answer (summary.py) leads,
the Pareto front follows it (the trade-off behind the answer), then the thesis' tables in the
order they were added, then the appendix: the table of the runs' MLflow names (labels.py) and what
bertaccel.plan predicted against what was measured (predicted.py), last; each figure goes under the first table whose title starts with the
figure's "section" (set where the figure is made), so a plot is read beside what it shows."""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from .effects import TITLE as EFFECTS_TITLE
from .labels import TITLE as LABELS_TITLE
from .predicted import APPENDIX
from .summary import TITLE as ANSWER_TITLE

Table = tuple  # (title, note, headers, rows of cells), as render.py
# Title starts of the tables that come right after the answer, in this order.
LEADING = (ANSWER_TITLE, EFFECTS_TITLE, "Pareto front over")
# Title starts of the tables at the end, in this order (after every other table).
TRAILING = (LABELS_TITLE, APPENDIX)


def _rank(title: str) -> int:
    for k, start in enumerate(LEADING):
        if title.startswith(start):
            return k
    for k, start in enumerate(TRAILING):
        if title.startswith(start):
            return len(LEADING) + 1 + k
    return len(LEADING)


def placed(tables: Sequence[Table], plots: Sequence[Dict]) -> Tuple[List[Tuple[Table, List[Dict]]], List[Dict]]:
    """([(table, its figures)] in the report's order, figures no table claims). A stable sort: tables
    of one rank keep the order they were added in."""
    ordered = sorted(tables, key=lambda t: _rank(t[0]))
    left = list(plots)
    out = []
    for t in ordered:
        mine = [p for p in left if p.get("section") and t[0].startswith(p["section"])]
        left = [p for p in left if p not in mine]
        out.append((t, mine))
    return out, left
