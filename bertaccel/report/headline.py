"""The answer in words and cells: the headline, the answer table, and the lines the console, the
MLflow parent run's description and the results-at-a-glance page print. All of them render one
Answer (summary.py) with the same phrases (change.py), so no two surfaces can name different
winners or different numbers.

The headline claims no more than the evidence: a tie is called a tie only for the strategies that
are tied, and names what it is between; where the user's baseline wins or ties, it says "keep what
you run" and still gives what the best alternative would cost; a baseline under the accuracy floor
is said first; a winner slower than the baseline reads "1.89x slower", never "0.53x".
"""
from __future__ import annotations

import textwrap
from typing import Callable, List

from .change import Change, effect_text, pct_text, pts_text, speed_text
from .summary import TITLE, Answer, Winner


WIDTH = 100  # the headline's lines on a console (the other lines are one fact each)
MOST_NAMED = 3  # tied configurations the headline names before "and N more"


def _quoted(names: List[str]) -> str:
    return ", ".join(f"'{n}'" for n in names)


def _against(ans: Answer, w: Winner) -> str:
    return "the baseline" if not ans.baselines.split else f"its group's baseline '{w.base_name}'"


def _alternative(w: Winner) -> str:
    """What switching would cost, where the answer is to keep the baseline."""
    alt = w.alternative
    if alt is None:
        return "no other configuration may win (see the floor)"
    return f"'{alt.name}' would mean {effect_text(alt)}"


def _under(ans: Answer, ws: List[Winner]) -> str:
    """The strategies of ws as a phrase: 'every strategy' when they are all of the answer's."""
    strategies = [x for w in ws for x in w.strategies]
    total = sum(len(w.strategies) for w in ans.winners)
    if len(strategies) == total and len(strategies) > 1:
        return "every strategy"
    # (more than two: counted; the table names them)
    return ", ".join(strategies) if len(strategies) <= 2 else f"{len(strategies)} of the {total} strategies"


def _ties(ans: Answer, ws: List[Winner], also: str = "") -> str:
    """', tied under S with 'a', 'b' (the repeats cannot tell them apart)' for the tied lines of ws."""
    tied = [w for w in ws if w.tied_with]
    if not tied:
        return ""
    under = "" if len(tied) == len(ws) else f" under {_under(ans, tied)}"
    names = list(dict.fromkeys(t for w in tied for t in w.tied_with))
    # (the headline names the first few; the table's 'how sure' column names them all)
    more = f" and {len(names) - MOST_NAMED} more" if len(names) > MOST_NAMED else ""
    return f", tied{under} with {_quoted(names[:MOST_NAMED])}{more}{also} (the repeats cannot tell them apart)"


def _phrase(ans: Answer, ws: List[Winner]) -> str:
    """One winner in words: under which strategies it leads, at what change, how sure."""
    w = ws[0]
    verb = "leads under" if any(x.tied_with for x in ws) else "is best under"
    if w.is_baseline:
        return f"the baseline '{w.name}' {verb} {_under(ans, ws)}{_ties(ans, ws)}"
    also = ", the baseline among them" if any(x.keep for x in ws) else ""
    return (f"'{w.name}' {verb} {_under(ans, ws)} ({effect_text(w.change)} against {_against(ans, w)})"
            + _ties(ans, ws, also))


def _by_winner(named: List[Winner]) -> List[List[Winner]]:
    out: dict = {}
    for w in named:
        out.setdefault(w.configuration, []).append(w)
    return list(out.values())


def headline(ans: Answer) -> str:
    """The answer in a few sentences, never stronger than the repeats."""
    named = [w for w in ans.winners if w.configuration is not None]
    first = ans.base_below_floor + " " if ans.base_below_floor else ""
    if not named:
        return first + "No configuration is eligible to win under any strategy (see the scores' notes)."
    if ans.configurations == 1:
        return (first + f"Nothing to choose between: every run is one configuration, '{named[0].name}' (repeats "
                "differ only in their seed); its spread is in the repeats' table.")
    every = len(named) == len(ans.winners)
    phrases = [_phrase(ans, ws) for ws in _by_winner(named)]
    if every and all(w.keep for w in named):  # the user's baseline wins or ties everywhere
        by_alt: dict = {}
        for w in named:
            if w.is_baseline:
                by_alt.setdefault(_alternative(w), []).append(w)
        alts = [f"switching to the best alternative, {a}" if len(by_alt) == 1 else
                f"under {_under(ans, ws)}, switching to the best alternative, {a}" for a, ws in by_alt.items()]
        if all(w.is_baseline for w in named):
            verb = "leads under" if any(w.tied_with for w in named) else "is best under"
            how = f"it {verb} {_under(ans, named)}{_ties(ans, named)}"
        else:
            how = "no configuration is clearly better under any strategy: " + "; ".join(phrases)
        alts = [a[0].upper() + a[1:] for a in alts]
        return first + f"Keep what you run, '{named[0].base_name}': {how}." + "".join(f" {a}." for a in alts)
    if len(phrases) == 1 and every and not any(w.tied_with or w.keep for w in named):
        w = named[0]
        whom = "every strategy" if len(w.strategies) > 1 or len(named) > 1 else w.label
        return first + f"Adopt '{w.name}', best under {whom}: {effect_text(w.change)} against {_against(ans, w)}."
    if len(phrases) == 1:
        return first + phrases[0][0].upper() + phrases[0][1:] + "."
    if not any(w.tied_with for w in named):
        lead = f"The weights decide: {len(phrases)} configurations win under different strategies"
        lead += "" if any(w.line.call.winner_alone for w in named) else ", each clearly"
    elif all(w.tied_with for w in named):
        lead = "No clear winner: under every strategy the repeats cannot tell the leader from others"
    else:
        lead = f"{len(phrases)} configurations lead under different strategies, some of them tied"
    return first + f"{lead}. " + "; ".join(ph[0].upper() + ph[1:] for ph in phrases) + "."


