"""The report's first section, the answer: per strategy (or per --weights given) the winning
configuration (verdict.py decides it, once), what it buys against its baseline (speed, energy,
cost and accuracy change, means over repeats: change.py), and, beside it, the warnings that change
that answer: a winner whose one-time warm-up does not pay off within its run, runs of different
sweeps, datasets or devices ranked together, no repeats to tell a close runner-up from the winner.
Where the baseline itself wins or ties, the answer is "keep what you run", and it still shows what
the best alternative would cost. Everything here is read from what the report already computed;
nothing is ranked anew. The headline, the table and the console lines: headline.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Mapping, Optional, Sequence, Tuple, Union

from .baseline import Baseline, Baselines, choose_baselines
from .change import Change, change, mean
from .floor import Floor
from .floor import resolve as resolve_floor
from .gate import warning
from .one_time import one_time_warning
from .repeats import RepeatStats
from .scoring import STRATEGIES, Row, Scored, score_rows
from .timing import TimeView
from .verdict import Line, Verdict, decide, runner_up_text, tie_text

TITLE = "The answer: which configuration to adopt"


@dataclass
class Winner:
    """One line of the answer: the strategies that share a call, its winner against its baseline."""
    line: Line
    configuration: Optional[int]        # verdict configuration; None = none eligible
    index: Optional[int]                # its first run (the plots' label); None = none eligible
    name: str = ""                      # what to adopt: its configuration, with the run count
    change: Change = field(default_factory=lambda: Change(""))  # against its baseline (means over repeats)
    vs_best_pts: Optional[float] = None   # its accuracy against the most accurate configuration's, in points
    runner_up: str = ""                 # 'name (score +3.1 %)', or why there is none
    sure: str = ""                      # how sure the call is: clear, tied with ..., not judged (verdict.tie_text)
    tied_with: List[str] = field(default_factory=list)  # configurations its repeats cannot tell from it
    warnings: List[str] = field(default_factory=list)
    base: Optional[Baseline] = None     # its like-for-like group's baseline (baseline.py)
    base_name: str = ""                 # that baseline's configuration as the answer names it
    base_configuration: Optional[int] = None  # the baseline's configuration (verdict index)
    keep: bool = False                  # the baseline wins, or ties with the winner: keep what you run
    alternative: Optional[Change] = None  # with keep: the best configuration that is not the baseline, against it

    @property
    def label(self) -> str:
        return self.line.label

    @property
    def strategies(self) -> List[str]:
        return list(self.line.strategies)

    @property
    def is_baseline(self) -> bool:
        """The winner is the baseline's own configuration."""
        return self.configuration is not None and self.configuration == self.base_configuration

    @property
    def shown(self) -> Change:
        """What the row's change cells show: the winner's, or with the baseline winning, the alternative's."""
        return self.alternative if self.is_baseline and self.alternative is not None else self.change


@dataclass
class Answer:
    verdict: Verdict                    # the decision every surface renders (verdict.py)
    baselines: Baselines                # one per like-for-like group (baseline.py)
    per_sample: bool                    # runs trained different amounts: changes are per sample
    winners: List[Winner]
    warnings: List[str]                 # warnings that hold for every winner (mixed runs, no repeats)
    base_name: str = ""                 # the (first group's) baseline configuration as the answer names it
    configurations: int = 0             # configurations among the rows (repeats of one count once)
    floor: Optional[Floor] = None       # the accuracy floor applied to configuration means (floor.py)
    base_below_floor: str = ""          # the sentence saying the baseline is under the floor, or ""


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


def _best_accuracy(v: Verdict) -> Optional[float]:
    """The most accurate configuration's mean test accuracy."""
    means = [iv.mean for iv in v.stats.metrics["accuracy"] if iv.mean is not None]
    return max(means) if means else None


def _alternative(v: Verdict, w: Winner, base_k: int) -> Optional[int]:
    """With the baseline winning: the runner-up; with the baseline tied: the winner itself."""
    c = w.line.call
    return c.runner_up if c.winner == base_k else c.winner


