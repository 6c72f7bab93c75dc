"""Short labels for a sweep's runs: the one home of how the report names a run.

A sweep names each run by its overrides, `encoder=fused,optimizer=adan_fused,precision=fp32,
train.batch_size=32`: four times the width of what tells the runs apart. Where the runs' names are
of that form, all setting the same keys, each is labelled by the values of the keys that vary among
them, in one fixed order (the order of the keys in the names), `fused / adan_fused / fp32 / 32`, and the report
says the order once under its answer. train.seed is never part of a label: runs that differ only
in it are repeats of one configuration (labelled once, 'x (3 runs)', by repeats.py), as the runs
of sweep.repeats already are. A name not of that form ('defaults', a CSV's names) stays as it is.
The full MLflow names stay in the report: each label's cell carries them as its tooltip, and the
table 'Runs' maps every label to its run's MLflow name and id.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

SEED_KEY = "train.seed"
# One item starts where a key and '=' follow a comma, so a value may hold commas ('[0.9,0.99]').
_ITEM_START = re.compile(r",(?=[+~]?[A-Za-z_][\w.@/-]*=)")
_ITEM = re.compile(r"^([+~]?[A-Za-z_][\w.@/-]*)=(.*)$", re.S)
TITLE = "Runs: each label's MLflow run name and id"


def parse(name: str) -> Optional[List[Tuple[str, str]]]:
    """[(key, value)] of a sweep's run name, or None when the name is not key=value,key=value,..."""
    items = []
    for part in _ITEM_START.split(name.strip()):
        m = _ITEM.match(part)
        if m is None:
            return None
        items.append((m.group(1).lstrip("+~"), m.group(2)))
    return items or None


@dataclass
class Labels:
    order: List[str] = field(default_factory=list)         # the keys a label shows, in its order
    same: Dict[str, str] = field(default_factory=dict)      # keys every labelled run shares -> value
    full: Dict[str, List[Tuple[str, str]]] = field(default_factory=dict)  # label -> [(MLflow name, run id)]

    def line(self) -> str:
        """The sentence under the answer that says how to read a label ('' when no run is relabelled)."""
        if not self.order:
            return ""
        shared = (f"; every run has {', '.join(f'{k}={v}' for k, v in self.same.items())}" if self.same else "")
        return (f"Runs are labelled {' / '.join(self.order)}{shared} (their MLflow names: the table "
                f"'{TITLE.split(':')[0]}' at the end, or hover a label).")

    def titles(self) -> Dict[str, str]:
        """label -> the MLflow name(s) it stands for (a cell's tooltip); only labels that shorten a name."""
        out = {}
        for label, runs in self.full.items():
            names = list(dict.fromkeys(n for n, _ in runs))
            if names != [label]:
                out[label] = "\n".join(names)
        return out

    def in_text(self, text: str) -> str:
        """text with each full run name in it replaced by its label (a prediction's basis names runs)."""
        names = sorted({n: label for label, runs in self.full.items() for n, _ in runs if n != label}.items(),
                       key=lambda kv: -len(kv[0]))
        for name, label in names:
            text = re.sub(re.escape(name) + r"(?![\w.=])", label, text)
        return text

    def name_of(self, run_id: str, default: str) -> str:
        """The MLflow name of the run with this id (the console prints it: a name to paste), else default."""
        return next((n for runs in self.full.values() for n, rid in runs if rid == run_id), default)

    def ids_of(self, name: str) -> List[str]:
        """The run ids of the runs whose MLflow name is `name` (--baseline names a run by it)."""
        return [rid for runs in self.full.values() for n, rid in runs if n == name]

    def table(self) -> Optional[tuple]:
        """The mapping as a report table (title, note, headers, rows), or None when nothing was relabelled."""
        if not self.order:
            return None
        rows = [[label, name, rid] for label, runs in self.full.items() for name, rid in runs]
        return (TITLE, self.line().removesuffix("."), ["label", "MLflow run name", "run id"], rows)


def label_of(items: Sequence[Tuple[str, str]], order: Sequence[str]) -> str:
    values = dict(items)
    return " / ".join(values[k] for k in order)


