"""Thesis Figure 4.12-style scatter plots: one point per run, colour = hardware, marker = precision."""
from __future__ import annotations

import io
import textwrap
from typing import Dict, List, Optional, Sequence, Tuple

from .scoring import Row
from .timing import Basis

MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
PLOTS = [  # (file stem, x, y, x label, y label, title)
    ("time_vs_cost", "time_s", "cost_usd", "train time (s)", "cost (USD)", "Time vs cost"),
    ("time_vs_energy", "time_s", "energy_kwh", "train time (s)", "energy (kWh)",
     "Time vs energy (slope = average power)"),
    ("cost_vs_accuracy", "cost_usd", "accuracy", "cost (USD)", "test accuracy", "Cost vs accuracy"),
]


def scatter_png(rows: Sequence[Row], x: str, y: str, xlabel: str, ylabel: str, title: str) -> Tuple[bytes, int]:
    """(PNG bytes, points drawn). Rows missing x or y are left out (and counted by the caller)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hardware = sorted({r.hardware or "unknown" for r in rows})
    precisions = sorted({r.precision or "unknown" for r in rows})
    colours = {h: plt.get_cmap("tab10")(i % 10) for i, h in enumerate(hardware)}
    markers = {p: MARKERS[i % len(MARKERS)] for i, p in enumerate(precisions)}
    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=110)
    drawn = 0
    seen = set()
    for i, r in enumerate(rows):
        xv, yv = r.get(x), r.get(y)
        if xv is None or yv is None:
            continue
        h, p = r.hardware or "unknown", r.precision or "unknown"
        label = f"{h}, {p}" if (h, p) not in seen else None
        seen.add((h, p))
        ax.scatter([xv], [yv], color=colours[h], marker=markers[p], s=60, label=label, edgecolors="black",
                   linewidths=0.5)
        # The row number of the report's tables: run names are too long to print beside points.
        ax.annotate(str(i), (xv, yv), fontsize=7, xytext=(3, 3), textcoords="offset points")
        drawn += 1
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(textwrap.fill(title if drawn else f"{title}: no run has both values", 60))  # long basis notes
    ax.grid(True, alpha=0.3)
    if drawn:
        ax.legend(fontsize=7, title="hardware, precision", title_fontsize=7)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue(), drawn


def all_plots(rows: Sequence[Row], basis: Optional[Basis] = None) -> List[Dict]:
    """basis: what time, cost and energy are (--time, --project-epochs); it relabels the axes."""
    basis = basis or Basis()
    out = []
    for stem, x, y, xl, yl, title in PLOTS:
        xl, yl = (basis.label(c) if basis.label(c) != c else default for c, default in ((x, xl), (y, yl)))
        if basis.title_suffix:
            title = f"{title} ({basis.title_suffix})"
        png, drawn = scatter_png(rows, x, y, xl, yl, title)
        out.append({"stem": stem, "title": title, "png": png, "drawn": drawn, "left_out": len(rows) - drawn})
    return out