def _cells(c: Change, prefix: str = "") -> List[str]:
    return [prefix + speed_text(c.speedup, c.why.get("time_s", "no baseline")), prefix + pct_text(c, "energy_kwh"),
            prefix + pct_text(c, "cost_usd"), prefix + pts_text(c)]


def winner_cell(w: Winner) -> str:
    """The winner as every table names it."""
    if w.configuration is None:
        return "none eligible"
    return f"{w.name} (the baseline: keep it)" if w.is_baseline else w.name


def answer_table(ans: Answer, label: Callable[[str], str]) -> tuple:
    """(title, note, headers, rows of cells), as render.py's tables; label: the basis' column labels."""
    unit = " per sample" if ans.per_sample else ""
    cells: List[List[str]] = []
    for w in ans.winners:
        if w.configuration is None:
            cells.append([w.label, "none eligible", "", "", "", "", "", w.runner_up, "", ""]
                         + [""] * ans.baselines.split)
            continue
        shown = w.shown
        prefix = f"{shown.name}: " if w.is_baseline and w.alternative is not None else ""
        vs_best = "null (no accuracy)" if w.vs_best_pts is None else f"{w.vs_best_pts:+.2f} pts"
        cells.append([w.label, winner_cell(w)] + _cells(shown, prefix) + [vs_best, w.runner_up, w.sure,
                                                                          "; ".join(w.warnings)]
                     + ([w.base_name or "none"] if ans.baselines.split else []))
    whose = ("; each winner against its own like-for-like group's baseline (column 'baseline'), never another "
             "model's, dataset's, hardware's or GPU count's") if ans.baselines.split else ""
    note = (f"speed = the baseline's {label('time_s')} / the winner's{unit} (means over repeats); energy and cost "
            f"change = the winner's / the baseline's - 1{unit}; accuracy in percentage points, against the baseline "
            "and against the most accurate configuration; where the baseline itself wins, the changes are those of "
            f"the best alternative (named in the cell), what switching would cost{whose}")
    return (TITLE, note, ["strategy", "winner", "speed vs baseline", "energy change", "cost change", "accuracy change",
                          "accuracy vs best", "runner-up (score gap)", "how sure", "warnings"]
            + (["baseline"] if ans.baselines.split else []), cells)


def console_lines(ans: Answer) -> List[str]:
    """The answer as the console prints it (and the MLflow description and the docs quote): per
    line of strategies, 'best:' and the winner, then its change, runner-up and how sure, indented."""
    out = []
    for w in ans.winners:
        out.append(f"{w.label:18s} best: {winner_cell(w)}")
        if w.configuration is None:
            out.append(f"    runner-up: {w.runner_up}")
            continue
        shown = w.shown
        against = f"against '{w.base_name}'" if w.base_name else "(no baseline)"
        what = f"switching to '{shown.name}': " if w.is_baseline and w.alternative is not None else ""
        out += [f"    {what}{effect_text(shown)} {against}", f"    runner-up: {w.runner_up}", f"    how sure: {w.sure}"]
    return out


def answer_text(ans: Answer) -> str:
    """The headline and the console lines: what the console prints, the report folder keeps as
    answer.txt, and the sweep's MLflow parent run shows as its description."""
    # (a number keeps its unit on its line: "-7.7 %" is never split)
    wrapped = textwrap.wrap(headline(ans).replace(" %", "\0%").replace(" pts", "\0pts"), WIDTH, break_on_hyphens=False)
    return "\n".join([line.replace("\0", " ") for line in wrapped] + console_lines(ans))
