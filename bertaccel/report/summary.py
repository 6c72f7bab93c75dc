"""The report's first section, the answer: per strategy (or per --weights given) the winning run,
what it buys against a baseline (speed-up, energy, cost and accuracy change), and, beside it, the
warnings that change that answer: a winner whose one-time warm-up does not pay off within its run,
runs of different sweeps, datasets or devices ranked together, and no repeats to tell a close
runner-up from the winner. Everything here is read from what the report already computes
(scores, break-even, the comparability gate, repeats); nothing is scored anew.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .baseline import Baseline
from .gate import warning
from .repeats import RepeatStats
from .scoring import STRATEGIES, Row, Scored
from .timing import TimeView

TITLE = "The answer: which configuration to adopt"
CHANGED = ("time_s", "energy_kwh", "cost_usd")


@dataclass
class Winner:
    label: str                          # the strategy, or the strategies that rank alike
    strategies: List[str]
    index: Optional[int]                # row index; None = no run eligible
    ratio: Dict[str, Optional[float]] = field(default_factory=dict)  # column -> run / baseline (per sample if so)
    accuracy_pts: Optional[float] = None  # accuracy change in percentage points
    why: Dict[str, str] = field(default_factory=dict)      # column -> why its change is null
    runner_up: str = ""                 # 'name (+3.1 %)': the next score, where there are no repeats
    warnings: List[str] = field(default_factory=list)

    @property
    def speedup(self) -> Optional[float]:
        r = self.ratio.get("time_s")
        return None if not r else 1 / r

    def change_pct(self, column: str) -> Optional[float]:
        r = self.ratio.get(column)
        return None if r is None else (r - 1) * 100


@dataclass
class Answer:
    baseline: Baseline
    per_sample: bool                    # runs trained different amounts: changes are per sample
    winners: List[Winner]
    warnings: List[str]                 # warnings that hold for every winner (mixed runs, no repeats)


def _ratio(base: Row, run: Row, column: str, per_sample: bool) -> Tuple[Optional[float], str]:
    """run's column over the baseline's, per sample when the runs trained different amounts."""
    b, r = base.get(column), run.get(column)
    if b is None:
        return None, f"baseline's {column} null: {base.extra.get(column, 'not measured')}"
    if r is None:
        return None, f"{column} null: {run.extra.get(column, 'not measured')}"
    if per_sample:
        if not base.train_samples or not run.train_samples:
            return None, "train_samples unknown, and the runs trained different amounts"
        b, r = b / base.train_samples, r / run.train_samples
    if b == 0:
        return None, f"baseline's {column} is 0"
    return r / b, ""


def warmup_warning(view: Optional[TimeView], i: int) -> Optional[str]:
    """Why the winner's one-time warm-up is not paid back within its own run, or None when it is
    (or the run compiled nothing)."""
    if view is None:
        return None
    rows, n = view.measured, view.basis.project_epochs
    run_steps = view.projections[i].steps if n is not None else rows[i].optimizer_steps
    ran = "the projected run" if n is not None else "its run"
    hint = ("; the ranking leaves the warm-up out (--time train): --time total counts it"
            if view.basis.time_mode == "train" else "")
    for b in view.break_even:
        if b.compiled != i or b.steps is None:
            continue
        off = rows[b.off].name
        if math.isinf(b.steps):
            return (f"its compiled step is not faster than that of '{off}' (the same configuration uncompiled): its "
                    f"warm-up of {b.extra_warmup_s:.0f} s more never pays off{hint}")
        if run_steps is not None and b.steps > run_steps:
            return (f"compile={b.compile_mode}'s warm-up ({b.extra_warmup_s:.0f} s more than '{off}') pays off only "
                    f"after {math.ceil(b.steps):,} steps; {ran} took {run_steps:,}{hint}")
    if i in view.unpaired and rows[i].compile_time_s:
        return (f"it is compiled (compile={rows[i].compile_mode}, warm-up {rows[i].compile_time_s:.0f} s) and no "
                f"uncompiled run of the same configuration prices its warm-up (no break-even){hint}")
    return None


def _runner_up(scored: Scored, s: str, best: int, rows: Sequence[Row]) -> str:
    """The next-best eligible run of strategy s and how far behind (% of the winner's score)."""
    others = sorted((v, k) for k, v in enumerate(scored.scores[s])
                    if v is not None and scored.eligible[k] and k != best)
    if not others:
        return ""
    v, k = others[0]
    won = scored.scores[s][best]
    gap = f"{(v - won) / abs(won) * 100:+.1f} %" if won else f"{v - won:+.3f}"
    return f"{rows[k].name} ({gap})"


def _lines(scored: Scored) -> List[Tuple[str, List[str], Optional[int]]]:
    """The strategies the user gave with --weights, else every strategy (alike ones sharing a line)."""
    mine = [s for s in scored.strategies if s not in STRATEGIES]
    return [(s, [s], scored.best[s]) for s in mine] if mine else scored.best_lines()


def answer(rows: Sequence[Row], scored: Scored, base: Baseline, st: RepeatStats,
           view: Optional[TimeView] = None) -> Answer:
    """rows: the scored rows (view.rows with a view)."""
    known = {r.train_samples for r in rows if r.train_samples is not None}
    per_sample = len(known) > 1
    winners = []
    for label, group, b in _lines(scored):
        w = Winner(label, group, b)
        winners.append(w)
        if b is None:
            continue
        if base.index is not None:
            for col in CHANGED:
                w.ratio[col], why = _ratio(rows[base.index], rows[b], col, per_sample)
                if why:
                    w.why[col] = why
            ba, ra = rows[base.index].accuracy, rows[b].accuracy
            w.accuracy_pts = None if ba is None or ra is None else (ra - ba) * 100
            if w.accuracy_pts is None:
                who, row = ("baseline's ", rows[base.index]) if ba is None else ("", rows[b])
                w.why["accuracy"] = f"{who}accuracy null: {row.extra.get('accuracy', 'not measured')}"
        warm = warmup_warning(view, b)
        if warm:
            w.warnings.append(warm)
        if st.repeated:
            k = st.best.get(group[0])
            tied = st.tied.get(group[0], [])
            if k is not None and tied:
                w.warnings.append("tied over repeats with " + ", ".join(st.groups[t].label for t in tied)
                                  + " (95% intervals overlap): the repeats cannot tell them apart")
        else:
            w.runner_up = _runner_up(scored, group[0], b, rows)
    return Answer(base, per_sample, winners, general_warnings(rows, st))


def general_warnings(rows: Sequence[Row], st: RepeatStats) -> List[str]:
    out = []
    gate = warning(rows)
    if gate:
        out.append(gate + ". A winner may be ahead for how it was measured, not for its configuration")
    if not st.repeated:
        out.append("WARNING, no repeats: every configuration ran once, so the scores have no intervals and a winner "
                   "cannot be told apart from a close runner-up (see 'runner-up (score gap)'); repeat the sweep "
                   "with train.seed=1,2,3")
    return out


def _change(w: Winner, column: str) -> str:
    pct = w.change_pct(column)
    return f"null ({w.why.get(column, 'no baseline')})" if pct is None else f"{pct:+.1f} %"


def answer_table(ans: Answer, rows: Sequence[Row], label) -> tuple:
    """(title, note, headers, rows of cells), as render.py's tables; label: the basis' column labels."""
    unit = " per sample" if ans.per_sample else ""
    cells = []
    for w in ans.winners:
        if w.index is None:
            cells.append([w.label, "none eligible", "", "", "", "", "", ""])
            continue
        s = w.speedup
        speed = f"null ({w.why.get('time_s', 'no baseline')})" if s is None else f"{s:.2f}x"
        acc = f"null ({w.why.get('accuracy', 'no baseline')})" if w.accuracy_pts is None else f"{w.accuracy_pts:+.2f} pts"
        cells.append([w.label, rows[w.index].name, speed, _change(w, "energy_kwh"), _change(w, "cost_usd"), acc,
                      w.runner_up, "; ".join(w.warnings)])
    note = (f"speed-up = the baseline's {label('time_s')} / the winner's{unit}; energy and cost change = the "
            f"winner's / the baseline's - 1{unit}; accuracy change in percentage points; a warning beside a winner "
            "changes the answer")
    return (TITLE, note, ["strategy", "winner", "speed-up", "energy change", "cost change", "accuracy change",
                          "runner-up (score gap)", "warnings"], cells)


def headline(ans: Answer, rows: Sequence[Row]) -> str:
    """One sentence: the run to adopt when every strategy agrees, else that the weights decide."""
    named = [w for w in ans.winners if w.index is not None]
    if not named:
        return "No run is eligible to win under any strategy (see the scores' notes)."
    picks = list(dict.fromkeys(w.index for w in named))
    if len(picks) == 1:
        w = named[0]
        whom = "every strategy" if len(named) == len(ans.winners) and len(ans.winners) > 1 else w.label
        s = w.speedup
        buys = "" if s is None else f": {s:.2f}x the baseline's speed"
        return f"Adopt '{rows[picks[0]].name}', best under {whom}{buys}."
    return (f"The weights decide: {len(picks)} runs win under different strategies ("
            + ", ".join(f"'{rows[i].name}'" for i in picks) + ").")
