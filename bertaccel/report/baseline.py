"""The run the summary compares every winner against, and why it was chosen.

In order: the run --baseline names; else the run trained on the config groups' defaults (its
logged group choices equal conf/config.yaml's defaults list: what `python -m bertaccel.run`
trains with no overrides, the natural "before"); else the slowest run (every other run is then a
speed-up, and the answer says so rather than pretending the slowest was chosen for a reason).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from bertaccel.options.baseline import default_choices, top_level_defaults

from .scoring import Row


@dataclass(frozen=True)
class Baseline:
    index: Optional[int]    # row index; None when no run can be one (see why)
    how: str                # "given" | "defaults" | "slowest" | "none"
    why: str                # the sentence the report prints


def _slowest(rows: Sequence[Row], among: Sequence[int]) -> Optional[int]:
    timed = [(rows[i].time_s, -i) for i in among if rows[i].time_s is not None]
    return -max(timed)[1] if timed else None


def named_row(rows: Sequence[Row], name: str, ids_of_name: Sequence[str] = ()) -> Optional[int]:
    """The first row a --baseline value names: a run name, a run id, or (ids_of_name) the ids of
    the runs whose MLflow name it is when the report relabelled them; None if none."""
    return next((i for i, r in enumerate(rows) if name in (r.name, r.run_id) or r.run_id in ids_of_name), None)


def choose_baseline(rows: Sequence[Row], given: Optional[int] = None) -> Baseline:
    """given: the row --baseline named (the caller resolved the name)."""
    if given is not None:
        return Baseline(given, "given", f"'{rows[given].name}', given with --baseline")
    defaults = default_choices()
    on_defaults = [i for i, r in enumerate(rows) if r.choices and all(r.choices.get(g) == o
                                                                      for g, o in defaults.items())]
    if on_defaults:
        top = top_level_defaults()
        pool = on_defaults
        for keys in (("accumulation", "num_gpus"), ("batch_size",)):  # (each narrows where it can)
            pool = [i for i in pool if all(getattr(rows[i], k) in (top[k], None) for k in keys)] or pool
        pick = pool[0] if len(pool) == 1 else _slowest(rows, pool)
        if pick is not None:
            said = ", ".join(f"{g}={o}" for g, o in defaults.items())
            # (repeats of one configuration are one baseline: the answer compares their means)
            configurations = {rows[i].group or rows[i].name for i in pool}
            more = "" if len(configurations) == 1 else f" (the slowest of the {len(pool)} runs that have them)"
            return Baseline(pick, "defaults", f"'{rows[pick].name}', the run with the config groups' defaults "
                                              f"({said}){more}; --baseline RUN_NAME picks another")
    pick = _slowest(rows, range(len(rows)))
    if pick is None:
        return Baseline(None, "none", "no baseline: no run has a time_s to compare against")
    lacking = "no run logged its config group choices (a CSV, or runs older than them)" if not any(
        r.choices for r in rows) else "no run has the config groups' defaults"
    return Baseline(pick, "slowest", f"'{rows[pick].name}', the slowest run: {lacking}; --baseline RUN_NAME "
                                     "picks another")
