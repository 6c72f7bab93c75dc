"""Plots of the sure-of-itself sections: the Pareto front, the weight-space map and the accuracy
curves against training time. Each returns plots.py's dict: stem, title, png, drawn, left_out."""
from __future__ import annotations

import io
import math
import textwrap
from typing import Dict, List, Optional, Sequence

from .pareto import Front
from .plots import EACH_MARK_MAX, LABEL_ALL_MAX, run_tooltip
from .scoring import Row
from .svg import mark_id, png_and_svg
from .weights import STEPS, WeightMap

W4_PANELS = (0, 2, 4, 6, 8, 10)   # w4 of the map's panels, in twentieths: 0, 0.1, ..., 0.5
TIE_COLOUR = "0.55"
LEGEND_WIDTH = 48  # characters of a legend label's line (three columns across the figure)


def distinct_colours(keys: Sequence[int], plt) -> Dict[int, tuple]:
    """One colour per key, none repeated: tab10 for up to 10, tab20 up to 20, else evenly spaced
    hues (a key's own number mod 10 gave two winners 10 apart one colour)."""
    n = len(keys)
    if n <= 10:
        return {k: plt.get_cmap("tab10")(j) for j, k in enumerate(keys)}
    if n <= 20:
        return {k: plt.get_cmap("tab20")(j) for j, k in enumerate(keys)}
    return {k: plt.get_cmap("hsv")(j / n) for j, k in enumerate(keys)}


def png_bytes(fig) -> bytes:
    """The figure as PNG bytes (the plots' dicts carry them), and the figure closed."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def pareto_plot(rows: Sequence[Row], front: Front) -> Dict:
    """Time vs accuracy, the 4-objective front's runs filled and numbered (the raw table's #)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=110)
    drawn = 0
    # Past plots.EACH_MARK_MAX runs the dominated ones are one mark (a mark each costs
    # milliseconds), the front's keep theirs; past plots.LABEL_ALL_MAX front runs, the first are numbered.
    each = len(rows) <= EACH_MARK_MAX
    dominated: List[tuple] = []
    numbered, on_front = set(front.on_front[:LABEL_ALL_MAX]), set(front.on_front)
    for i, r in enumerate(rows):
        if i in front.left_out or r.time_s is None or r.accuracy is None:
            continue
        drawn += 1
        on = i in on_front
        if not on and not each:
            dominated.append((r.time_s, r.accuracy))
            continue
        mark = ax.scatter([r.time_s], [r.accuracy], s=60 if on else 40, color="tab:red" if on else "none",
                          edgecolors="black" if on else "0.5", zorder=3 if on else 2)
        mark.set_gid(mark_id("pareto_front", i))
        if i in numbered:
            ax.annotate(str(i), (r.time_s, r.accuracy), xytext=(4, 4), textcoords="offset points", fontsize=7)
    if dominated:
        ax.scatter([x for x, _ in dominated], [y for _, y in dominated], s=40, color="none", edgecolors="0.5",
                   zorder=2, rasterized=True)  # (in the SVG one image, not an element per point)
    ax.scatter([], [], color="tab:red", edgecolors="black", label="on the front (# = raw table row)")
    ax.scatter([], [], color="none", edgecolors="0.5", label="dominated: another run no worse on all, better on one")
    ax.set_xlabel("train time (s)")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"Pareto front over {', '.join(front.objectives)}\n(shown on time vs accuracy)", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    tips = {mark_id("pareto_front", i): run_tooltip(i, r) + ("\non the front" if i in front.on_front else
                                                             "\ndominated") for i, r in enumerate(rows)}
    png, svg = png_and_svg(fig, tips, "pareto_front")
    return {"stem": "pareto_front", "title": "Pareto front over time, cost, energy and accuracy",
            "png": png, "svg": svg, "drawn": drawn, "left_out": len(rows) - drawn,
            "section": "Pareto front over time, cost, energy and accuracy (runs)"}


