"""Does the multi-objective search (hydra/sweeper=optuna_pareto) find the grid's Pareto front in
fewer runs than the grid? By default on sweeps/quick_search.yaml: the quick study's axes with every
CPU option of each (36 configurations), tiny model, on the CPU.

    python benchmarks/search_vs_grid.py [--study quick_search] [--seeds 0,1,2] [--trials 24]
        [--sampler motpe,random,nsgaii:population_size=8] [--jobs 10] [--out /tmp/search_vs_grid]

1. The grid: `python -m bertaccel.run -m --config-name <study>`, once, in a store of its own.
2. Its Pareto front over (train_time_s min, test_accuracy max) by the report's own module
   (report/pareto.py): the configurations to find.
3. The search, per sampler seed, each in a store of its own (sweep.resume cannot lend it the grid's
   runs), up to --trials trials. A configuration the sampler draws again is not retrained (the
   sweep's resume returns its earlier metrics), so a search costs the configurations it trained.
4. When it found the front, two ways, both judged on the grid's own measurements (the search's
   timings of the same configurations differ by noise, which must not move the target):
   - exactly: every configuration on the grid's front has been trained;
   - within noise: every front configuration f is matched by a trained configuration t that the
     grid measured no slower than f by more than the timing noise and no less accurate by more
     than the accuracy noise. The noise is measured, not assumed: the median difference between
     the grid's and the searches' measurements of the same configurations.
   Beside them, the baseline a search must beat: the mean number of configurations a grid run in
   random order has trained when each criterion first holds (2,000 seeded orders).
Objectives: train_time_s and test_accuracy (a CPU without RAPL has no energy_kwh; cost_usd is
train_time_s x one price on one machine, so it adds nothing).
"""
from __future__ import annotations

import argparse
import os
import queue
import random
import re
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Set, Tuple

COMMON = ["search.objectives=[train_time_s,test_accuracy]", "search.directions=[minimize,maximize]"]
PROGRESS = re.compile(r"^\[sweep\] run (\d+) of \d+ (\w+) \((.*)\); so far")
Measured = Dict[str, Tuple[float, float]]  # configuration -> (train_time_s, test_accuracy)


