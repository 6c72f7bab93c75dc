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

from .baseline import Baseline, Baselines
from .floor import Floor, left_out
from .gate import warning
from .one_time import one_time_warning
from .repeats import RepeatStats
from .scoring import STRATEGIES, Row, Scored
from .timing import TimeView

TITLE = "The answer: which configuration to adopt"
CHANGED = ("time_s", "energy_kwh", "cost_usd")


@dataclass
class Winner:
    label: str                          # the strategy, or the strategies that rank alike
    strategies: List[str]
    index: Optional[int]                # row index (with repeats, the group's first run); None = none eligible
    name: str = ""                      # what to adopt: the run's name, or with repeats its configuration's
    ratio: Dict[str, Optional[float]] = field(default_factory=dict)  # column -> run / baseline (per sample if so)
    accuracy_pts: Optional[float] = None  # accuracy change in percentage points
    vs_best_pts: Optional[float] = None   # its accuracy against the best run's (configuration's), in points
    why: Dict[str, str] = field(default_factory=dict)      # column -> why its change is null
    runner_up: str = ""                 # 'name (+3.1 %)': the next score, where there are no repeats
    tied_with: List[str] = field(default_factory=list)  # configurations its repeats cannot tell from it
    warnings: List[str] = field(default_factory=list)
    base: Optional[Baseline] = None     # its like-for-like group's baseline (baseline.py)
    base_name: str = ""                 # that baseline as the answer names it

    @property
    def speedup(self) -> Optional[float]:
        r = self.ratio.get("time_s")
        return None if not r else 1 / r

    def change_pct(self, column: str) -> Optional[float]:
        r = self.ratio.get(column)
        return None if r is None else (r - 1) * 100


@dataclass
class Answer:
    baselines: Baselines                # one per like-for-like group (baseline.py)
    per_sample: bool                    # runs trained different amounts: changes are per sample
    winners: List[Winner]
    warnings: List[str]                 # warnings that hold for every winner (mixed runs, no repeats)
    base_name: str = ""                 # the (one group's) baseline as the answer names it (with repeats, its configuration)
    configurations: int = 0             # configurations among the rows (repeats of one count once)
    floor: Optional[Floor] = None       # the accuracy floor the winners passed (floor.py)


def _value(row: Row, column: str, per_sample: bool) -> Tuple[Optional[float], str]:
    """row's column, per sample when the runs trained different amounts; null with why."""
    v = row.get(column)
    if v is None:
        return None, f"{column} null: {row.extra.get(column, 'not measured')}"
    if per_sample:
        if not row.train_samples:
            return None, "train_samples unknown, and the runs trained different amounts"
        v = v / row.train_samples
    return v, ""


def _mean(rows: Sequence[Row], members: Sequence[int], column: str, per_sample: bool) -> Tuple[Optional[float], str]:
    """The mean of column over a configuration's runs (one run without repeats); null when a run lacks it."""
    values = []
    for i in members:
        v, why = _value(rows[i], column, per_sample)
        if v is None:
            return None, why
        values.append(v)
    return sum(values) / len(values), ""


def _ratio(rows: Sequence[Row], base: Sequence[int], run: Sequence[int], column: str,
           per_sample: bool) -> Tuple[Optional[float], str]:
    """The winner's column over the baseline's (each a mean over its repeats)."""
    b, why = _mean(rows, base, column, per_sample)
    if b is None:
        return None, f"baseline's {why}"
    r, why = _mean(rows, run, column, per_sample)
    if r is None:
        return None, why
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


def _named(rows: Sequence[Row], st: RepeatStats, i: int) -> Tuple[str, List[int]]:
    """What the answer calls row i and the runs it stands for: with repeats, its configuration
    (a seed is never a thing to adopt) and all of that configuration's runs; else the run."""
    if not st.repeated:
        return rows[i].name, [i]
    g = next(g for g in st.groups if i in g.members)
    n = len(g.members)
    return (f"{g.label} ({n} runs)" if n > 1 else g.label), list(g.members)


def _best_accuracy(rows: Sequence[Row], st: RepeatStats) -> Optional[float]:
    """The best run's test accuracy; with repeats the best configuration's mean."""
    if st.repeated:
        means = [iv.mean for iv in st.metrics["accuracy"] if iv.mean is not None]
    else:
        means = [r.accuracy for r in rows if r.accuracy is not None]
    return max(means) if means else None


