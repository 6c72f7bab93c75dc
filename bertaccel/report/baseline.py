"""The runs the answer compares each winner against, and why each was chosen.

Like with like: the runs fall into groups of one context (options/baseline.py LIKE_FOR_LIKE: the
model, the dataset, the hardware profile and the GPU count, and any model, dataset or hardware
setting the runs vary), and each group has its own baseline; a run is never measured against
another model's. Computed once (choose_baselines) and read by every surface: the answer, the
effects table's references, the table of every run against its baseline, the answer's chart.

Per group, in order: the run --baseline names (in its group); else the run trained on the
defaults: its logged group choices equal conf/config.yaml's defaults list (what
`python -m bertaccel.run` trains with no overrides, the natural "before"), narrowed to the one at
the default of every other setting the runs vary (accumulation, the batch size, a learning rate:
where a run has it); else the slowest run (every other run is then a speed-up, and the answer
says so rather than pretending the slowest was chosen for a reason).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from bertaccel.config import GROUPS
from bertaccel.options.baseline import LIKE_FOR_LIKE, default_choices, default_of, norm, top_level_defaults

from .scoring import Row

# Settings that say where results go or how a run is told apart, never a technique's value.
NOT_COMPARED = ("train.seed", "accumulation", "num_gpus", "train.batch_size")
NOT_COMPARED_ROOTS = ("tracking", "cache_dir", "sweep", "carbon", "search", "launcher", "hydra")


@dataclass(frozen=True)
class Baseline:
    index: Optional[int]    # row index; None when no run can be one (see why)
    how: str                # "given" | "defaults" | "slowest" | "none"
    why: str                # the sentence the report prints
    said: str = ""          # the same, short: what a group's line says of it


@dataclass(frozen=True)
class Group:
    label: str                  # 'model=tiny': the context values that tell the groups apart
    members: Tuple[int, ...]
    baseline: Baseline


@dataclass(frozen=True)
class Baselines:
    """The like-for-like groups and each one's baseline; of_row: each row's group."""
    groups: Tuple[Group, ...]
    of_row: Tuple[int, ...]

    def of(self, i: int) -> Baseline:
        return self.groups[self.of_row[i]].baseline

    def group(self, i: int) -> Group:
        return self.groups[self.of_row[i]]

    @property
    def split(self) -> bool:
        return len(self.groups) > 1

    @property
    def indices(self) -> List[int]:
        return [g.baseline.index for g in self.groups if g.baseline.index is not None]

    def sentence(self) -> str:
        """What the answer says of its baseline(s), without the final full stop."""
        if not self.split:
            return f"Baseline: {self.groups[0].baseline.why}"
        parts = "; ".join(f"{g.label}: {g.baseline.said}" for g in self.groups)
        return (f"Baselines, one per like-for-like group ({', '.join(LIKE_FOR_LIKE)}: a run is compared with its own "
                f"group's only): {parts}; the config groups' defaults are "
                + ", ".join(f"{g}={o}" for g, o in default_choices().items())
                + "; --baseline RUN_NAME picks another for its group")


def _slowest(rows: Sequence[Row], among: Sequence[int]) -> Optional[int]:
    timed = [(rows[i].time_s, -i) for i in among if rows[i].time_s is not None]
    return -max(timed)[1] if timed else None


def context_of(r: Row) -> Dict[str, str]:
    """A row's context: model, dataset, hardware profile and GPU count, and every model.*,
    dataset.* and hardware.* setting it logged ('' where unknown: a CSV row has no model)."""
    out = {"model": r.choices.get("model", ""), "dataset": r.dataset or r.choices.get("dataset", ""),
           "hardware": r.hardware or r.choices.get("hardware", ""),
           "num_gpus": "" if r.num_gpus is None else str(r.num_gpus)}
    for k, v in r.settings.items():
        if "." in k and k.split(".", 1)[0] in LIKE_FOR_LIKE:
            out[k] = v
    return out


def like_groups(rows: Sequence[Row]) -> Tuple[List[Tuple[int, ...]], List[str]]:
    """(the groups' members in row order, each group's label). A setting of the context counts
    only where it varies among runs of one model, dataset, hardware and GPU count (a model's
    own settings differ with the model: they add nothing to its name)."""
    contexts = [context_of(r) for r in rows]
    seen: Dict[Tuple[Tuple[str, ...], str], set] = {}   # (main context, key) -> its values there
    have: Dict[Tuple[Tuple[str, ...], str], int] = {}   # (main context, key) -> runs that logged it
    runs: Dict[Tuple[str, ...], int] = {}                # main context -> its runs
    for c in contexts:
        main = tuple(c[k] for k in LIKE_FOR_LIKE)
        runs[main] = runs.get(main, 0) + 1
        for k, v in c.items():
            seen.setdefault((main, k), set()).add(v)
            have[(main, k)] = have.get((main, k), 0) + 1
    # (a key some runs of one main context lack varies too: '' is its value there)
    extra = sorted({k for (main, k), vs in seen.items()
                    if k not in LIKE_FOR_LIKE and (len(vs) > 1 or have[(main, k)] < runs[main])})
    keys = list(LIKE_FOR_LIKE) + extra
    full = [tuple(c.get(k, "") for k in keys) for c in contexts]
    order = list(dict.fromkeys(full))
    varying = [n for n, k in enumerate(keys) if len({f[n] for f in order}) > 1]
    labels = [", ".join(f"{keys[n]}={f[n] or '?'}" for n in varying) for f in order]
    members: Dict[Tuple[str, ...], List[int]] = {g: [] for g in order}  # (one pass: not groups x rows)
    for i, f in enumerate(full):
        members[f].append(i)
    return [tuple(members[g]) for g in order], labels


def _varying_settings(rows: Sequence[Row], pool: Sequence[int]) -> List[str]:
    """The settings (not a group's choice, the seed, the context or where results go) whose
    values differ among these runs, in a fixed order."""
    keys = sorted({k for i in pool for k in rows[i].settings})
    out = []
    for k in keys:
        root = k.split(".", 1)[0]
        if k in GROUPS or k in NOT_COMPARED or root in NOT_COMPARED_ROOTS or root in LIKE_FOR_LIKE:
            continue
        if len({norm(rows[i].settings.get(k)) for i in pool}) > 1:
            out.append(k)
    return out


def _on_defaults(rows: Sequence[Row], members: Sequence[int]) -> Optional[Baseline]:
    """The defaults run among members, or None when no run has the config groups' defaults."""
    defaults = default_choices()
    pool = [i for i in members if rows[i].choices and all(rows[i].choices.get(g) == o for g, o in defaults.items())]
    if not pool:
        return None
    top = top_level_defaults()
    for keys in (("accumulation", "num_gpus"), ("batch_size",)):  # (each narrows where it can)
        pool = [i for i in pool if all(getattr(rows[i], k) in (top[k], None) for k in keys)] or pool
    lacking = []
    for key in _varying_settings(rows, pool):  # a swept learning rate: its default, where a run has it
        want = default_of(key)
        at = [i for i in pool if norm(rows[i].settings.get(key)) == want]
        if at:
            pool = at
        elif want is not None:
            lacking.append(f"{key}={want}")
    pick = pool[0] if len(pool) == 1 else _slowest(rows, pool)
    if pick is None:
        return None
    said = ", ".join(f"{g}={o}" for g, o in defaults.items())
    # (repeats of one configuration are one baseline: the answer compares their means)
    configurations = {rows[i].group or rows[i].name for i in pool}
    more = "" if len(configurations) == 1 else f" (the slowest of the {len(pool)} runs that have them)"
    if lacking:
        more += f"; no run has the default {', '.join(lacking)}"
    short = f"'{rows[pick].name}', the run with the config groups' defaults{more}"
    return Baseline(pick, "defaults", f"'{rows[pick].name}', the run with the config groups' defaults "
                                      f"({said}){more}; --baseline RUN_NAME picks another", short)


def choose_baseline(rows: Sequence[Row], given: Optional[int] = None,
                    members: Optional[Sequence[int]] = None) -> Baseline:
    """The baseline among members (every row when None). given: the row --baseline named (the
    caller resolved the name)."""
    members = range(len(rows)) if members is None else members
    if given is not None:
        return Baseline(given, "given", f"'{rows[given].name}', given with --baseline",
                        f"'{rows[given].name}', given with --baseline")
    found = _on_defaults(rows, members)
    if found is not None:
        return found
    pick = _slowest(rows, members)
    if pick is None:
        return Baseline(None, "none", "no baseline: no run has a time_s to compare against",
                        "none: no run of it has a time_s to compare against")
    lacking = "no run logged its config group choices (a CSV, or runs older than them)" if not any(
        rows[i].choices for i in members) else "no run has the config groups' defaults"
    return Baseline(pick, "slowest", f"'{rows[pick].name}', the slowest run: {lacking}; --baseline RUN_NAME "
                                     "picks another",
                    f"no baseline of its own ({lacking}): its slowest run, '{rows[pick].name}', stands in")


def choose_baselines(rows: Sequence[Row], given: Optional[int] = None) -> Baselines:
    """One baseline per like-for-like group; given (--baseline) is its own group's."""
    members, labels = like_groups(rows)
    groups, of_row = [], [0] * len(rows)
    for n, (m, label) in enumerate(zip(members, labels)):
        groups.append(Group(label, m, choose_baseline(rows, given if given in m else None, m)))
        for i in m:
            of_row[i] = n
    return Baselines(tuple(groups), tuple(of_row))


def named_rows(rows: Sequence[Row], name: str, ids_of_name: Sequence[str] = ()) -> List[int]:
    """The rows a --baseline value names: by run name (or label), by run id, or (ids_of_name)
    the ids of the runs whose MLflow name it is when the report relabelled them."""
    return [i for i, r in enumerate(rows) if name in (r.name, r.run_id) or r.run_id in ids_of_name]


def named_row(rows: Sequence[Row], name: str, ids_of_name: Sequence[str] = ()) -> Optional[int]:
    """The one row a --baseline value names; None if none. Raises ValueError (one line, the
    candidates listed) where it names runs of two configurations: a name identifies one thing,
    never resolved silently. Repeats of one configuration are one baseline (their first run)."""
    found = named_rows(rows, name, ids_of_name)
    configurations = list(dict.fromkeys(rows[i].group or rows[i].run_id or str(i) for i in found))
    if len(configurations) > 1:
        listed = ", ".join(f"{rows[i].run_id} ({rows[i].name})" if rows[i].run_id else repr(rows[i].name)
                           for i in found[:6])
        raise ValueError(f"--baseline {name!r} names {len(found)} runs of {len(configurations)} configurations: "
                         f"give one by its run id: {listed}")
    return found[0] if found else None
