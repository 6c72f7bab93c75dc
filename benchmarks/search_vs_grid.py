"""Does the multi-objective search (hydra/sweeper=optuna_pareto) find the grid's Pareto front in
fewer runs than the grid? The quick study's axes (8 configurations), on the CPU, tiny model.

    python benchmarks/search_vs_grid.py [--seeds 0,1,2] [--trials 8] [--out /tmp/search_vs_grid]

1. The grid: `python -m bertaccel.run -m --config-name quick`, once, in a store of its own.
2. Its Pareto front over (train_time_s min, test_accuracy max) by the report's own module
   (report/pareto.py): the configurations to find.
3. The search, per sampler seed, each in a store of its own (sweep.resume cannot lend it the
   grid's runs): NSGA-II over the same axes, up to --trials trials. A configuration Optuna samples
   again is not retrained (the sweep's resume returns the earlier run's metrics), so the cost of a
   search is the configurations it trained.
4. A search found the front at the first trial after which every configuration on the grid's front
   has been trained by it. The front is the grid's measurement: the search's own timings of the
   same configurations differ by noise, which must not move the target.
Objectives: train_time_s and test_accuracy (a CPU without RAPL has no energy_kwh; cost_usd is
train_time_s x one price on one machine, so it adds nothing).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

COMMON = ["search.objectives=[train_time_s,test_accuracy]", "search.directions=[minimize,maximize]"]
PROGRESS = re.compile(r"^\[sweep\] run (\d+) of \d+ (\w+) \((.*)\); so far")


def sweep(out: Path, name: str, extra: List[str]) -> List[Tuple[str, str]]:
    """Run one sweep in out/name; (run name, status) per job in launch order, from its progress lines."""
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "bertaccel.run", "-m", "--config-name", "quick", *COMMON, *extra,
           f"tracking.uri=sqlite:///{d / 'mlflow.db'}", f"cache_dir={out / 'cache'}", f"hydra.sweep.dir={d / 'multirun'}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    r = subprocess.run(cmd, cwd=d, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"error: sweep {name} ended with status {r.returncode}:\n{r.stderr[-2000:]}")
    return [(m.group(3), m.group(2)) for m in map(PROGRESS.match, r.stdout.splitlines()) if m]


def grid_front(out: Path) -> Tuple[List[str], Dict[str, Tuple[float, float]]]:
    from bertaccel.report import load_rows
    from bertaccel.report.pareto import TIME_ACCURACY, pareto, row_points

    rows = load_rows(f"sqlite:///{out / 'grid' / 'mlflow.db'}", "bertaccel")
    points, why = row_points(rows)
    front = pareto(points, why, TIME_ACCURACY)
    return sorted(rows[i].name for i in front.on_front), {r.name: (r.time_s, r.accuracy) for r in rows}


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--out", default="/tmp/search_vs_grid")
    ap.add_argument("--reuse-grid", action="store_true", help="take the grid already in --out/grid (not run again)")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="added to the grid and every search alike (tests: a few steps on a few rows)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    grid = [(n, "finished") for n in grid_front(out)[1]] if a.reuse_grid else sweep(out, "grid", a.override)
    front, measured = grid_front(out)
    print(f"grid: {len(grid)} runs; its Pareto front over (train_time_s min, test_accuracy max):")
    for name in sorted(measured, key=lambda n: measured[n][0]):
        t, acc = measured[name]
        print(f"  {'*' if name in front else ' '} {name:55s} train_time_s={t:6.2f} test_accuracy={acc:.4f}")
    print("\n| sampler seed | trials run | configurations trained | found the front at trial | "
          "configurations trained by then |")
    print("|---|---|---|---|---|")
    sampled: List[str] = []
    for seed in a.seeds.split(","):
        jobs = sweep(out, f"search_seed{seed}", ["hydra/sweeper=optuna_pareto", f"hydra.sweeper.sampler.seed={seed}",
                                                f"hydra.sweeper.n_trials={a.trials}", *a.override])
        trained: List[str] = []
        found = None
        for k, (name, status) in enumerate(jobs, 1):
            if status == "finished" and name not in trained:
                trained.append(name)
            if found is None and set(front) <= set(trained):
                found = (k, len(trained))
        print(f"| {seed} | {len(jobs)} | {len(trained)} | {found[0] if found else 'not found'} | "
              f"{found[1] if found else '-'} (grid: {len(grid)}) |")
        sampled.append(f"seed {seed}: " + " ; ".join(f"{n.replace('accumulation=', 'acc').replace('freezing=', '')}"
                                                     f"{'' if st == 'finished' else ' (' + st + ')'}" for n, st in jobs))
    print("\ntrials in order (a configuration sampled again is 'already_finished', not retrained):")
    print("\n".join(sampled))


if __name__ == "__main__":
    main()
