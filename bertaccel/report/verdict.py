"""The decision, computed once: which configuration wins under each strategy, how sure that is,
and what comes second. Every surface that names a winner renders this object and ranks nothing
of its own: the console's lines, the answer and its headline (summary.py), the best-per-strategy
and score tables, the MLflow parent run's description and the results-at-a-glance page.

A configuration is the runs that differ only in their seed (repeats.py; without repeats, one run).
- Its accuracy is the mean over its runs, and the accuracy floor (floor.py) is applied to that
  mean: one unlucky seed does not exclude a configuration whose runs average above the floor.
- Its score under a strategy is the mean of its runs' scores (each run scored as the thesis does,
  max-normalized over all runs: scoring.py), with a 95 % t-interval where it has two runs or more.
- Per strategy, the winner is the eligible configuration of lowest mean score; the runner-up is the
  next, with its score gap (its mean score over the winner's, in %); the winner is tied with every
  configuration whose interval overlaps its own (the repeats cannot tell them apart), and
  unjudged against one without an interval (one run).
Strategies whose call is the same (winner, runner-up and ties) share one line.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from .floor import Floor
from .repeats import Group, Interval, RepeatStats, repeat_stats
from .scoring import STRATEGIES, Row, Scored


@dataclass(frozen=True)
class Call:
    """One strategy's decision (indices are configurations: Verdict.groups)."""
    winner: Optional[int]                # None: no configuration is eligible
    runner_up: Optional[int] = None      # the next eligible configuration by mean score
    gap_pct: Optional[float] = None      # runner-up's mean score over the winner's - 1, in % of |winner's|
    tied: Tuple[int, ...] = ()           # configurations whose 95 % interval overlaps the winner's
    unjudged: Tuple[int, ...] = ()       # configurations with no interval to compare (one run)
    winner_alone: bool = False           # the winner itself has one run: nothing can be judged


@dataclass(frozen=True)
class Line:
    """Strategies with one winner and the same ties, as every surface prints them together; their
    runner-ups may differ (each strategy's own is kept)."""
    label: str                           # 'balance', 'all 7 strategies' or 'balance, time_cost_energy'
    strategies: Tuple[str, ...]
    call: Call                           # the first strategy's call (winner and ties are the line's)
    calls: Tuple[Call, ...]              # each strategy's own call, in order (runner-up, gap)


@dataclass
class Verdict:
    stats: RepeatStats                   # configurations: members, seeds, metric and score intervals
    eligible: List[bool]                 # per configuration: may win
    why_out: Dict[int, str]              # configuration -> why it may not win
    calls: Dict[str, Call]               # strategy -> its call
    lines: List[Line]                    # the calls to print, alike strategies together
    floor: Optional[Floor]
    asked: Tuple[str, ...] = field(default=())  # the strategies the answer answers (--weights given, else all)

    @property
    def groups(self) -> List[Group]:
        return self.stats.groups

    @property
    def repeated(self) -> bool:
        return self.stats.repeated

    def name(self, k: int) -> str:
        """What the answer calls configuration k: its label, with its run count where repeated."""
        g = self.groups[k]
        return f"{g.label} ({len(g.members)} runs)" if len(g.members) > 1 else g.label

    def of_row(self, i: int) -> int:
        """The configuration row i belongs to."""
        return self._of_row[i]

    def __post_init__(self) -> None:
        self._of_row = {i: k for k, g in enumerate(self.groups) for i in g.members}

    def winners(self) -> List[int]:
        """The configurations that win under some line, in order (each once)."""
        return list(dict.fromkeys(ln.call.winner for ln in self.lines if ln.call.winner is not None))

    def below_floor(self) -> List[int]:
        """Configurations the floor keeps from winning (their mean accuracy is under it), most accurate first."""
        f = self.floor
        out = [k for k in range(len(self.groups)) if f is not None and f.value is not None
               and self.stats.metrics["accuracy"][k].mean is not None and not f.passes(self.stats.metrics["accuracy"][k].mean)]
        return sorted(out, key=lambda k: -(self.stats.metrics["accuracy"][k].mean or 0))


def _eligibility(rows: Sequence[Row], scored: Scored, groups: Sequence[Group], accuracy: Sequence[Interval],
                 floor: Optional[Floor]) -> Tuple[List[bool], Dict[int, str]]:
    """Per configuration: the floor against its mean accuracy; any run the time view excluded
    (scored.ineligible_reason: e.g. no T) keeps its configuration out, said with the count."""
    eligible, why = [], {}
    for k, g in enumerate(groups):
        reasons = []
        if floor is not None and floor.value is not None:
            unknown = [i for i in g.members if rows[i].accuracy is None]
            if unknown:
                reasons.append(f"accuracy not measured ({len(unknown)} of {len(g.members)} runs)")
            elif not floor.passes(accuracy[k].mean):
                what = f"mean accuracy of {len(g.members)} runs" if len(g.members) > 1 else "accuracy"
                reasons.append(f"{what} {accuracy[k].mean:.4f} < floor {floor.value:.4f}")
        out = [i for i in g.members if not scored.eligible[i]]
        if out:
            reasons.append(f"{len(out)} of {len(g.members)} runs: {scored.ineligible_reason[out[0]]}"
                           if len(g.members) > 1 else scored.ineligible_reason[out[0]])
        eligible.append(not reasons)
        if reasons:
            why[k] = "; ".join(reasons)
    return eligible, why