def sweep(out: Path, name: str, study: str, extra: List[str], cpus: Optional[Set[int]] = None) -> List[Tuple[str, str]]:
    """Run one sweep in out/name; (configuration, status) per job in launch order, from its progress
    lines. cpus: the cores it may use (its runs inherit them), so sweeps side by side do not share
    cores and do not change each other's timings."""
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "bertaccel.run", "-m", "--config-name", study, *COMMON, *extra,
           f"tracking.uri=sqlite:///{d / 'mlflow.db'}", f"cache_dir={out / 'cache'}", f"hydra.sweep.dir={d / 'multirun'}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    if cpus:
        env["OMP_NUM_THREADS"] = str(len(cpus))  # torch's thread pool: one thread per core it owns
    print(f"[search_vs_grid] {name}{f' on cores {sorted(cpus)}' if cpus else ''}: {' '.join(cmd[2:])}",
          file=sys.stderr, flush=True)
    r = subprocess.run(cmd, cwd=d, capture_output=True, text=True, env=env,
                       preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    if r.returncode != 0:
        sys.exit(f"error: sweep {name} ended with status {r.returncode}:\n{r.stderr[-2000:]}")
    return [(m.group(3), m.group(2)) for m in map(PROGRESS.match, r.stdout.splitlines()) if m]


def measured(out: Path, name: str) -> Measured:
    from bertaccel.report import load_rows

    return {r.name: (r.time_s, r.accuracy) for r in load_rows(f"sqlite:///{out / name / 'mlflow.db'}", "bertaccel")}


def grid_front(out: Path) -> Tuple[List[str], Measured]:
    from bertaccel.report import load_rows
    from bertaccel.report.pareto import TIME_ACCURACY, pareto, row_points

    rows = load_rows(f"sqlite:///{out / 'grid' / 'mlflow.db'}", "bertaccel")
    points, why = row_points(rows)
    front = pareto(points, why, TIME_ACCURACY)
    return sorted(rows[i].name for i in front.on_front), {r.name: (r.time_s, r.accuracy) for r in rows}


PERMUTATIONS = 2000


def random_order(configurations: List[str], done) -> float:
    """Mean number of configurations a grid run in random order has trained when done(trained)
    first holds (seeded, so the table is reproducible)."""
    rng = random.Random(0)
    total = 0
    for _ in range(PERMUTATIONS):
        order = configurations[:]
        rng.shuffle(order)
        trained: Set[str] = set()
        for name in order:
            trained.add(name)
            if done(trained):
                break
        total += len(trained)
    return total / PERMUTATIONS


def noise(grid: Measured, searches: Sequence[Measured]) -> Tuple[float, float, int]:
    """(relative time noise, absolute accuracy noise, pairs): medians over configurations measured
    by the grid and again by a search (a typical repeat's difference)."""
    dt, da = [], []
    for s in searches:
        for name, (t, acc) in s.items():
            if name in grid:
                dt.append(abs(t - grid[name][0]) / grid[name][0])
                da.append(abs(acc - grid[name][1]))
    return (statistics.median(dt) if dt else 0.0), (statistics.median(da) if da else 0.0), len(dt)


def covered(front: Sequence[str], trained: Set[str], grid: Measured, eps_time: float, eps_acc: float) -> bool:
    """Every front configuration has a trained one no worse than it beyond the noise (grid measurements)."""
    return all(any(grid[t][0] <= grid[f][0] * (1 + eps_time) and grid[t][1] >= grid[f][1] - eps_acc
                   for t in trained) for f in front)


def found_at(jobs: Sequence[Tuple[str, str]], done) -> Optional[Tuple[int, int]]:
    """(trial, configurations trained by then) of the first trial after which done(trained) holds."""
    trained: Set[str] = set()
    for k, (name, status) in enumerate(jobs, 1):
        if status == "finished":
            trained.add(name)
        if done(trained):
            return k, len(trained)
    return None


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--study", default="quick_search", help="sweeps/<study>.yaml: its grid is the search space")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--trials", type=int, default=24)
    ap.add_argument("--sampler", default="motpe", help="hydra/sweeper/sampler choices, comma-separated, each with its settings after colons, e.g. "
                         "motpe,random,nsgaii:population_size=8 (each runs every seed)")
    ap.add_argument("--out", default="/tmp/search_vs_grid")
    ap.add_argument("--accuracy-floor", type=float, default=None,
                    help="only front configurations at least this accurate are to be found (the report's "
                         "--accuracy-floor: a run below it is never 'best')")
    ap.add_argument("--jobs", type=int, default=1,
                    help="sweeps at once (the grid and the searches), each on cores of its own: on a machine "
                         "with many cores, same timings in a fraction of the wall time")
    ap.add_argument("--reuse", action="store_true", help="take the sweeps already in --out (not run again)")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="added to the grid and every search alike (tests: a few steps on a few rows)")
    return ap.parse_args(argv)


def plan(a: argparse.Namespace) -> Tuple[List[Tuple[str, str]], List[str], List[List[str]]]:
    """(sampler spec, seed) per search, the sweep names (the grid first) and each sweep's overrides."""
    seeds = a.seeds.split(",")
    # "nsgaii:population_size=8": a sampler and its settings (hydra.sweeper.sampler.<key>=<value>)
    samplers = [(spec.split(":")[0], [f"hydra.sweeper.sampler.{kv}" for kv in spec.split(":")[1:]])
                for spec in a.sampler.split(",")]
    labels = [(spec, seed) for spec in a.sampler.split(",") for seed in seeds]
    names = ["grid"] + [f"search_{spec.replace(':', '_').replace('=', '')}_seed{seed}" for spec, seed in labels]
    extras = [a.override] + [["hydra/sweeper=optuna_pareto", f"hydra/sweeper/sampler={name}", *settings,
                              f"hydra.sweeper.sampler.seed={seed}", f"hydra.sweeper.n_trials={a.trials}", *a.override]
                             for name, settings in samplers for seed in seeds]
    return labels, names, extras


