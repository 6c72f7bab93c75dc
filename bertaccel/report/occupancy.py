"""Which measurement plays O in the score (--occupancy-metric).

The thesis' O is SM occupancy (warps resident / max warps per SM). On Hopper, occupancy is ~13%
even for a saturated tensor-core GEMM while SM activity is ~91% (collectors/gpm.py), so a run
that keeps the tensor cores busy with few resident warps scores as "idle". The collectors log
all three (NVML GPM SM_OCCUPANCY, SM_UTIL, ANY_TENSOR_UTIL); this picks the one that is scored.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Sequence

from .scoring import Row

# --occupancy-metric choice -> (Row field / MLflow metric, what it is)
OCCUPANCY_METRICS: Dict[str, tuple] = {
    "occupancy": ("occupancy_pct", "SM occupancy: warps resident / max warps per SM (NVML GPM SM_OCCUPANCY), "
                                   "the thesis' O"),
    "sm_active": ("sm_active_pct", "SM activity: share of time the SMs had work (NVML GPM SM_UTIL)"),
    "tensor_active": ("tensor_active_pct", "tensor-core activity: share of time any tensor core was busy "
                                           "(NVML GPM ANY_TENSOR_UTIL)"),
}
DEFAULT_OCCUPANCY_METRIC = "occupancy"


def o_column(choice: str) -> str:
    """The column that plays O, e.g. sm_active_pct."""
    return OCCUPANCY_METRICS[choice][0]


def o_note(choice: str) -> str:
    column, meaning = OCCUPANCY_METRICS[choice]
    default = " (the default)" if choice == DEFAULT_OCCUPANCY_METRIC else ""
    return (f"--occupancy-metric {choice}{default}: O of the score is {column}, {meaning}; every 'occupancy' "
            f"column of the tables holds it")


def with_occupancy_metric(rows: Sequence[Row], choice: str) -> List[Row]:
    """Rows whose occupancy_pct (what scoring.py scores as O) is the chosen measurement; the rows
    as loaded are not changed. A run without it has no O, with the reason it was logged with."""
    if choice not in OCCUPANCY_METRICS:
        raise ValueError(f"--occupancy-metric {choice!r}: choose one of {', '.join(OCCUPANCY_METRICS)}")
    column = o_column(choice)
    if column == "occupancy_pct":
        return [dataclasses.replace(r, extra=dict(r.extra)) for r in rows]
    out = []
    for r in rows:
        extra = dict(r.extra)
        extra["occupancy_pct"] = f"{column} {r.extra.get(column, 'empty in the input')}"
        if r.get(column) is not None:
            extra.pop("occupancy_pct")
        out.append(dataclasses.replace(r, occupancy_pct=r.get(column), extra=extra))
    return out
