"""The answer's chart: for each winning configuration (or, where the baseline itself wins, the
best alternative: what switching would cost), its time, energy and cost change against the
baseline (percent, lower is better, the baseline at 0), its accuracy change printed beside; hover
a bar for the run, the strategies it wins and every change. A change that is null is not drawn
(never a bar of 0): its reason is in the tooltip and the table."""
from __future__ import annotations

import textwrap
from typing import Dict, List, Optional, Sequence

from .scoring import Row
from .change import pct_text, pts_text, speed_text
from .summary import Answer, Winner
from .svg import mark_id, png_and_svg

STEM = "answer"
BARS = (("time_s", "time", "tab:blue"), ("energy_kwh", "energy", "tab:green"), ("cost_usd", "cost", "tab:orange"))
BAR_HEIGHT = 0.25


def _tooltip(w: List[Winner], per_sample: bool) -> str:
    first, shown = w[0], w[0].shown
    head = [first.name] if shown is first.change else [f"{first.name} (the baseline, kept)",
                                                       f"the alternative: {shown.name}"]
    lines = head + ["wins: " + ", ".join(x.label for x in w), f"against: {first.base_name or 'no baseline'}"]
    lines.append("speed: " + speed_text(shown.speedup, shown.why.get("time_s", "no baseline"))
                 + (" (per sample)" if per_sample else ""))
    for col, name, _ in BARS:
        lines.append(f"{name} change: " + pct_text(shown, col))
    lines.append("accuracy change: " + pts_text(shown))
    return "\n".join(lines)


def answer_chart(ans: Answer, rows: Sequence[Row]) -> Optional[Dict]:
    """plots.py's dict (stem, title, png, svg, drawn, left_out, section), or None with no baseline."""
    if not ans.baselines.indices:
        return None
    by_run: Dict[str, List[Winner]] = {}  # (by what the bars show: the winner, or the baseline's alternative)
    for w in ans.winners:
        # (a baseline that wins with no alternative eligible has nothing to compare: no bars of 0)
        if w.index is not None and not (w.is_baseline and w.alternative is None):
            by_run.setdefault(w.shown.name, []).append(w)
    if not by_run:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.0, 1.3 + 0.75 * len(by_run)), dpi=110)
    tips: Dict[str, str] = {}
    drawn, labels, legended = 0, [], set()
    for y, (i, ws) in enumerate(by_run.items()):
        tip = _tooltip(ws, ans.per_sample)
        for k, (col, name, colour) in enumerate(BARS):
            pct = ws[0].shown.change_pct(col)
            if pct is None:
                continue
            bar = ax.barh([y + (k - 1) * BAR_HEIGHT], [pct], height=BAR_HEIGHT * 0.9, color=colour,
                          label=None if name in legended else name)
            legended.add(name)
            ax.annotate(f"{pct:+.1f} %", (pct, y + (k - 1) * BAR_HEIGHT), xytext=(3 if pct >= 0 else -3, 0),
                        textcoords="offset points", ha="left" if pct >= 0 else "right", va="center", fontsize=7)
            gid = mark_id(STEM, len(tips))
            bar[0].set_gid(gid)
            tips[gid] = tip
            drawn += 1
        shown = ws[0].shown
        a = shown.accuracy_pts
        kept = "" if shown is ws[0].change else " (alternative; baseline kept)"
        labels.append(textwrap.shorten(shown.name + kept, 46) + "\n" + ("accuracy null" if a is None
                                                                          else f"accuracy {a:+.2f} pts"))
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(range(len(by_run)), labels, fontsize=8)
    ax.invert_yaxis()
    unit = " per sample" if ans.per_sample else ""
    ax.set_xlabel(f"change against the baseline{unit}, % (lower is better; 0 = the baseline)")
    against = "each against its own group's baseline" if ans.baselines.split else f"against {ans.base_name}"
    ax.set_title(textwrap.shorten(f"Winners {against}", 90), fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    ax.margins(x=0.15)  # room for the value labels at the bars' ends
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)  # off the bars
    fig.tight_layout()
    png, svg = png_and_svg(fig, tips, STEM)
    return {"stem": STEM, "title": "The winners' time, energy and cost change against the baseline", "png": png,
            "svg": svg, "drawn": drawn, "left_out": 0, "section": "The answer"}