def weight_map_plot(wm: WeightMap) -> Dict:
    """One triangle per w4 in W4_PANELS: corners w1 (time), w2 (cost), w3 (energy) of the weight
    left to them, each grid point coloured by the configuration that wins there."""
    plt = _plt()
    colours = distinct_colours(sorted(wm.won), plt)
    fig, axes = plt.subplots(2, 3, figsize=(10, 7.6), dpi=110)
    h = math.sqrt(3) / 2
    for ax, d in zip(axes.flat, W4_PANELS):
        left = STEPS - d
        marks: Dict[tuple, List[tuple]] = {}  # (colour, marker) -> points: one scatter each, not one per point
        for (a, b, c, dd), win in zip(wm.points, wm.winners):
            if dd != d:
                continue
            colour = colours[win[0]] if len(win) == 1 else TIE_COLOUR if win else "white"
            marker = "o" if len(win) == 1 else "x" if win else "."
            marks.setdefault((colour, marker), []).append(((b + c / 2) / left, c * h / left))
        for (colour, marker), xy in marks.items():
            ax.scatter([x for x, _ in xy], [y for _, y in xy], s=22, color=colour, marker=marker,
                       edgecolors="none" if marker == "o" else None)
        ax.plot([0, 1, 0.5, 0], [0, 0, h, 0], color="black", lw=0.8)
        ax.text(-0.03, -0.06, "w1 time", fontsize=7, ha="left", va="top")
        ax.text(1.03, -0.06, "w2 cost", fontsize=7, ha="right", va="top")
        ax.text(0.5, h + 0.04, "w3 energy", fontsize=7, ha="center")
        ax.set_title(f"w4 (O) = {d / STEPS:.2f}", fontsize=9)
        ax.set_xlim(-0.08, 1.08)
        ax.set_ylim(-0.12, h + 0.12)
        ax.set_aspect("equal")
        ax.axis("off")
    # A label is never cut (two cut at 40 characters read the same): a long one wraps.
    handles = [plt.Line2D([], [], ls="", marker="o", color=colours[k], label=textwrap.fill(wm.labels[k], LEGEND_WIDTH))
               for k in sorted(wm.won)]
    if wm.ties:
        handles.append(plt.Line2D([], [], ls="", marker="x", color=TIE_COLOUR, label="tie"))
    fig.legend(handles=handles, loc="lower center", ncol=min(3, max(1, len(handles))), fontsize=7)
    fig.suptitle(f"Which configuration has the lowest score, over weights in steps of 1/{STEPS}\n"
                 "(a corner = all of the weight left by w4 on that metric)", fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    return {"stem": "weight_map", "title": "Weight sensitivity: the winner at each (w1, w2, w3) for six values of w4",
            "png": png_bytes(fig), "drawn": len(wm.points), "left_out": 0, "section": "Weight sensitivity"}


def target_plot(rows: Sequence[Row], target: float) -> Dict:
    """Accuracy after each epoch against the training seconds until then, one line per run."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9.6, 4.4), dpi=110)
    drawn = 0
    for i, r in enumerate(rows):
        if not r.epoch_accuracy or len(r.epoch_time_s) != len(r.epoch_accuracy):
            continue
        ends = [sum(r.epoch_time_s[:e + 1]) for e in range(len(r.epoch_time_s))]
        line, = ax.plot(ends, r.epoch_accuracy, marker="o", ms=3, lw=1, color=plt.get_cmap("tab10")(i % 10),
                        label=f"{i}: {r.name}")
        line.set_gid(mark_id("time_to_target", i))
        drawn += 1
    ax.axhline(target, color="black", ls="--", lw=0.8, label=f"target {target}")
    ax.set_xlabel("training-window seconds (cumulative)")
    ax.set_ylabel("test accuracy after the epoch")
    ax.set_title("Accuracy against training time", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    fig.tight_layout()
    tips = {mark_id("time_to_target", i): f"#{i} {r.name}\n" + "\n".join(
        f"epoch {e}: accuracy {a:.4f} after {sum(r.epoch_time_s[:e + 1]):.1f} s" for e, a in enumerate(r.epoch_accuracy))
        for i, r in enumerate(rows) if r.epoch_accuracy and len(r.epoch_time_s) == len(r.epoch_accuracy)}
    png, svg = png_and_svg(fig, tips, "time_to_target")
    return {"stem": "time_to_target", "title": f"Accuracy against training time (target {target})",
            "png": png, "svg": svg, "drawn": drawn, "left_out": len(rows) - drawn, "section": "Time to accuracy"}


def all_figures(rows: Sequence[Row], front: Front, wm: WeightMap, measured: Sequence[Row],
                target: Optional[float]) -> List[Dict]:
    out = [pareto_plot(rows, front), weight_map_plot(wm)]
    if target is not None:
        out.append(target_plot(measured, target))
    return out
