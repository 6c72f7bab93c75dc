"""The effect of each axis (issue 44, item 5): what each swept value buys against its axis's
reference, the other axes held equal; "what does fp16 buy?" answered right after the answer.

Axes. A run's keys are its config group choices (as logged; a CSV's precision, hardware, dataset
and compile columns stand in where it has none), accumulation, num_gpus, train.batch_size,
train.epochs, the device it measured on, and the key=value items of its name (a sweep names a run
by its swept overrides, so a swept train.lr is found there; a run whose name lacks a key others
have takes the key's default, else it is unknown). train.seed and where results go are not keys.
An axis is a key with more than one value among the runs, unless it varies only because another
does: a key whose value follows from another's (over the runs) is folded into that axis and named
beside it ("precision (with train.batch_size, which varies with it)"); of two keys that follow
each other, the first in the order above stays.

Pairs. For an axis and each value v other than its reference, a pair is a configuration at v and
the configuration at the reference with every other axis equal (an unknown value equals
nothing). A configuration is the runs equal in every axis (repeats, which differ only in their
seed), averaged first; one missing a metric in any of its runs has that metric null, and runs
that the repeats' grouping keeps apart but no axis does (they differ in something their choices
and names do not show) are averaged all the same with a warning in the note. Over the pairs:
speed-up = the geometric mean of time_ref / time_v (the report's time basis), with the smallest
and largest pair as its spread; energy = the geometric mean of energy_v / energy_ref - 1, in %;
accuracy = the mean of acc_v - acc_ref in percentage points (x100), smallest to largest in
brackets. Where the runs trained different numbers of samples, time and energy are per sample (as
the answer's are). A value without a pair says so, never a number; a metric missing from some
pairs says over how many it is; one missing from all is null with the reason.

Reference. The axis's default (the config groups' defaults list, conf/config.yaml's top-level
values, then RunConfig's) when a run has it and it pairs with another value; else the value of
the answer's baseline run, on the same terms; else the first value that pairs (in numeric order
where every value is a number, else in the order the runs came). The table's note says which and why.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from bertaccel.options.baseline import default_of, norm

from .repeats import group_rows
from .scoring import Row

TITLE = "The effect of each axis"
Table = tuple  # (title, note, headers, rows of cells), as render.py
# Row fields that are keys of their own, by the name a run is overridden with.
# device: what the run measured on (a sweep's runs share it; runs of two machines differ in it).
FIELD_KEYS = (("accumulation", "accumulation"), ("num_gpus", "num_gpus"), ("train.batch_size", "batch_size"),
              ("train.epochs", "epochs"), ("device", "device"))
# A CSV has no group choices: these columns (Row fields) stand in for them.
COLUMN_GROUPS = {"precision": "precision", "hardware": "hardware", "dataset": "dataset", "compile": "compile_mode"}
NOT_KEYS = ("train.seed",)


def _name_items(name: str) -> Dict[str, str]:
    """'precision=fp16,train.lr=1e-4' -> its items; {} for a name that is not key=value items."""
    from bertaccel.record.tracking import HASH_EXCLUDED_KEYS

    items = [p.split("=", 1) for p in name.split(",")]
    if not name or any(len(p) != 2 or not p[0].strip() for p in items):
        return {}
    out = {k.strip().lstrip("+~"): v.strip() for k, v in items}
    return {k: v for k, v in out.items() if k not in NOT_KEYS and k.split(".")[0] not in HASH_EXCLUDED_KEYS}


def run_keys(rows: Sequence[Row]) -> List[Dict[str, Optional[str]]]:
    """Each row's keys and values (None: unknown), every row with the same keys."""
    from bertaccel.config import GROUPS

    out = []
    for r in rows:
        keys: Dict[str, Optional[str]] = {}
        for g in GROUPS:
            column = COLUMN_GROUPS.get(g)
            keys[g] = norm(r.choices.get(g)) if r.choices else (norm(getattr(r, column)) if column else None)
        for key, attr in FIELD_KEYS:
            keys[key] = norm(getattr(r, attr))
        named = _name_items(r.name)
        keys.update({k: norm(v) for k, v in named.items() if k not in keys})
        out.append(keys)
    every = list(dict.fromkeys(k for keys in out for k in keys))
    defaults: Dict[str, Optional[str]] = {}
    for keys in out:
        for k in every:
            if k not in keys:  # a name without a key other names have: the run kept the default
                if k not in defaults:
                    defaults[k] = default_of(k)
                keys[k] = defaults[k]
    return out


