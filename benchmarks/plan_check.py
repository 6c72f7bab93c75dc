"""The plan on a cold store, checked: `plan --probe`, then the sweep, then predicted vs measured.

    python benchmarks/plan_check.py --uri sqlite:///check.db [--hardware h200] [--cross other/plan.csv]
                                    [--out DIR] -- <bertaccel.run -m overrides>

Runs, each as a user would (its own process, timed from outside):
1. `python -m bertaccel.plan -m <overrides> --probe [--hardware ...] --out DIR/plan` on the store;
2. `python -m bertaccel.run -m <overrides>` on the same store (each run logs the plan's prediction);
then reads the sweep's runs back and prints one side-by-side table per run (train_time_s,
warm-up, start-up, evaluation, run wall: predicted, measured, error %) and the goals: median and
worst |error| of train_time_s, the sweep's wall within 20 %, the probe's cost against the sweep's
wall, the first run's and the later runs' start-up. --cross: a plan.csv another machine made with
--hardware <this machine's profile> (rows "<run> @ <profile>"): its train_time_s against this
sweep's measured (the cross-GPU check).
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

WAITS = (("train_time_s", "train_time_s"), ("warmup_s", "compile_time_s"), ("startup_overhead_s", "startup_overhead_s"),
         ("eval_time_s", "eval_time_s"), ("run_wall_s", "run_wall_s"))


def _run(cmd: List[str], log: Path, stamp: bool = False) -> float:
    """Run cmd, its output to log; stamp: each line prefixed with the seconds since its start (where
    a plan's time goes: its imports, the server's preload, each probe)."""
    t0 = time.time()
    with open(log, "w") as f:
        if stamp:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
            for line in proc.stdout:
                f.write(f"[{time.time() - t0:7.2f} s] {line}")
            proc.wait()
        else:
            proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        print(log.read_text()[-3000:], file=sys.stderr)
        raise SystemExit(f"error: {' '.join(cmd[:4])} ... exited {proc.returncode} (log {log})")
    return time.time() - t0


def _err(p: Optional[float], x: Optional[float]) -> Optional[float]:
    return None if p is None or x is None or x == 0 else (p - x) / x * 100


def _f(v: Optional[float], spec: str = ".3g") -> str:
    return "null" if v is None else format(v, spec)


def _table(runs: List, overrides: List[str]):
    """The side-by-side lines, the errors per column, the predicted sweep wall and the runs' spans."""
    from bertaccel.record.readings import run_waits

    lines = [f"# plan --probe, then the sweep ({time.strftime('%Y-%m-%d %H:%M')})", "",
             f"overrides: {' '.join(overrides)}", ""]
    header = ["run"] + [f"{n} {w}" for n, _ in WAITS for w in ("pred", "meas", "err %")]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    errs: Dict[str, List[float]] = {n: [] for n, _ in WAITS}
    walls_pred, starts, ends = 0.0, [], []
    for r in runs:
        m, got = r.data.metrics, {**run_waits(r), "train_time_s": r.data.metrics.get("train_time_s")}
        cells = [r.info.run_name]
        for name, key in WAITS:
            p, x = m.get(f"predicted_{name}"), got.get(key)
            e = _err(p, x)
            if e is not None:
                errs[name].append(e)
            cells += [_f(p), _f(x), _f(e, "+.1f")]
        lines.append("| " + " | ".join(cells) + " |")
        walls_pred += m.get("predicted_run_wall_s") or float("nan")
        if "run_wall_s" in got:
            starts.append(r.info.end_time / 1e3 - got["run_wall_s"])
            ends.append(r.info.end_time / 1e3)
    return lines, errs, walls_pred, starts, ends


def _cross(path: str, runs: List) -> List[str]:
    """Another machine's plan.csv rows for this machine's profile against this sweep's runs."""
    with open(path) as f:
        rows = {(row["name"].split(" @ ")[0], row["hardware"]): row for row in csv.DictReader(f) if " @ " in row["name"]}
    cross = []
    lines_c = ["", "| run | train_time_s predicted on the other machine | measured here | error % | basis |",
               "|---|---|---|---|---|"]
    for r in runs:
        row = rows.get((r.info.run_name, r.data.tags.get("hardware_profile")))
        if row and row["time_s"]:
            p, x = float(row["time_s"]), r.data.metrics.get("train_time_s")
            e = _err(p, x)
            cross.append(abs(e))
            lines_c.append(f"| {r.info.run_name} | {p:.3g} | {x:.3g} | {e:+.1f} | {row['basis'][:160]} |")
    out = [f"- cross-GPU ({path}): train_time_s |error| median "
           f"{_f(statistics.median(cross) if cross else None, '.1f')} % over {len(cross)} runs (goal <= 15 %)"]
    return out + lines_c


def _net(plan_log: Path, runs: List, added_s: float, sweep_s: float) -> List[str]:
    """What --probe costs net of the cold compiles it moved out of the sweep: the plan filled the
    compiled configurations' caches (its "[probe] compile cache of ...: cold warm-up X s" lines), so
    the sweep's compiled runs met them warm. Without the probe their first runs would have compiled
    cold; the fills' cold times were taken side by side (longer than alone), so the saving, and the
    sweep it is added back to, are estimates, said as such."""
    cold = [float(line.split("cold warm-up ")[1].split(" s")[0]) for line in plan_log.read_text().splitlines()
            if "[probe] compile cache of " in line and ": cold warm-up " in line]
    if not cold:
        return []
    warm = [r.data.metrics.get("compile_time_s", 0.0) for r in runs if r.data.tags.get("compile_cache") == "warm"]
    saved = sum(cold) - sum(warm)
    without = sweep_s + saved
    return [f"- the plan filled {len(cold)} compile caches (cold warm-ups {sum(cold):.1f} s in all, timed side by "
            f"side); the sweep's {len(warm)} warm-cache runs' warm-ups took {sum(warm):.1f} s: the sweep without the "
            f"probe would have taken about {without:.1f} s (an estimate: cold compiles alone are shorter than side "
            f"by side), and --probe's {added_s:.1f} s less the {saved:.1f} s it moved out of the sweep is "
            f"{added_s - saved:+.1f} s = {100 * (added_s - saved) / without:+.1f} % of it"]