def run_sweeps(a: argparse.Namespace, out: Path, names: List[str], extras: List[List[str]]) -> List[List[Tuple[str, str]]]:
    """Every sweep's (configuration, status) per job, --jobs at once, each on cores of its own."""
    cores = sorted(os.sched_getaffinity(0))
    per = len(cores) // a.jobs if a.jobs > 1 else 0
    if a.jobs > 1 and per < 1:
        sys.exit(f"error: --jobs {a.jobs} needs at least {a.jobs} cores; this process may use {len(cores)}")

    slots: "queue.Queue[int]" = queue.Queue()  # core sets not in use: a sweep takes one, gives it back
    for j in range(a.jobs):
        slots.put(j)

    def run(k: int) -> List[Tuple[str, str]]:
        log = out / names[k] / "jobs.tsv"
        if a.reuse and log.is_file():
            return [tuple(line.split("\t")) for line in log.read_text().splitlines()]  # type: ignore[misc]
        j = slots.get()
        try:
            jobs = sweep(out, names[k], a.study, extras[k], set(cores[j * per:(j + 1) * per]) if per else None)
        finally:
            slots.put(j)
        log.write_text("".join(f"{n}\t{s}\n" for n, s in jobs))
        return jobs

    with ThreadPoolExecutor(max_workers=a.jobs) as pool:
        return list(pool.map(run, range(len(names))))


def main(argv: Optional[List[str]] = None) -> None:
    a = parse_args(argv)
    out = Path(a.out)
    labels, names, extras = plan(a)
    all_jobs = run_sweeps(a, out, names, extras)
    grid_jobs = all_jobs[0]
    front, grid = grid_front(out)
    n = len(grid)
    print(f"grid ({a.study}): {len(grid_jobs)} runs, {n} finished; its Pareto front over "
          f"(train_time_s min, test_accuracy max), {len(front)} configurations:")
    for name in sorted(grid, key=lambda c: grid[c][0]):
        t, acc = grid[name]
        print(f"  {'*' if name in front else ' '} {name:60s} train_time_s={t:7.3f} test_accuracy={acc:.4f}")

    if a.accuracy_floor is not None:
        below = [f for f in front if grid[f][1] < a.accuracy_floor]
        front = [f for f in front if f not in below]
        print(f"--accuracy-floor {a.accuracy_floor}: {len(below)} front configuration(s) below it are not to be found")
    searches = {f"{spec}, {seed}": (names[k + 1], all_jobs[k + 1]) for k, (spec, seed) in enumerate(labels)}
    eps_time, eps_acc, pairs = noise(grid, [measured(out, nm) for nm, _ in searches.values()])
    print(f"\nnoise (median over {pairs} configurations measured by the grid and again by a search): "
          f"train_time_s {eps_time * 100:.1f} %, test_accuracy {eps_acc:.4f}")
    exactly = (lambda tr: set(front) <= tr)
    near = (lambda tr: covered(front, tr, grid, eps_time, eps_acc))
    base_exact, base_near = random_order(list(grid), exactly), random_order(list(grid), near)
    print(f"a grid run in random order (mean of {PERMUTATIONS} orders) holds the whole front after {base_exact:.1f} "
          f"of {n} configurations, within noise after {base_near:.1f}\n")
    half = n // 2
    print(f"| sampler, seed | trials | configurations trained | front configurations trained | of them among the "
          f"first {half} trained | whole front, exactly: trial (configurations trained) | whole front within noise: "
          "trial (configurations trained) |")
    print("|---|---|---|---|---|---|---|")
    cell = (lambda f: f"{f[0]} ({f[1]})" if f else "not found")
    print(f"| grid in random order (mean) | - | {n} | {len(front)} of {len(front)} | {len(front) * half / n:.1f} | "
          f"({base_exact:.1f}) | ({base_near:.1f}) |")
    for label, (name, jobs) in searches.items():
        order = list(dict.fromkeys(c for c, st in jobs if st == "finished"))  # first training of each
        print(f"| {label} | {len(jobs)} | {len(order)} of {n} | {len(set(front) & set(order))} of {len(front)} | "
              f"{len(set(front) & set(order[:half]))} | {cell(found_at(jobs, exactly))} | {cell(found_at(jobs, near))} |")
    print("\ntrials in order (a configuration drawn again is 'already_finished', not retrained; * on the grid's front):")
    for label, (name, jobs) in searches.items():
        print(f"{label}: " + " ; ".join(
            f"{'*' if c in front else ''}{c.replace('accumulation=', 'acc').replace('freezing=', '').replace('optimizer=', '')}"
            f"{'' if st == 'finished' else ' (' + st + ')'}" for c, st in jobs))

if __name__ == "__main__":
    main()