def _follows(values: Sequence[Dict[str, Optional[str]]], k: str, j: str) -> bool:
    """Whether k's value follows from j's over the runs (one k value for each j value)."""
    seen: Dict[Optional[str], Optional[str]] = {}
    return all(seen.setdefault(v[j], v[k]) == v[k] for v in values)


@dataclass
class Axis:
    key: str
    values: List[str]                     # in order: numeric where all are numbers, else as the runs came
    with_keys: List[str] = field(default_factory=list)  # keys that vary only with it
    reference: str = ""
    why: str = ""

    @property
    def label(self) -> str:
        if not self.with_keys:
            return self.key
        verb = "vary" if len(self.with_keys) > 1 else "varies"
        return f"{self.key} (with {', '.join(self.with_keys)}, which {verb} with it)"


def find_axes(values: Sequence[Dict[str, Optional[str]]]) -> List[Axis]:
    keys = list(values[0]) if values else []
    varying = [k for k in keys if len({v[k] for v in values if v[k] is not None}) > 1]

    def over(j: str, k: str) -> bool:
        """k varies only because j does: k follows from j, and j not from k (or j comes first)."""
        return j != k and _follows(values, k, j) and (not _follows(values, j, k)
                                                       or varying.index(j) < varying.index(k))

    kept = [k for k in varying if not any(over(j, k) for j in varying)]
    axes = []
    for k in kept:
        seen = list(dict.fromkeys(x for x in (v[k] for v in values) if x is not None))
        try:
            seen.sort(key=float)
        except ValueError:
            pass
        # ("over" is a strict order, so a folded key always has a kept key above it.)
        folded = [f for f in varying if f not in kept and next(j for j in kept if over(j, f)) == k]
        axes.append(Axis(k, seen, folded))
    return axes


@dataclass
class Cell:
    """One configuration: the mean of each metric over its runs, or why it is null."""
    value: Dict[str, Optional[float]]
    why: Dict[str, str]
    members: Tuple[int, ...] = ()         # the rows averaged (report/glance.py judges noise over them)


def _cell(rows: Sequence[Row], members: Sequence[int], per_sample: bool) -> Cell:
    value: Dict[str, Optional[float]] = {}
    why: Dict[str, str] = {}
    for col in ("time_s", "energy_kwh", "accuracy"):
        got: List[Optional[float]] = []
        for i in members:
            v = rows[i].get(col)
            if v is None:
                why[col] = f"{col} null: {rows[i].extra.get(col, 'not measured')}"
            elif per_sample and col != "accuracy":  # (as the answer compares them)
                samples = rows[i].train_samples
                v = v / samples if samples else None
                if v is None:
                    why[col] = "train_samples unknown, and the runs trained different amounts"
            got.append(v)
        known = [g for g in got if g is not None]
        value[col] = None if len(known) < len(got) else sum(known) / len(known)
    return Cell(value, why, tuple(members))


@dataclass
class Effect:
    axis: Axis
    value: str
    pairs: List[Tuple[Cell, Cell]]        # (at the value, at the reference)
    example: str = ""                     # the other axes of a configuration at the value, when unpaired


@dataclass
class Effects:
    axes: List[Axis]                      # with their references
    found: List[Effect]                   # one per value other than its axis's reference
    per_sample: bool                      # time and energy per sample (the runs trained different amounts)
    merged: List[str] = field(default_factory=list)  # configurations of runs the repeats tell apart