def _winner(rows: Sequence[Row], v: Verdict, bases: Baselines, line: Line, per_sample: bool,
            best_acc: Optional[float], view: Optional[TimeView]) -> Winner:
    k = line.call.winner
    if k is None:
        return Winner(line, None, None, runner_up=runner_up_text(v, line))
    runs = v.groups[k].members
    w = Winner(line, k, runs[0], v.name(k), runner_up=runner_up_text(v, line), sure=tie_text(v, line))
    w.tied_with = [v.groups[t].label for t in line.call.tied]
    base = w.base = bases.of(runs[0])
    acc, _ = mean(rows, runs, "accuracy", False)
    w.vs_best_pts = None if acc is None or best_acc is None else (acc - best_acc) * 100
    if base.index is None:
        w.change = Change(w.name, why={c: f"no baseline in its group {bases.group(runs[0]).label}".rstrip()
                                       for c in ("time_s", "energy_kwh", "cost_usd", "accuracy")})
        w.change.ratio = {c: None for c in ("time_s", "energy_kwh", "cost_usd")}
    else:
        base_k = w.base_configuration = v.of_row(base.index)
        base_runs = v.groups[base_k].members
        w.base_name = v.name(base_k)
        w.change = change(rows, w.name, runs, base_runs, per_sample)
        w.keep = base_k == k or base_k in line.call.tied
        alt = _alternative(v, w, base_k) if w.keep else None
        if alt is not None:
            w.alternative = w.change if alt == k else change(rows, v.name(alt), v.groups[alt].members, base_runs,
                                                               per_sample)
        warm = next((x for x in (warmup_warning(view, i) for i in runs) if x), None)
        if not warm:  # (whatever the warm-up was: compile's break-even above is about compile only)
            warm = one_time_warning(view.measured if view is not None else rows, runs, base_runs)
        if warm and base_k != k:
            w.warnings.append(warm)
    return w


def _below_floor(rows: Sequence[Row], v: Verdict, bases: Baselines) -> str:
    """Where a baseline itself is under the accuracy floor, the sentence the headline starts with."""
    out = []
    for g in bases.groups:
        b = g.baseline.index
        if b is None:
            continue
        k = v.of_row(b)
        if k in v.why_out and k in v.below_floor():
            acc = v.stats.metrics["accuracy"][k].mean
            out.append(f"'{v.name(k)}' ({acc:.4f})")
    if not out:
        return ""
    floor = v.floor.value if v.floor is not None and v.floor.value is not None else 0.0
    whose = "Your baseline " + out[0] + " is" if len(out) == 1 else "Your baselines " + ", ".join(out) + " are"
    return (f"{whose} below the accuracy floor ({floor:.4f}): it learned less than the configurations that may win, "
            "so a winner may be slower and still the better choice.")


def answer(rows: Sequence[Row], v: Verdict, bases: Baselines, view: Optional[TimeView] = None) -> Answer:
    """rows: the scored rows (view.rows with a view); v: the verdict (verdict.decide). Each winner
    is compared with its own like-for-like group's baseline configuration (bases), by means."""
    known = {r.train_samples for r in rows if r.train_samples is not None}
    per_sample = len(known) > 1
    first = bases.groups[0].baseline if bases.groups else None
    base_name = v.name(v.of_row(first.index)) if first is not None and first.index is not None else ""
    best_acc = _best_accuracy(v)
    winners = [_winner(rows, v, bases, line, per_sample, best_acc, view) for line in v.lines]
    warnings = left_out(v) + general_warnings(rows, v.stats, bases)
    return Answer(v, bases, per_sample, winners, warnings, base_name, len(v.groups), v.floor,
                  _below_floor(rows, v, bases))


def decided(view: TimeView, given: Optional[int] = None, strategies: Optional[Mapping[str, Sequence[float]]] = None,
            floor_given: Union[None, str, float] = None) -> Tuple[Scored, Verdict, Answer]:
    """The whole decision for view's rows, as the report makes it and every other surface (the
    results-at-a-glance page) takes it: the floor (floor.py), the runs' scores (made without the
    floor, which applies to configuration means), the verdict, the answer against the baselines
    (given: the row --baseline named)."""
    rows = view.rows
    acc_floor = resolve_floor(floor_given, rows)
    scored = score_rows(rows, dict(strategies or STRATEGIES), None, view.excluded)
    v = decide(rows, scored, acc_floor)
    return scored, v, answer(rows, v, choose_baselines(rows, given), view)


def left_out(v: Verdict, most: int = 6) -> List[str]:
    """The line naming the configurations the floor keeps from winning (means over their runs)."""
    below = v.below_floor()
    if v.floor is None or v.floor.value is None or not below:
        return []
    acc = v.stats.metrics["accuracy"]
    named = [f"'{v.name(k)}' ({acc[k].mean:.4f})" for k in below[:most]]
    more = f" and {len(below) - most} more (the scores table marks each)" if len(below) > most else ""
    what = "configurations (mean accuracy over their runs)" if v.repeated else "runs"
    return [f"Left out of the answer by the accuracy floor {v.floor.value:.4f} ({v.floor.basis}): {len(below)} of "
            f"{len(v.groups)} {what}: " + ", ".join(named) + more + ". They are scored in the tables below, never "
            "the winner"]


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
