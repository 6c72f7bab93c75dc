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
# Past this many labels a plot labels only the notable points (the winners, the baseline, its own
# front) and evenly spread others, this many in all: a label takes a text layout and a search for
# room, and hundreds of overlapping numbers say nothing the raw table does not.
LABEL_ALL_MAX = 60
LABEL_OTHERS = 10      # past LABEL_ALL_MAX: labels of points that are neither notable nor on the front
EACH_MARK_MAX = 500    # points up to which each is a mark of its own, with its own tooltip
BULK_AREA = 12         # marker area of the points past EACH_MARK_MAX that are not labelled
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
                   stem: str = "", notable: Sequence[int] = ()) -> Tuple[Any, int]:
    """(matplotlib figure, points drawn); the caller closes the figure. Rows missing x or y are left out.
    stem: when given, each point's gid is svg.mark_id(stem, row number), for its tooltip.
    notable: rows labelled first when there are too many points to label all (the winners, the
    baseline); the plot's own front (lower x, better y) comes next (see thin_labels)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hardware = sorted({r.hardware or "unknown" for r in rows})
    precisions = sorted({r.precision or "unknown" for r in rows})
    colours = {h: plt.get_cmap("tab10")(i % 10) for i, h in enumerate(hardware)}
    markers = {p: MARKERS[i % len(MARKERS)] for i, p in enumerate(precisions)}
    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=110)
    points: List[Tuple[int, float, float]] = []  # (row number, x, y) of the runs drawn
    for i, r in enumerate(rows):
        xv, yv = r.get(x), r.get(y)
        if xv is not None and yv is not None:
            points.append((i, xv, yv))
    first = list(notable) + front_2d(points, y == "accuracy")
    # A mark per point (its own tooltip) costs milliseconds each: past EACH_MARK_MAX points, the
    # points of one style are one mark, and only the labelled ones keep a mark and tooltip of their own.
    own = {i for i, _, _ in points} if len(points) <= EACH_MARK_MAX else set(first[:LABEL_ALL_MAX])
    seen = set()
    styles: Dict[Tuple[str, str], List[Tuple[float, float]]] = {}
    for i, xv, yv in points:
        r = rows[i]
        h, p = r.hardware or "unknown", r.precision or "unknown"
        if i not in own:
            styles.setdefault((h, p), []).append((xv, yv))
            continue
        label = f"{h}, {p}" if (h, p) not in seen else None
        seen.add((h, p))
        mark = ax.scatter([xv], [yv], color=colours[h], marker=markers[p], s=MARKER_AREA, label=label,
                          edgecolors="black", linewidths=0.5)
        if stem:
            mark.set_gid(mark_id(stem, i))
    for (h, p), xy in styles.items():
        # Smaller and see-through, so a cloud of thousands still shows where it is dense; in the
        # SVG one image, not an element per point.
        ax.scatter([v for v, _ in xy], [v for _, v in xy], color=colours[h], marker=markers[p], s=BULK_AREA,
                   alpha=0.5, label=f"{h}, {p}" if (h, p) not in seen else None, linewidths=0, rasterized=True)
        seen.add((h, p))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    thinned = "" if len(points) <= LABEL_ALL_MAX else (
        f" ({len(points)} points; labelled: the winners, the baseline, the front and a few others)")
    ax.set_title(textwrap.fill((title + thinned) if points else f"{title}: no run has both values", 60))
    ax.grid(True, alpha=0.3)
    if points:
        legend_args = dict(fontsize=7, title="hardware, precision", title_fontsize=7)
        ax.legend(**legend_args)
        fig.tight_layout()
        fig.canvas.draw()  # final limits and layout: labels are placed on the canvas as it will be saved
        # "best" would move the legend again once the labels are there: kept where it was put.
        legend = ax.get_legend()
        assert legend is not None  # ax.legend() just made it
        box = legend.get_window_extent().transformed(ax.transAxes.inverted())
        ax.legend(loc=(box.x0, box.y0), **legend_args)
        place_labels(fig, ax, points, first)
    else:
        fig.tight_layout()
    return fig, len(points)


def front_2d(points: Sequence[Tuple[int, float, float]], higher_y_better: bool) -> List[int]:
    """Row numbers of the points no other point beats on both axes (x lower, y lower or, for
    accuracy, higher), by x: O(n log n)."""
    sign = -1.0 if higher_y_better else 1.0
    out: List[int] = []
    best = math.inf
    for i, xv, yv in sorted(points, key=lambda p: (p[1], sign * p[2], p[0])):
        if sign * yv < best:
            out.append(i)
            best = sign * yv
    return out


def merge_close(ax, points: Sequence[Tuple[int, float, float]]) -> List[Tuple[Tuple[float, float], Tuple[float, float], List[int]]]:
    """(pixel, data xy, rows) per group of points that coincide on the canvas: a point joins the
    first group whose first point lies within MERGE_PX of it on both axes. The groups are found
    through a grid of MERGE_PX cells (only the 3 x 3 cells around a point can hold such a group),
    so this is linear in the points, not quadratic."""
    import numpy as np

    groups: List[Tuple[Tuple[float, float], Tuple[float, float], List[int]]] = []
    cells: Dict[Tuple[int, int], List[int]] = {}  # cell -> indices of the groups whose first point is in it
    pixels = ax.transData.transform(np.array([(xv, yv) for _, xv, yv in points], dtype=float).reshape(-1, 2))
    for (i, xv, yv), (px, py) in zip(points, pixels):
        cx, cy = int(math.floor(px / MERGE_PX)), int(math.floor(py / MERGE_PX))
        near = [g for dx in (-1, 0, 1) for dy in (-1, 0, 1) for g in cells.get((cx + dx, cy + dy), ())
                if abs(groups[g][0][0] - px) <= MERGE_PX and abs(groups[g][0][1] - py) <= MERGE_PX]
        if near:
            groups[min(near)][2].append(i)
        else:
            cells.setdefault((cx, cy), []).append(len(groups))
            groups.append(((float(px), float(py)), (xv, yv), [i]))
    return groups


def thin_labels(groups: Sequence[Tuple[Any, Any, List[int]]], first: Sequence[int]) -> List[int]:
    """Indices of the groups that get a label: all of them up to LABEL_ALL_MAX; beyond, at most
    LABEL_ALL_MAX: those holding a row of `first` (in its order), then at most LABEL_OTHERS
    evenly spread others."""
    if len(groups) <= LABEL_ALL_MAX:
        return list(range(len(groups)))
    of_row = {i: g for g, (_, _, rows) in enumerate(groups) for i in rows}
    chosen = list(dict.fromkeys(of_row[i] for i in first if i in of_row))[:LABEL_ALL_MAX]
    rest = [g for g in range(len(groups)) if g not in set(chosen)]
    room = min(LABEL_OTHERS, LABEL_ALL_MAX - len(chosen))
    if room > 0:
        step = len(rest) / room
        chosen += [rest[int(k * step)] for k in range(room)]
    return sorted(chosen)


def place_labels(fig, ax, points: Sequence[Tuple[int, float, float]], first: Sequence[int] = ()) -> list:
    """Each point's row number (the '#' of the report's tables; run names are too long to print)
    beside it. Points that coincide on the canvas share one label, "2,5"; past LABEL_ALL_MAX
    labels only some are labelled (thin_labels: the rows of `first`, then others); every label
    takes the first of LABEL_PLACES where it covers nothing (see there), else the first place: in
    a cloud too dense for that the tables still give every row. Returns the labels.

    The work is bounded: at most LABEL_ALL_MAX labels, each tried at the LABEL_PLACES as boxes
    computed from its size (one text layout per label), each box checked against every marker
    and earlier label at once (numpy), so 10,000 points cost what a few hundred did."""
    import numpy as np

    renderer = fig.canvas.get_renderer()
    groups = merge_close(ax, points)
    r = math.sqrt(MARKER_AREA) / 2 * fig.dpi / 72  # a marker's half width in pixels
    centres = np.array([g[0] for g in groups], dtype=float).reshape(-1, 2)
    taken = [np.column_stack([centres - r, centres + r])]  # x0, y0, x1, y1
    legend = ax.get_legend()
    if legend is not None:
        taken.append(np.array([legend.get_window_extent(renderer).extents]))
    inside = ax.get_window_extent(renderer)
    boxes = np.concatenate(taken)
    px_per_pt = fig.dpi / 72
    labels = []
    # Over a cloud of markers a label needs a backdrop to be read, and to be drawn above them.
    backdrop = dict(zorder=5, bbox=dict(boxstyle="square,pad=0.1", fc="white", ec="none", alpha=0.8)) \
        if len(groups) > LABEL_ALL_MAX else {}
    for g in thin_labels(groups, first):
        (px, py), xy, rows = groups[g]
        # (thinned, a crowd's label names its first rows and how many more: "2,5,9 +14")
        text = ",".join(str(i) for i in rows) if not backdrop or len(rows) <= 4 else \
            ",".join(str(i) for i in rows[:3]) + f" +{len(rows) - 3}"
        label = ax.annotate(text, xy, xytext=(0, 0), textcoords="offset points", fontsize=LABEL_FONT,
                            ha="left", va="bottom", **backdrop)
        size = label.get_window_extent(renderer)
        w, h = size.width, size.height
        chosen: Optional[Tuple[int, int]] = None
        for dx, dy in LABEL_PLACES:
            ax0 = px + dx * px_per_pt - (0 if dx > 0 else w if dx < 0 else w / 2)
            ay0 = py + dy * px_per_pt - (0 if dy > 0 else h if dy < 0 else h / 2)
            box = (ax0 - 1, ay0 - 1, ax0 + w + 1, ay0 + h + 1)  # a pixel's margin: the drawn box may round
            fits = (inside.x0 <= box[0] and box[2] <= inside.x1 and inside.y0 <= box[1] and box[3] <= inside.y1
                    and not bool(np.any((boxes[:, 0] <= box[2]) & (box[0] <= boxes[:, 2])
                                        & (boxes[:, 1] <= box[3]) & (box[1] <= boxes[:, 3]))))
            if chosen is None or fits:
                chosen = (dx, dy)
                if fits:
                    break
        assert chosen is not None  # the first of LABEL_PLACES is taken when none fits
        dx, dy = chosen
        label.set_position((dx, dy))
        label.set_ha("left" if dx > 0 else "right" if dx < 0 else "center")
        label.set_va("bottom" if dy > 0 else "top" if dy < 0 else "center")
        boxes = np.vstack([boxes, label.get_window_extent(renderer).extents])
        labels.append(label)
    return labels


def scatter_png(rows: Sequence[Row], x: str, y: str, xlabel: str, ylabel: str, title: str) -> Tuple[bytes, int]:
    """(PNG bytes, points drawn). Rows missing x or y are left out (and counted by the caller)."""
    import matplotlib.pyplot as plt

    fig, drawn = scatter_figure(rows, x, y, xlabel, ylabel, title)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue(), drawn


def all_plots(rows: Sequence[Row], basis: Optional[Basis] = None, notable: Sequence[int] = ()) -> List[Dict]:
    """basis: what time, cost and energy are (--time, --project-epochs); it relabels the axes.
    notable: rows labelled first in a plot of too many points to label all (scatter_figure)."""
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
        fig, drawn = scatter_figure(rows, x, y, xl, yl, title, stem, notable)
        tips = {mark_id(stem, i): run_tooltip(i, r, basis.label) for i, r in enumerate(rows)}
        png, svg = png_and_svg(fig, tips, stem)
        out.append({"stem": stem, "title": title, "png": png, "svg": svg, "drawn": drawn, "left_out": len(rows) - drawn,
                    "section": "Raw metrics"})  # the raw table's '#' labels their points
    return out