def effects(rows: Sequence[Row], baselines: Sequence[int] = ()) -> Effects:
    """baselines: the rows that are the answer's baselines, one per like-for-like group (baseline.py;
    one row index or None as well)."""
    baselines = [baselines] if isinstance(baselines, int) else list(baselines or ())
    values = run_keys(rows)
    axes = find_axes(values)
    per_sample = len({r.train_samples for r in rows if r.train_samples is not None}) > 1
    if not axes:
        return Effects([], [], per_sample)
    by_config: Dict[Tuple, List[int]] = {}
    for i, keys in enumerate(values):  # runs with every axis equal are one configuration (repeats)
        by_config.setdefault(tuple(keys[a.key] for a in axes), []).append(i)
    cells = {c: _cell(rows, m, per_sample) for c, m in by_config.items()}
    # Runs equal in every axis that the repeats' grouping keeps apart differ in something their
    # choices and names do not show: averaged all the same, and said.
    group_of = {i: g for g in group_rows(rows) for i in g.members}
    merged = [" + ".join(dict.fromkeys(group_of[i].label for i in m)) for m in by_config.values()
              if len({group_of[i].key for i in m}) > 1]
    out = []
    for x, axis in enumerate(axes):
        def partner(c: Tuple, ref: str) -> Optional[Tuple]:
            other = c[:x] + (ref,) + c[x + 1:]
            known = all(v is not None for k, v in enumerate(c) if k != x)
            return other if known and other != c and other in cells else None

        def paired(v: str, ref: str) -> bool:
            return any(c[x] == v and partner(c, ref) for c in cells)

        axis.reference, axis.why = _reference(axis, values, baselines, rows,
                                              lambda ref: any(paired(v, ref) for v in axis.values if v != ref))
        for v in axis.values:
            if v == axis.reference:
                continue
            mine = [c for c in cells if c[x] == v]
            pairs = [(cells[c], cells[p]) for c in mine if (p := partner(c, axis.reference))]
            example = ", ".join(f"{a.key}={c}" for a, c in zip(axes, mine[0]) if a is not axis) if mine else ""
            out.append(Effect(axis, v, pairs, example))
    return Effects(axes, out, per_sample, merged)


def _reference(axis: Axis, values, baselines: Sequence[int], rows: Sequence[Row],
               pairs_with: Callable[[str], bool]) -> Tuple[str, str]:
    """(the reference value, why): the default, else a baseline's (each group's in turn), else the
    first value, the first of these that pairs with another value; where none does, the first of them."""
    default = default_of(axis.key)
    said: List[str] = []
    tried: List[Tuple[str, str]] = []
    if default in axis.values:
        tried.append((default, "the default"))
    else:
        said.append(f"the default {default} is not among the runs" if default else "no default known")
    for b in baselines:
        v = values[b][axis.key]
        if v in axis.values and v != default and v not in [t for t, _ in tried]:
            tried.append((v, f"the answer's baseline '{rows[b].name}' has it"))
    for ref, why in tried:
        if pairs_with(ref):
            return ref, "; ".join(said + [why])
        said.append(f"{ref} ({why}) pairs with no other value")
    first = next((v for v in axis.values if pairs_with(v)), None)
    if first is None:
        return (tried or [(axis.values[0], "")])[0][0], "; ".join(said + ["no value pairs with another"])
    return first, "; ".join(said + ["the first value" + ("" if first == axis.values[0] else " that pairs")])


