"""The comparability gate: runs of different sweeps, measured on different devices, datasets or
numbers of rows, or whose energy comes from different meters, are not ranked together without a warning.

A CPU package's RAPL energy and a GPU board's NVML energy measure different things; a run on 512
rows and one on 120,000 trained different amounts and were tested on different sets. Ranking
them is allowed (comparing hardware is one point of the report) but every table that ranks such
runs together says what differs.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable, List, Optional, Sequence, Tuple

from .scoring import Row

UNKNOWN = "not given"
NO_SWEEP = "none (a single run)"
# (what differs, the row's value): a CSV without a device column names its hardware instead;
# the energy source counts only for runs that have an energy to rank; the sweep only for MLflow
# runs (a CSV row has no sweep id): runs of two sweeps may be of two commits or two machines.
KEYS: Tuple[Tuple[str, Callable[[Row], Optional[str]]], ...] = (
    ("sweep", lambda r: (r.sweep or NO_SWEEP) if r.run_id else None),
    ("device", lambda r: r.device or r.hardware or UNKNOWN),
    ("dataset", lambda r: r.dataset or UNKNOWN),
    ("train rows per epoch", lambda r: UNKNOWN if r.train_rows is None else str(r.train_rows)),
    ("test rows", lambda r: UNKNOWN if r.test_rows is None else str(r.test_rows)),
    ("energy source", lambda r: None if r.energy_kwh is None else (r.energy_source or UNKNOWN)),
)


def differences(rows: Sequence[Row]) -> List[str]:
    """What the rows differ in, e.g. 'device: cpu (4 runs), NVIDIA H200 (2 runs)'."""
    out = []
    for label, value in KEYS:
        counts = Counter(v for v in (value(r) for r in rows) if v is not None)
        if len(counts) > 1:
            out.append(f"{label}: " + ", ".join(f"{v} ({n} run{'s' if n > 1 else ''})" for v, n in counts.most_common()))
    return out


def warning(rows: Sequence[Row]) -> str:
    """The warning line of a table that ranks these rows together, or "" when they agree."""
    diff = differences(rows)
    if not diff:
        return ""
    return "WARNING, not like for like: the runs ranked here differ in " + "; ".join(diff)


def with_warning(note: str, rows: Sequence[Row]) -> str:
    """A table's note with the gate's warning for its rows first."""
    w = warning(rows)
    return "; ".join(filter(None, (w, note)))
