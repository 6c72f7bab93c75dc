"""The score tables (thesis Table 5.4 form) and the best configuration per strategy, rendered from
the verdict (verdict.py) and the answer (summary.py): bold marks the verdict's winner, never a
ranking of the table's own. With repeats the scores are per configuration (mean and 95 %
interval) and the single runs, each with its seed, follow in the appendix without any bold."""
from __future__ import annotations

from typing import Any, List, Sequence

from .headline import winner_cell
from .repeats import LEVEL, Interval
from .scoring import Row, Scored
from .summary import Answer
from .verdict import Verdict, runner_up_text

Table = tuple  # (title, note, headers, rows of cells), as render.py
SCORES = "Scores per configuration"
RUN_SCORES = "Scores per run"
BEST = "Best configuration per strategy"


def _cell(iv: Interval, repeated: bool) -> str:
    if iv.mean is None:
        return f"null ({iv.why})"
    if not repeated or iv.low is None:
        return f"{iv.mean:.3f}"
    return f"{iv.mean:.3f} [{iv.low:.3f}, {iv.high:.3f}]"


def _floor_note(v: Verdict) -> str:
    f = v.floor
    if f is None or f.value is None:
        return ""
    what = "a configuration whose mean accuracy is" if v.repeated else "a run"
    return f"; accuracy floor {f.value:.4f} ({f.basis}): {what} below it is scored, never the winner"


def scores_table(rows: Sequence[Row], scored: Scored, v: Verdict, lab: Any, sfx: str, rank_warning: str) -> Table:
    """One row per configuration (per run without repeats); bold = the verdict's winner."""
    names = list(scored.strategies)
    cells = []
    for k, g in enumerate(v.groups):
        acc = v.stats.metrics["accuracy"][k]
        row = [v.name(k), _cell(acc, v.repeated) if acc.mean is not None else "null"]
        for s in names:
            c = _cell(v.stats.scores[s][k], v.repeated)
            row.append(f"**{c}**" if v.calls[s].winner == k else c)
        row.append("" if v.eligible[k] else f"excluded: {v.why_out[k]}")
        cells.append(row)
    how = (f"each run scored (max-normalized over all runs), then averaged per configuration: mean [{LEVEL:.0%} "
           "t-interval]; " if v.repeated else "")
    title = f"{SCORES} (thesis Table 5.4 form{sfx})" if v.repeated else f"Scores (thesis Table 5.4 form{sfx})"
    return (title, "; ".join(filter(None, (rank_warning, f"{how}bold = the winner per strategy (the answer's){_floor_note(v)}"))),
            ["configuration" if v.repeated else "run", lab("accuracy")] + names + ["note"], cells)


def run_scores_table(rows: Sequence[Row], scored: Scored, v: Verdict, lab: Any, sfx: str,
                     rank_warning: str) -> Table:
    """The single runs behind the configuration scores, each with its seed; no bold: the answer
    ranks configurations, not runs."""
    names = list(scored.strategies)
    cells = []
    for i, r in enumerate(rows):
        k = v.of_row(i)
        cells.append([v.groups[k].label, r.seed or "?", "null" if r.accuracy is None else f"{r.accuracy:.4f}"]
                     + ["null" if scored.scores[s][i] is None else f"{scored.scores[s][i]:.3f}" for s in names]
                     + ["" if v.eligible[k] else "its configuration is excluded"])
    return (f"{RUN_SCORES} (thesis Table 5.4 form{sfx})",
            "; ".join(filter(None, (rank_warning, "each run of each configuration, by its seed; the winner is chosen "
                                                  "among configurations (the table above), not among single runs"))),
            ["configuration", "seed", lab("accuracy")] + names + ["note"], cells)


def best_table(ans: Answer, lab: Any, own: str, rank_warning: str) -> Table:
    """Per line of strategies: the winner, its score, accuracy, runner-up and gap, how sure."""
    v = ans.verdict
    cells: List[List[str]] = []
    for w in ans.winners:
        k = w.configuration
        if k is None:
            cells.append([w.label, "none eligible", "", "", runner_up_text(v, w.line), ""])
            continue
        scores = {_cell(v.stats.scores[s][k], v.repeated) for s in w.strategies}
        cells.append([w.label, winner_cell(w), scores.pop() if len(scores) == 1 else "(differs by strategy)",
                      _cell(v.stats.metrics["accuracy"][k], v.repeated), runner_up_text(v, w.line), w.sure])
    note = (f"the answer's winners (strategies with one call share a row); score gap = the runner-up's mean score over "
            f"the winner's - 1; tied = the {LEVEL:.0%} intervals of the mean scores overlap")
    return (f"{BEST}{own}", "; ".join(filter(None, (rank_warning, note))),
            ["strategy", "winner", "score", lab("accuracy"), "runner-up (score gap)", "how sure"], cells)

