"""Thesis Figure 4.12-style scatter plots: one point per run, colour = hardware, marker = precision."""
from __future__ import annotations

import io
import math
import textwrap
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .scoring import Row
from .svg import mark_id, png_and_svg
from .timing import Basis

MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
MARKER_AREA = 60       # points^2, as matplotlib's scatter `s`
LABEL_FONT = 7
MERGE_PX = 3.0         # points closer than this on the canvas share one label ("2,5")
# Where a label may go, in points from its point, nearest first: the eight directions at three
# distances; a label takes the first place where it covers no other label, no marker, not the
# legend, and stays inside the axes.
LABEL_PLACES = tuple((d * dx, d * dy) for d in (5, 11, 18)
                     for dx, dy in ((1, 1), (1, -1), (-1, 1), (-1, -1), (1, 0), (-1, 0), (0, 1), (0, -1)))
PLOTS = [  # (file stem, x, y, x label, y label, title)
    ("time_vs_cost", "time_s", "cost_usd", "train time (s)", "cost (USD)", "Time vs cost"),
    ("time_vs_energy", "time_s", "energy_kwh", "train time (s)", "energy (kWh)",
     "Time vs energy (slope = average power)"),
    ("cost_vs_accuracy", "cost_usd", "accuracy", "cost (USD)", "test accuracy", "Cost vs accuracy"),
]
# Drawn when a run has co2e_kg (carbon.py), so a store or CSV without carbon gets no empty plot.
CARBON_PLOT = ("co2e_vs_accuracy", "co2e_kg", "accuracy", "CO2e (kg)", "test accuracy",
               "Carbon vs accuracy (CO2e = energy x PUE x grid intensity)")


# Plots that show nothing new when every run's cost is its time at one price (cost_usd / time_s
# the same for all: one hardware profile's price): time vs cost is a straight line, and cost vs
# accuracy is the Pareto plot's time vs accuracy with another scale.
REPEAT_TIME = ("time_vs_cost", "cost_vs_accuracy")
SAME_RATE = 1e-6  # relative: rates this close are one price (cost is logged as time x price, rounded)


def single_price(rows: Sequence[Row]) -> Optional[float]:
    """The one price per second, USD, when every run with a time and a cost has it (at least two
    runs), else None."""
    rates = [r.cost_usd / r.time_s for r in rows if r.cost_usd is not None and r.time_s]
    if len(rates) < 2 or max(rates) - min(rates) > SAME_RATE * max(abs(max(rates)), 1e-30):
        return None
    return rates[0]


TIP_COLUMNS = (("time_s", ".2f"), ("cost_usd", ".4g"), ("energy_kwh", ".5f"), ("accuracy", ".4f"))


def run_tooltip(i: int, r: Row, label: Any = Basis().label) -> str:
    """What hovering a run's mark shows: its '#', name (a sweep's names are its overrides), what ran
    it and its scored values (null, never 0, for one not measured)."""
    values = [f"{label(c)}: " + ("null" if r.get(c) is None else format(r.get(c), spec)) for c, spec in TIP_COLUMNS]
    return "\n".join([f"#{i} {r.name}", f"{r.hardware or 'unknown'}, {r.precision or 'unknown'}"] + values)