def main(argv: Optional[List[str]] = None) -> int:
    from bertaccel.record.tracking import search_runs

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uri", default="sqlite:///plan_check.db")
    ap.add_argument("--experiment", default="plan_check")
    ap.add_argument("--hardware", help="profiles to re-price the grid on (plan --hardware)")
    ap.add_argument("--cross", help="another machine's plan.csv with rows for this machine's profile")
    ap.add_argument("--out", default="plan_check")
    ap.add_argument("--stage", choices=("both", "plan", "sweep"), default="both",
                    help="plan: the plan only (its time saved in --out); sweep: the sweep and the table, after a "
                         "plan stage into the same --out (two calls of a time-limited machine)")
    ap.add_argument("overrides", nargs="+")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    common = [*a.overrides, f"tracking.uri={a.uri}", f"tracking.experiment={a.experiment}"]
    plan_cmd = [sys.executable, "-m", "bertaccel.plan", "-m", *common, "--probe", "--out", str(out / "plan")]
    if a.hardware:
        plan_cmd += ["--hardware", a.hardware]
    if a.stage in ("both", "plan"):
        # The same plan without probes first, on a store and cache_dir of its own (cold as the
        # probed one's, and not the plan the sweep's runs will log): what --probe adds to it.
        twin = out / "plan_without_probe"
        own = [o for o in a.overrides if not o.startswith(("cache_dir=", "tracking."))]
        bare_s = _run([sys.executable, "-m", "bertaccel.plan", "-m", *own, f"tracking.uri=sqlite:///{twin}.db",
                       f"tracking.experiment={a.experiment}", f"cache_dir={twin}_cache", "--out", str(twin)],
                      out / "plan_without_probe.log")
        plan_s = _run(plan_cmd, out / "plan.log", stamp=True)
        (out / "plan_s.txt").write_text(f"{plan_s} {bare_s}\n")
        print((out / "plan.log").read_text()[-6000:])
        if a.stage == "plan":
            return 0
    plan_s, bare_s = map(float, (out / "plan_s.txt").read_text().split())
    sweep_s = _run([sys.executable, "-m", "bertaccel.run", "-m", *common], out / "sweep.log")
    sweep_id = next(line.split("sweep id ")[1].split()[0] for line in (out / "sweep.log").read_text().splitlines()
                    if line.startswith("sweep id "))
    runs = [r for r in search_runs(a.uri, a.experiment, f"tags.sweep_id = '{sweep_id}'")
            if r.data.tags.get("bertaccel.role") != "sweep" and r.data.tags.get("status") == "finished"]
    runs.sort(key=lambda r: r.info.start_time)
    lines, errs, walls_pred, starts, ends = _table(runs, a.overrides)
    train = [abs(e) for e in errs["train_time_s"]]
    measured_wall = max(ends) - min(starts) if starts else None
    first = runs[0] if runs else None
    later = [r.data.metrics.get("startup_overhead_s") for r in runs[1:]]
    later_ready = [r.data.metrics.get("startup_overhead_s", 0) - r.data.metrics.get("compile_time_s", 0) for r in runs[1:]]
    summary = [
        "",
        f"- runs: {len(runs)} finished; train_time_s |error|: median {_f(statistics.median(train) if train else None, '.1f')} %, "
        f"worst {_f(max(train) if train else None, '.1f')} % (goal <= 15 % / <= 35 %)",
        *[f"- {n} |error|: median {_f(statistics.median([abs(e) for e in errs[n]]) if errs[n] else None, '.1f')} %"
          for n, _ in WAITS[1:]],
        f"- sweep wall: predicted {_f(walls_pred, '.1f')} s, measured {_f(measured_wall, '.1f')} s (first run's start to the "
        f"last record; error {_f(_err(walls_pred, measured_wall), '+.1f')} %, goal within 20 %); the sweep command "
        f"took {sweep_s:.1f} s from outside",
        f"- the plan with its probes took {plan_s:.1f} s = {100 * plan_s / sweep_s:.1f} % of the sweep command's "
        f"{sweep_s:.1f} s; without probes (the same grid, its own cold store and cache) {bare_s:.1f} s, so --probe "
        f"added {plan_s - bare_s:.1f} s = {100 * (plan_s - bare_s) / sweep_s:.1f} % (goal <= 10 %)",
    ]
    summary += _net(out / "plan.log", runs, plan_s - bare_s, sweep_s)
    if first is not None:
        phases = json.loads(first.data.tags.get("startup_phases_s", "{}"))
        ready = first.data.metrics.get("startup_overhead_s", 0) - first.data.metrics.get("compile_time_s", 0)
        summary += [f"- first run ready to train (start-up without its warm-up): {ready:.2f} s (goal <= 15 s); "
                    f"later runs: median {_f(statistics.median(later_ready) if later_ready else None, '.2f')} s "
                    f"(goal <= 3 s); start-up with warm-up: first {_f(first.data.metrics.get('startup_overhead_s'), '.2f')} s, "
                    f"later median {_f(statistics.median([x for x in later if x is not None]) if later else None, '.2f')} s",
                    "- the first run's start-up phases: " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items())]
    if a.cross:
        summary += _cross(a.cross, runs)
    text = "\n".join(lines + summary) + "\n"
    (out / "plan_check.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