def relabel(rows: Sequence) -> Labels:
    """Give every row whose name is a sweep name its short label (rows' `name`, in place), and
    return the mapping. Only an MLflow store's rows (with a run id) are relabelled: a CSV's names are
    its author's, and its repeats are grouped by name."""
    found = {i: parse(r.name) for i, r in enumerate(rows) if r.run_id}
    out = Labels()
    for i, r in enumerate(rows):  # (every MLflow run is in the mapping, those keeping their name too)
        if r.run_id and found[i] is None:
            out.full.setdefault(r.name, []).append((r.name, r.run_id))
    parsed = {i: items for i, items in found.items() if items is not None}
    # Names that set different keys: a sweep whose added baseline takes off what every grid job sets
    # ('dataset.subset_seed=0,precision=bf16' and 'dataset.subset_seed=0': each key a name lacks
    # takes the run's own logged value, its group choice or setting), or hand-named runs
    # ('precision=bf16', 'attention=sdpa'). Those, runs of several sweeps, a value not logged, or
    # names that set only the seed (they would all read 'defaults'): the names stay as they are.
    key_sets = {frozenset(k for k, _ in items if k != SEED_KEY) for items in parsed.values()}
    one_sweep = len({rows[i].sweep for i in parsed}) == 1 and all(rows[i].sweep for i in parsed)
    filled = parsed if len(key_sets) == 1 else _filled(rows, parsed) if one_sweep else None
    if not filled or not any(key_sets):
        for i in parsed:
            out.full.setdefault(rows[i].name, []).append((rows[i].name, rows[i].run_id))
        _apart(rows, out)
        return out
    parsed = filled
    keys: List[str] = []
    for items in parsed.values():
        keys += [k for k, _ in items if k not in keys and k != SEED_KEY]
    values = {k: {dict(items).get(k) for items in parsed.values()} for k in keys}
    varying = [k for k in keys if len(values[k]) > 1]
    # One configuration alone: its values are what it is, not what tells it apart.
    out.order = varying or keys
    # (a key left out of the order has one value, and some run set it: never None)
    out.same = {k: next(v for v in values[k] if v is not None) for k in keys if k not in out.order}
    for i, items in parsed.items():
        r = rows[i]
        label = label_of(items, out.order)
        out.full.setdefault(label, []).append((r.name, r.run_id))
        r.name = label
    _apart(rows, out)
    return out


def _filled(rows: Sequence, parsed: Dict[int, List[Tuple[str, str]]]) -> Optional[Dict[int, List[Tuple[str, str]]]]:
    """Each name's items with the keys other names set and it lacks, at the run's logged value;
    None where a run did not log one."""
    keys = list(dict.fromkeys(k for items in parsed.values() for k, _ in items if k != SEED_KEY))
    out = {}
    for i, items in parsed.items():
        have, r = dict(items), rows[i]
        full = []
        for k in keys:
            v = have.get(k, r.choices.get(k, r.settings.get(k)))
            if v is None:
                return None
            full.append((k, v))
        out[i] = full
    return out


def _apart(rows: Sequence, out: Labels) -> None:
    """A label never names two configurations (an older store's sweep could give two runs one
    name): where it would, each of those runs' label gets what sets them apart, their differing
    group choices, else settings, else the run id, in brackets (repeats of one configuration,
    runs of one group, share their label)."""
    by_label: Dict[str, List[int]] = {}
    for i, r in enumerate(rows):
        if r.run_id:
            by_label.setdefault(r.name, []).append(i)
    for label, members in by_label.items():
        if len({rows[i].group or rows[i].run_id for i in members}) < 2:
            continue
        for source in ("choices", "settings"):
            keys = sorted({k for i in members for k in getattr(rows[i], source)} - {SEED_KEY})
            differ = [k for k in keys if len({getattr(rows[i], source).get(k) for i in members}) > 1][:3]
            if differ:
                break
        runs = out.full.pop(label, [])
        for i in members:
            r = rows[i]
            said = ", ".join(f"{k}={getattr(r, source).get(k, '?')}" for k in differ) if differ else f"run {r.run_id[:8]}"
            name = next((n for n, rid in runs if rid == r.run_id), r.name)
            r.name = f"{label} [{said}]"
            out.full.setdefault(r.name, []).append((name, r.run_id))