def _call(per_group: Sequence[Interval], eligible: Sequence[bool]) -> Call:
    candidates = sorted((iv.mean, k) for k, iv in enumerate(per_group) if iv.mean is not None and eligible[k])
    if not candidates:
        return Call(None)
    (won, best), rest = candidates[0], candidates[1:]
    runner, gap = None, None
    if rest:
        v, runner = rest[0]
        gap = (v - won) / abs(won) * 100 if won else None
    iv = per_group[best]
    tied = tuple(k for _, k in rest if iv.overlaps(per_group[k]))
    unjudged = tuple(k for _, k in rest if iv.overlaps(per_group[k]) is None)
    return Call(best, runner, gap, tied, unjudged, winner_alone=iv.low is None and bool(rest))


def _lines(calls: Mapping[str, Call], asked: Sequence[str]) -> List[Line]:
    """One line per winner and ties among the asked strategies, in the strategies' order."""
    by: Dict[Tuple, List[str]] = {}
    for s in asked:
        c = calls[s]
        by.setdefault((c.winner, frozenset(c.tied), frozenset(c.unjudged), c.winner_alone), []).append(s)
    out = []
    for ss in by.values():
        label = f"all {len(ss)} strategies" if len(ss) == len(asked) and len(ss) > 1 else ", ".join(ss)
        out.append(Line(label, tuple(ss), calls[ss[0]], tuple(calls[s] for s in ss)))
    return out


def decide(rows: Sequence[Row], scored: Scored, floor: Optional[Floor]) -> Verdict:
    """rows: the scored rows; scored: their per-run scores (scoring.score_rows, made without the
    floor: the floor applies to configurations here); floor: the accuracy floor (floor.py)."""
    stats = repeat_stats(rows, scored)
    eligible, why = _eligibility(rows, scored, stats.groups, stats.metrics["accuracy"], floor)
    calls = {s: _call(per_group, eligible) for s, per_group in stats.scores.items()}
    # The question the answer answers: the strategies given with --weights, else every strategy.
    mine = tuple(s for s in scored.strategies if s not in STRATEGIES)
    asked = mine or tuple(scored.strategies)
    return Verdict(stats, eligible, why, calls, _lines(calls, asked), floor, asked)


def _gap(gaps: Sequence[Optional[float]]) -> str:
    """'+3.1 %', or the range over several strategies, '+2.0 to +3.1 %'."""
    known = sorted(g for g in gaps if g is not None)
    if not known:
        return "gap null (the winner's score is 0)"
    lo, hi = known[0], known[-1]
    return f"{lo:+.1f} %" if f"{lo:+.1f}" == f"{hi:+.1f}" else f"{lo:+.1f} to {hi:+.1f} %"


def runner_up_text(v: Verdict, line: Line) -> str:
    """'name (score +3.1 %)', per runner-up where the line's strategies have different ones ('a
    (score +7.7 %) under balance; b (score +11.1 %) under time_cost_energy'), or why there is none:
    the runner-up column is never left empty."""
    if line.call.winner is None:
        return "none: no configuration is eligible"
    by: Dict[Optional[int], List[int]] = {}
    for n, c in enumerate(line.calls):
        by.setdefault(c.runner_up, []).append(n)
    parts = []
    for k, ns in by.items():
        who = "none: no other configuration is eligible" if k is None else \
            f"{v.name(k)} (score {_gap([line.calls[n].gap_pct for n in ns])})"
        parts.append(who + ("" if len(by) == 1 else " under " + ", ".join(line.strategies[n] for n in ns)))
    return "; ".join(parts)


def tie_text(v: Verdict, line: Line) -> str:
    """How sure the line's call is, as one phrase."""
    c = line.call
    if c.winner is None:
        return ""
    if all(x.runner_up is None for x in line.calls):
        return "alone: no other configuration is eligible"
    if c.winner_alone:
        return "not judged: the winner ran once (no interval); repeat the sweep with sweep.repeats=3"
    parts = []
    if c.tied:
        parts.append("tied with " + ", ".join(v.groups[k].label for k in c.tied)
                     + " (95 % intervals overlap: the repeats cannot tell them apart)")
    if c.unjudged:
        parts.append("not judged against " + ", ".join(v.groups[k].label for k in c.unjudged) + " (one run: no interval)")
    return "; ".join(parts) or "clear: no other configuration's interval overlaps"