def scatter_figure(rows: Sequence[Row], x: str, y: str, xlabel: str, ylabel: str, title: str,
                   stem: str = "") -> Tuple[Any, int]:
    """(matplotlib figure, points drawn); the caller closes the figure. Rows missing x or y are left out.
    stem: when given, each point's gid is svg.mark_id(stem, row number), for its tooltip."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hardware = sorted({r.hardware or "unknown" for r in rows})
    precisions = sorted({r.precision or "unknown" for r in rows})
    colours = {h: plt.get_cmap("tab10")(i % 10) for i, h in enumerate(hardware)}
    markers = {p: MARKERS[i % len(MARKERS)] for i, p in enumerate(precisions)}
    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=110)
    points: List[Tuple[int, float, float]] = []  # (row number, x, y) of the runs drawn
    seen = set()
    for i, r in enumerate(rows):
        xv, yv = r.get(x), r.get(y)
        if xv is None or yv is None:
            continue
        h, p = r.hardware or "unknown", r.precision or "unknown"
        label = f"{h}, {p}" if (h, p) not in seen else None
        seen.add((h, p))
        mark = ax.scatter([xv], [yv], color=colours[h], marker=markers[p], s=MARKER_AREA, label=label,
                          edgecolors="black", linewidths=0.5)
        if stem:
            mark.set_gid(mark_id(stem, i))
        points.append((i, xv, yv))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(textwrap.fill(title if points else f"{title}: no run has both values", 60))  # long basis notes
    ax.grid(True, alpha=0.3)
    if points:
        legend_args = dict(fontsize=7, title="hardware, precision", title_fontsize=7)
        ax.legend(**legend_args)
        fig.tight_layout()
        fig.canvas.draw()  # final limits and layout: labels are placed on the canvas as it will be saved
        # "best" would move the legend again once the labels are there: kept where it was put.
        box = ax.get_legend().get_window_extent().transformed(ax.transAxes.inverted())
        ax.legend(loc=(box.x0, box.y0), **legend_args)
        place_labels(fig, ax, points)
    else:
        fig.tight_layout()
    return fig, len(points)


def place_labels(fig, ax, points: Sequence[Tuple[int, float, float]]) -> list:
    """Each point's row number (the '#' of the report's tables; run names are too long to print)
    beside it. Points that coincide on the canvas share one label, "2,5"; every label takes the
    first of LABEL_PLACES where it covers nothing (see there), else the first place: in a cloud
    too dense for that the tables still give every row. Returns the labels."""
    from matplotlib.transforms import Bbox

    renderer = fig.canvas.get_renderer()
    groups: List[Tuple[Tuple[float, float], Tuple[float, float], List[int]]] = []  # (pixel, data xy, rows)
    for i, xv, yv in points:
        px, py = ax.transData.transform((xv, yv))
        for (gx, gy), _, rows in groups:
            if abs(gx - px) <= MERGE_PX and abs(gy - py) <= MERGE_PX:
                rows.append(i)
                break
        else:
            groups.append(((px, py), (xv, yv), [i]))
    r = math.sqrt(MARKER_AREA) / 2 * fig.dpi / 72  # a marker's half width in pixels
    taken = [Bbox.from_extents(px - r, py - r, px + r, py + r) for (px, py), _, _ in groups]
    legend = ax.get_legend()
    if legend is not None:
        taken.append(legend.get_window_extent(renderer))
    inside = ax.get_window_extent(renderer)
    labels = []
    for _, xy, rows in groups:
        text = ",".join(str(i) for i in rows)
        chosen = None
        for dx, dy in LABEL_PLACES:
            label = ax.annotate(text, xy, xytext=(dx, dy), textcoords="offset points", fontsize=LABEL_FONT,
                                ha="left" if dx > 0 else "right" if dx < 0 else "center",
                                va="bottom" if dy > 0 else "top" if dy < 0 else "center")
            box = label.get_window_extent(renderer)
            fits = (inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1
                    and not any(box.overlaps(t) for t in taken))
            if fits or chosen is None:
                if chosen is not None:
                    chosen[0].remove()
                chosen = (label, box)
                if fits:
                    break
            else:
                label.remove()
        taken.append(chosen[1])
        labels.append(chosen[0])
    return labels


def scatter_png(rows: Sequence[Row], x: str, y: str, xlabel: str, ylabel: str, title: str) -> Tuple[bytes, int]:
    """(PNG bytes, points drawn). Rows missing x or y are left out (and counted by the caller)."""
    import matplotlib.pyplot as plt

    fig, drawn = scatter_figure(rows, x, y, xlabel, ylabel, title)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue(), drawn


def all_plots(rows: Sequence[Row], basis: Optional[Basis] = None) -> List[Dict]:
    """basis: what time, cost and energy are (--time, --project-epochs); it relabels the axes."""
    basis = basis or Basis()
    out = []
    carbon = [CARBON_PLOT] if any(r.co2e_kg is not None for r in rows) else []
    repeats = REPEAT_TIME if single_price(rows) is not None else ()  # (render.build says so in a note)
    for stem, x, y, xl, yl, title in PLOTS + carbon:
        if stem in repeats:
            continue
        xl, yl = (basis.label(c) if basis.label(c) != c else default for c, default in ((x, xl), (y, yl)))
        if basis.title_suffix:
            title = f"{title} ({basis.title_suffix})"
        fig, drawn = scatter_figure(rows, x, y, xl, yl, title, stem)
        tips = {mark_id(stem, i): run_tooltip(i, r, basis.label) for i, r in enumerate(rows)}
        png, svg = png_and_svg(fig, tips, stem)
        out.append({"stem": stem, "title": title, "png": png, "svg": svg, "drawn": drawn, "left_out": len(rows) - drawn,
                    "section": "Raw metrics"})  # the raw table's '#' labels their points
    return out