def answer(rows: Sequence[Row], scored: Scored, bases: Baselines, st: RepeatStats,
           view: Optional[TimeView] = None, floor: Optional[Floor] = None) -> Answer:
    """rows: the scored rows (view.rows with a view). With repeats, each strategy's winner is the
    configuration of best mean score (repeats.py) and every change is of means over repeats.
    Each winner is compared with its own like-for-like group's baseline (bases).
    floor: the accuracy floor scored was made with (floor.py); the runs below it are named."""
    known = {r.train_samples for r in rows if r.train_samples is not None}
    per_sample = len(known) > 1
    first = bases.groups[0].baseline if bases.groups else None
    base_name = _named(rows, st, first.index)[0] if first is not None and first.index is not None else ""
    best_acc = _best_accuracy(rows, st)
    winners = []
    for label, group, b in _lines(scored):
        if st.repeated:
            k = st.best.get(group[0])
            b = None if k is None else st.groups[k].members[0]
        w = Winner(label, group, b)
        winners.append(w)
        if b is None:
            continue
        w.name, runs = _named(rows, st, b)
        base = w.base = bases.of(b)
        w.base_name, base_runs = _named(rows, st, base.index) if base.index is not None else ("", [])
        if base.index is None:
            w.why = {c: f"no baseline in its group {bases.group(b).label}".rstrip() for c in CHANGED + ("accuracy",)}
        acc, _ = _mean(rows, runs, "accuracy", False)
        w.vs_best_pts = None if acc is None or best_acc is None else (acc - best_acc) * 100
        if base.index is not None:
            for col in CHANGED:
                w.ratio[col], why = _ratio(rows, base_runs, runs, col, per_sample)
                if why:
                    w.why[col] = why
            ba, why_b = _mean(rows, base_runs, "accuracy", False)
            ra, why_r = _mean(rows, runs, "accuracy", False)
            w.accuracy_pts = None if ba is None or ra is None else (ra - ba) * 100
            if w.accuracy_pts is None:
                w.why["accuracy"] = f"baseline's {why_b}" if ba is None else why_r
        warm = next((x for x in (warmup_warning(view, i) for i in runs) if x), None)
        if not warm:  # (whatever the warm-up was: compile's break-even above is about compile only)
            warm = one_time_warning(view.measured if view is not None else rows, runs, base_runs)
        if warm:
            w.warnings.append(warm)
        if st.repeated:
            tied = st.tied.get(group[0], [])
            w.tied_with = [st.groups[t].label for t in tied]
            if tied:
                w.warnings.append("tied over repeats with " + ", ".join(st.groups[t].label for t in tied)
                                  + " (95% intervals overlap): the repeats cannot tell them apart")
        else:
            w.runner_up = _runner_up(scored, group[0], b, rows)
    configurations = len(st.groups) if st.repeated else len(rows)
    warnings = (left_out(rows, floor) if floor is not None else []) + general_warnings(rows, st, bases)
    return Answer(bases, per_sample, winners, warnings, base_name, configurations, floor)


def general_warnings(rows: Sequence[Row], st: RepeatStats, bases: Optional[Baselines] = None) -> List[str]:
    out = []
    gate = warning(rows)
    if gate:
        out.append(gate + ". A winner may be ahead for how it was measured, not for its configuration")
    if bases is not None and bases.split:
        out.append(f"WARNING, unlike runs ranked together: these runs are of {len(bases.groups)} like-for-like groups ("
                   + "; ".join(g.label for g in bases.groups) + "). A winner may lead for what its group trains or "
                   "where, not for its techniques: each winner's changes are against its own group's baseline, "
                   "never another's; a report of one group (--sweep, or a store per model) ranks like with like")
    if not st.repeated:
        out.append("WARNING, no repeats: every configuration ran once, so the scores have no intervals and a winner "
                   "cannot be told apart from a close runner-up (see 'runner-up (score gap)'). Launch-bound runs "
                   "(short windows, small batches) can move by tens of percent between processes: the same sweep "
                   "twice on one host came out up to 54 % apart per run (docs/results/plan-probe.md). Measure the "
                   "noise: run the sweep again with sweep.repeats=3")
    return out


def _change(w: Winner, column: str) -> str:
    pct = w.change_pct(column)
    return f"null ({w.why.get(column, 'no baseline')})" if pct is None else f"{pct:+.1f} %"


