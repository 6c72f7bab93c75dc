"""The order of the report's sections, which are open, and where each figure sits.

A report of 72 runs has some 17 sections; a reader needs the first two. So: the answer
(summary.py) leads, then the effect of each axis and the notes on the data, all open; every other
section follows closed (a fold the table of contents opens), in this order: the configuration
tables (best per strategy, scores, repeats, Pareto front), the thesis' run-level tables, the other
analyses; then the appendix: with repeats, every table of single runs (each run named with its
seed), then the runs' MLflow names (labels.py) and what bertaccel.plan predicted (predicted.py).
Each figure goes under the first table whose title starts with the figure's "section" (set where
the figure is made), so a plot is read beside what it shows."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple

from .effects import TITLE as EFFECTS_TITLE
from .labels import TITLE as LABELS_TITLE
from .predicted import APPENDIX
from .scores_tables import BEST, RUN_SCORES, SCORES
from .summary import TITLE as ANSWER_TITLE

Table = tuple  # (title, note, headers, rows of cells), as render.py
# Title starts of the open tables that lead, in this order.
LEADING = (ANSWER_TITLE, EFFECTS_TITLE)
# Title starts of the closed tables right after them, in this order (the decision's detail).
DETAIL = (BEST, SCORES, "Scores (thesis", "Repeats:", "Pareto front over time, cost, energy and accuracy (config")
# Tables of single runs: in the appendix where the runs are repeats of configurations.
PER_RUN = (RUN_SCORES, "Raw metrics", "Max-normalized", "Rows scored over fewer metrics",
           "Pareto front over time, cost, energy and accuracy (runs)", "Time to accuracy", "Projection to")
# Title starts of the tables at the very end, in this order.
TRAILING = (LABELS_TITLE, APPENDIX)
APPENDIX_TITLE = "Appendix: the single runs"


@dataclass
class Section:
    table: Table
    plots: List[Dict] = field(default_factory=list)
    open: bool = False          # shown open (the answer, the effects); else a fold
    appendix: bool = False      # after the appendix heading

    @property
    def title(self) -> str:
        return str(self.table[0])


def _starts(title: str, starts: Sequence[str]) -> int:
    return next((k for k, s in enumerate(starts) if title.startswith(s)), -1)


def _rank(title: str, repeated: bool) -> Tuple[int, int]:
    """(band, place in band): leading, detail, the rest, the single runs, the trailing tables."""
    for band, starts in ((0, LEADING), (1, DETAIL)):
        k = _starts(title, starts)
        if k >= 0:
            return band, k
    k = _starts(title, TRAILING)
    if k >= 0:
        return 4, k
    k = _starts(title, PER_RUN)
    if k >= 0 and repeated and "per configuration" not in title:
        return 3, k
    return 2, 0


def placed(tables: Sequence[Table], plots: Sequence[Dict], repeated: bool = False) -> Tuple[List[Section], List[Dict]]:
    """([sections] in the report's order, figures no table claims). A stable sort: tables of one
    place keep the order they were added in. repeated: the runs are repeats (per-run tables go to
    the appendix)."""
    ordered = sorted(tables, key=lambda t: _rank(str(t[0]), repeated))
    left = list(plots)
    out = []
    for t in ordered:
        mine = [p for p in left if p.get("section") and str(t[0]).startswith(p["section"])]
        left = [p for p in left if p not in mine]
        band = _rank(str(t[0]), repeated)[0]
        out.append(Section(t, mine, open=band == 0, appendix=band >= 3))
    return out, left


def anchor(title: str, k: int) -> str:
    """The section's id in the HTML (and the Markdown heading's anchor is made from its title)."""
    return "answer" if title == ANSWER_TITLE else f"section-{k}"