def _geo(xs: Sequence[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _over(pairs: Sequence[Tuple[Cell, Cell]], col: str) -> Tuple[List[Tuple[float, float]], str]:
    """The pairs' (value, reference) of col where both are known and usable, and why others are not."""
    got, why = [], ""
    for at, ref in pairs:
        a, b = at.value[col], ref.value[col]
        if a is None or b is None:
            why = why or (at.why.get(col, "") if a is None else "reference's " + ref.why.get(col, ""))
        elif col != "accuracy" and (a <= 0 or b <= 0):
            why = why or f"{col} is 0"
        else:
            got.append((a, b))
    return got, why


def _of(got: Sequence, n: int) -> str:
    return "" if len(got) == n else f" ({len(got)} of {n} pairs)"


def effect_cells(e: Effect) -> List[str]:
    head = [e.axis.label, f"{e.value} vs {e.axis.reference}"]
    n = len(e.pairs)
    if not n:
        return head + [f"no pair: no {e.axis.key}={e.axis.reference} run has the other axes' values of a "
                       f"{e.axis.key}={e.value} run" + (f" ({e.example})" if e.example else ""), "", "", "", "none"]
    cells = []
    got, why = _over(e.pairs, "time_s")
    if got:
        r = [b / a for a, b in got]
        cells += [f"{_geo(r):.2f}x{_of(got, n)}", "one pair" if len(r) == 1 else f"{min(r):.2f}x to {max(r):.2f}x"]
    else:
        cells += [f"null ({why})", ""]
    got, why = _over(e.pairs, "energy_kwh")
    if got:
        r = [(a / b - 1) * 100 for a, b in got]
        spread = "" if len(r) == 1 else f" ({min(r):+.1f} to {max(r):+.1f} %)"
        cells.append(f"{(_geo([a / b for a, b in got]) - 1) * 100:+.1f} %{spread}{_of(got, n)}")
    else:
        cells.append(f"null ({why})")
    got, why = _over(e.pairs, "accuracy")
    if got:
        d = [(a - b) * 100 for a, b in got]
        spread = "" if len(d) == 1 else f" ({min(d):+.2f} to {max(d):+.2f})"
        cells.append(f"{sum(d) / len(d):+.2f}{spread}{_of(got, n)}")
    else:
        cells.append(f"null ({why})")
    return head + cells + [str(n)]


def _contexts(axes: Sequence[Axis]) -> str:
    """The note's word on axes that are contexts (what is trained and where), not techniques."""
    from bertaccel.options.baseline import LIKE_FOR_LIKE

    said = [a.key for a in axes if a.key in LIKE_FOR_LIKE]
    return (f". {', '.join(said)}: a context, not a technique (what is trained, or where): each technique's pairs "
            "hold it equal, and the answer compares runs only with their own context's baseline" if said else "")


def effects_tables(rows: Sequence[Row], baselines: Sequence[int] = (),
                   lab: Callable[[str], str] = lambda c: c) -> List[Table]:
    """The effects table, or none where no axis varies (one configuration, or runs that say nothing
    of their configuration); lab: the report's time basis label."""
    e = effects(rows, baselines)
    if not e.found:
        return []
    unit = " per sample" if e.per_sample else ""
    refs = "; ".join(f"{a.key}: {a.reference} ({a.why})" for a in e.axes)
    merged = (f". WARNING: {len(e.merged)} configuration(s) here are runs equal in every axis that differ in "
              f"something else (their choices and names do not show it), averaged together: "
              + ", ".join(e.merged[:3]) if e.merged else "")
    note = (("the runs trained different numbers of samples, so time and energy are per sample; " if unit else "")
            + f"a pair = two configurations that differ in this axis only, each the mean over its repeats; speed-up = "
            f"geometric mean over the pairs of the reference's {lab('time_s')} / the value's{unit}, spread = the "
            f"smallest to the largest pair; energy = geometric mean of energy_kwh value / reference - 1{unit}; "
            f"accuracy = mean change in test accuracy points (smallest to largest in brackets). "
            f"References: {refs}{merged}{_contexts(e.axes)}")
    return [(f"{TITLE} (each value against the axis's reference, the other axes held equal)", note,
             ["axis", "value vs reference", "speed-up (geo. mean)", "spread", "energy", "accuracy (pts)", "pairs"],
             [effect_cells(x) for x in e.found])]