def answer_table(ans: Answer, rows: Sequence[Row], label) -> tuple:
    """(title, note, headers, rows of cells), as render.py's tables; label: the basis' column labels."""
    unit = " per sample" if ans.per_sample else ""
    cells: List[List[str]] = []
    merged: List[List[str]] = []  # the strategies each row stands for
    for w in ans.winners:
        if w.index is None:
            cells.append([w.label, "none eligible", "", "", "", "", "", "", ""] + [""] * ans.baselines.split)
            merged.append(list(w.strategies))
            continue
        s = w.speedup
        speed = f"null ({w.why.get('time_s', 'no baseline')})" if s is None else f"{s:.2f}x"
        acc = f"null ({w.why.get('accuracy', 'no baseline')})" if w.accuracy_pts is None else f"{w.accuracy_pts:+.2f} pts"
        vs_best = "null (no accuracy)" if w.vs_best_pts is None else f"{w.vs_best_pts:+.2f} pts"
        row = [w.label, w.name, speed, _change(w, "energy_kwh"), _change(w, "cost_usd"), acc, vs_best,
               w.runner_up, "; ".join(w.warnings)] + ([w.base_name or "none"] if ans.baselines.split else [])
        same = next((k for k, c in enumerate(cells) if c[1:7] == row[1:7] and c[8] == row[8]), None)
        if same is None:
            cells.append(row)
            merged.append(list(w.strategies))
            continue
        # One winner under several strategies, alike in every number: one row, the strategies named
        # together (their runner-ups differ: the scores table has them).
        merged[same] += w.strategies
        cells[same][0] += f", {w.label}"
        cells[same][7] = cells[same][7] if cells[same][7] == row[7] else "(differs by strategy)"
    for c, ss in zip(cells, merged):
        if len(ss) > 1 and len(ss) == sum(len(w.strategies) for w in ans.winners):
            c[0] = f"all {len(ss)} strategies"
    whose = ("; each winner against its own like-for-like group's baseline (column 'baseline'), never another "
             "model's, dataset's, hardware's or GPU count's") if ans.baselines.split else ""
    note = (f"speed-up = the baseline's {label('time_s')} / the winner's{unit}; energy and cost change = the "
            f"winner's / the baseline's - 1{unit}; accuracy changes in percentage points, against the baseline "
            f"and against the most accurate run; a warning beside a winner changes the answer{whose}")
    return (TITLE, note, ["strategy", "winner", "speed-up", "energy change", "cost change", "accuracy change",
                          "accuracy vs best", "runner-up (score gap)", "warnings"]
            + (["baseline"] if ans.baselines.split else []), cells)


def headline(ans: Answer, rows: Sequence[Row]) -> str:
    """One sentence: the configuration to adopt when every strategy agrees, else that the weights decide."""
    named = [w for w in ans.winners if w.index is not None]
    if not named:
        return "No run is eligible to win under any strategy (see the scores' notes)."
    if ans.configurations == 1:
        return (f"Nothing to choose between: every run is one configuration, '{named[0].name}' (repeats differ "
                "only in their seed); its spread is in the repeats' table.")
    picks = list(dict.fromkeys(w.name for w in named))
    if len(picks) == 1:
        w = named[0]
        whom = "every strategy" if len(named) == len(ans.winners) and len(ans.winners) > 1 else w.label
        s = w.speedup
        base = "the baseline" if not ans.baselines.split else f"its own group's baseline '{w.base_name}'"
        buys = "" if s is None else (f": {s:.2f}x the speed of {base}" if ans.baselines.split
                                     else f": {s:.2f}x the baseline's speed")
        if s is not None and s < 1:  # (it wins on energy, cost or accuracy, not on time: say so first)
            buys = f": {1 / s:.2f}x slower than {base}"
        if s is None and w.base is not None and w.base.index is None:
            buys = f": no speed-up, its group has no baseline ({w.base.said})"
        below = w.base is not None and w.base.index is not None and ans.floor is not None and not ans.floor.passes(
            rows[w.base.index].accuracy)
        if below:
            buys += " (the baseline itself is below the accuracy floor)"
        if w.tied_with:  # a lead inside the repeats' spread is not a reason to adopt
            return (f"A tie: '{picks[0]}' leads under {whom} on the mean{buys}, but its repeats cannot tell it "
                    "from " + ", ".join(f"'{t}'" for t in w.tied_with) + " (95% intervals overlap).")
        return f"Adopt '{picks[0]}', best under {whom}{buys}."
    return (f"The weights decide: {len(picks)} configurations win under different strategies ("
            + ", ".join(f"'{p}'" for p in picks) + ").")
