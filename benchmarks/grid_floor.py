"""How fast could the thesis grid go on the one GPU it ran on? Floors from the store's own readings.

    python benchmarks/grid_floor.py docs/results/stores/h200-thesis-grid.db.gz [--goal-min 30]

Issue 62 asks for the whole grid (bertaccel/sweeps/thesis_grid.yaml, 3 repeats) in 30 minutes of
wall time on one H200. Every finished run of the grid in the store carries what bounds that:

- train_time_s: its training, projected from an exclusive window (the GPU to itself);
- gpu_util_pct (NVML utilization: the share of time any kernel ran, over the same window), so
  train_time_s x gpu_util_pct is the time its kernels kept the GPU busy. Processes sharing a GPU
  without MPS are time-sliced: kernels of different runs never run at once, so the grid's
  kernel-busy seconds, summed, are a floor for any number of runs at once (sweep.concurrent);
- sm_active_pct (GPM SM activity: the share of SM time with a warp resident), so train_time_s x
  sm_active_pct is the time its work would take if it filled every SM; summed, a floor even if
  kernels of different runs could share the SMs perfectly, at the efficiency each kernel had.

The floors count training only: evaluation and start-up have no GPU-activity reading, and are
shown beside them (eval_time_s was measured while sharing, so it overstates evaluation alone).
One table per precision and batch size, then the totals against the goal.
"""
from __future__ import annotations

import argparse
import gzip
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

READINGS = ("train_time_s", "gpu_util_pct", "sm_active_pct", "eval_time_s", "startup_overhead_s")


@dataclass(frozen=True)
class GridRun:
    group: Tuple[str, str]               # (precision, batch size)
    readings: Dict[str, Optional[float]]

    def busy_s(self, pct: str) -> Optional[float]:
        """train_time_s x a share of it (gpu_util_pct, sm_active_pct); None where either is missing."""
        t, p = self.readings["train_time_s"], self.readings[pct]
        return None if t is None or p is None else t * p / 100.0


def grid_runs(uri: str, axes: Dict[str, List[str]]) -> List[GridRun]:
    """The finished training runs of the grid (every swept axis at one of its values)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    out = []
    for exp in client.search_experiments():
        for run in client.search_runs([exp.experiment_id], "attributes.status = 'FINISHED'", max_results=50000):
            params = run.data.params
            if all(params.get(k) in values for k, values in axes.items()) and "train_time_s" in run.data.metrics:
                m = run.data.metrics
                out.append(GridRun((params["precision"], params["train.batch_size"]),
                                   {k: m.get(k) for k in READINGS}))
    return out


def _sum(values: Sequence[Optional[float]]) -> Tuple[float, int]:
    """(sum of the present values, how many were missing)."""
    present = [v for v in values if v is not None]
    return sum(present), len(values) - len(present)


def table(runs: Sequence[GridRun]) -> Tuple[List[str], Dict[str, float], int]:
    """The per-group table's lines, the grid's totals in seconds and the count of missing readings."""
    groups = sorted({r.group for r in runs}, key=lambda g: (g[0], int(g[1])))
    lines = ["| precision | batch | runs | training s | kernels busy s | SMs full s | evaluation s | start-up s |",
             "|---|---|---|---|---|---|---|---|"]
    totals = dict.fromkeys(("train", "kernel", "sm", "eval", "startup"), 0.0)
    missing = 0
    for g in groups:
        mine = [r for r in runs if r.group == g]
        cells = {"train": _sum([r.readings["train_time_s"] for r in mine]),
                 "kernel": _sum([r.busy_s("gpu_util_pct") for r in mine]),
                 "sm": _sum([r.busy_s("sm_active_pct") for r in mine]),
                 "eval": _sum([r.readings["eval_time_s"] for r in mine]),
                 "startup": _sum([r.readings["startup_overhead_s"] for r in mine])}
        for k, (v, miss) in cells.items():
            totals[k] += v
            missing += miss
        lines.append(f"| {g[0]} | {g[1]} | {len(mine)} | " + " | ".join(
            f"{v:,.0f}" + (f" ({miss} missing)" if miss else "") for v, miss in cells.values()) + " |")
    return lines, totals, missing


def verdict(totals: Dict[str, float], n_runs: int, goal_min: float) -> List[str]:
    one_at_a_time = totals["train"] + totals["eval"] + totals["startup"]
    return [
        f"one run at a time: {one_at_a_time / 60:,.1f} min ({totals['train'] / 60:,.1f} of training, "
        f"{totals['eval'] / 60:,.1f} of evaluation as measured while sharing, {totals['startup'] / 60:,.1f} "
        f"of start-up) for {n_runs} runs",
        f"floor, runs sharing the GPU as processes (time-sliced: kernels busy, training only): "
        f"{totals['kernel'] / 60:,.1f} min, {totals['kernel'] / 60 / goal_min:.2f}x the {goal_min:g}-minute goal",
        f"floor, every SM kept busy (training only): {totals['sm'] / 60:,.1f} min, "
        f"{totals['sm'] / 60 / goal_min:.2f}x the goal",
    ]


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store", help="an MLflow SQLite store, .db or .db.gz (docs/results/stores/)")
    ap.add_argument("--goal-min", type=float, default=30.0, help="the wall-time goal in minutes (issue 62: 30)")
    a = ap.parse_args(argv)
    from bertaccel.report.thesis_compare import grid_axes

    store = Path(a.store)
    if not store.is_file():
        print(f"error: {store}: no such store; give an MLflow .db or .db.gz file", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        db = store
        if store.name.endswith(".gz"):
            db = Path(tmp) / "mlflow.db"
            with gzip.open(store, "rb") as src, open(db, "wb") as dst:
                shutil.copyfileobj(src, dst)
        runs = grid_runs(f"sqlite:///{db}", grid_axes())
    if not runs:
        print(f"error: {store}: no finished run of the thesis grid (bertaccel/sweeps/thesis_grid.yaml)",
              file=sys.stderr)
        return 2
    lines, totals, missing = table(runs)
    print(f"{store.name}: {len(runs)} finished runs of the thesis grid; seconds summed over their runs\n")
    print("\n".join(lines))
    print(f"| all | | {len(runs)} | " + " | ".join(f"{totals[k]:,.0f}" for k in
                                                   ("train", "kernel", "sm", "eval", "startup")) + " |\n")
    if missing:
        print(f"{missing} readings missing (not counted): the floors are lower than the grid's own")
    print("\n".join(f"- {line}" for line in verdict(totals, len(runs), a.goal_min)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
