"""Where a sweep's start-up goes: the first and later runs' startup_phases_s, cold and warm.

    python benchmarks/startup.py [--dir DIR] [--drop-os-caches] -- <bertaccel.run -m overrides>

Runs `python -m bertaccel.run -m <overrides>` twice as a user would, on one store and one
cache_dir in DIR, each pass in an MLflow experiment of its own (so the second sweep is not
resumed from the first): the first pass makes the store and starts with the cache empty (cold:
tokens, compile caches; the OS's file cache too with --drop-os-caches, which needs root; a DIR
used before is no longer cold), the second finds both (warm). Each run's
startup_phases_s is read back from MLflow and printed side by side, per phase in seconds: each
pass's first run (which pays the sweep process's start and the forkserver's) and its later runs
(their mean). Last rows: startup_overhead_s, and the time from this script's launch of the sweep
to its first run's first training step, read on this script's clock (no process-start reading in it).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from mlflow.tracking import MlflowClient

EXPERIMENT = "startup"  # each pass's experiment: startup-<pass>-<time>
FIRST_BATCH = "first batch (data loader start)"  # the last phase: the first step begins after it
OVERHEAD = "= startup_overhead_s"
REACHED = "launch to the first run's first step (this script's clock)"


def sweep(overrides: Sequence[str], uri: str, experiment: str, cache_dir: str) -> Dict[str, Any]:
    """One sweep in a process of its own: its runs in order, its launch time and wall time."""
    cmd = [sys.executable, "-m", "bertaccel.run", "-m", *overrides, f"tracking.uri={uri}",
           f"tracking.experiment={experiment}", f"cache_dir={cache_dir}"]
    launched_at = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall_s = time.time() - launched_at
    ids = [line.split("sweep id ")[1].split()[0] for line in proc.stdout.splitlines() if "sweep id " in line]
    if not ids:
        sys.exit(f"error: no sweep id in the output of {' '.join(cmd)} (exit {proc.returncode}): "
                 f"{(proc.stderr.strip().splitlines() or [''])[-1]}")
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], f"tags.sweep_id = '{ids[-1]}'", max_results=10000)
    runs = sorted((r for r in runs if r.data.tags.get("bertaccel.role") != "sweep"), key=lambda r: r.info.start_time)
    return {"runs": [r for r in runs if "startup_phases_s" in r.data.tags], "launched_at": launched_at,
            "wall_s": wall_s, "returncode": proc.returncode, "recorded": len(runs)}


def first_step_after_launch(run: Any, launched_at: float) -> Optional[float]:
    """Seconds from the sweep's launch to this run's first training step: its first training
    window opened (train_windows_unix) plus its first batch's wait (startup_phases_s)."""
    windows = json.loads(run.data.tags.get("train_windows_unix", "[]"))
    phases = json.loads(run.data.tags["startup_phases_s"])
    return windows[0][0] + phases.get(FIRST_BATCH, 0.0) - launched_at if windows else None


def columns(passes: Dict[str, Dict[str, Any]]) -> Dict[str, Dict[str, float]]:
    """Per pass, the first run's phases and the later runs' mean, plus the totals' rows."""
    out: Dict[str, Dict[str, float]] = {}
    for name, p in passes.items():
        runs = p["runs"]
        if not runs:
            continue
        groups = {f"{name}: first run": runs[:1]}
        if len(runs) > 1:
            groups[f"{name}: later runs (mean of {len(runs) - 1})"] = runs[1:]
        for label, group in groups.items():
            col: Dict[str, float] = {}
            for r in group:
                for phase, s in json.loads(r.data.tags["startup_phases_s"]).items():
                    col[phase] = col.get(phase, 0.0) + s / len(group)
            col[OVERHEAD] = sum(r.data.metrics["startup_overhead_s"] for r in group) / len(group)
            out[label] = col
        reached = first_step_after_launch(runs[0], p["launched_at"])
        if reached is not None:
            out[f"{name}: first run"][REACHED] = reached
    return out


def table(cols: Dict[str, Dict[str, float]]) -> str:
    rows: List[str] = []
    for col in cols.values():  # phases in the order they happen, totals last
        rows += [k for k in col if k not in rows and k not in (OVERHEAD, REACHED)]
    rows += [OVERHEAD, REACHED]
    lines = ["| phase (s) | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for row in rows:
        cells = [f"{c[row]:.3f}" if row in c else "-" for c in cols.values()]
        lines.append(f"| {f'**{row}**' if row in (OVERHEAD, REACHED) else row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def drop_os_caches() -> None:
    """The OS's file cache emptied (root only): a cold pass as after a reboot."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as e:
        print(f"error: --drop-os-caches: cannot write /proc/sys/vm/drop_caches ({e.strerror}); run as root "
              "or leave the option out", file=sys.stderr)
        sys.exit(2)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", help="where the stores and the cache go (default: a new temporary directory)")
    ap.add_argument("--drop-os-caches", action="store_true", help="empty the OS's file cache before the cold pass")
    ap.add_argument("overrides", nargs="+", help="after --: the overrides of bertaccel.run -m")
    a = ap.parse_args(argv)
    if any(o.startswith(("cache_dir=", "tracking.uri=", "tracking.experiment=")) for o in a.overrides):
        print("error: cache_dir, tracking.uri and tracking.experiment are this script's (see --dir)", file=sys.stderr)
        return 2
    where = Path(a.dir or tempfile.mkdtemp(prefix="bertaccel-startup-")).resolve()
    where.mkdir(parents=True, exist_ok=True)
    if a.drop_os_caches:
        drop_os_caches()
    passes, uri, stamp = {}, f"sqlite:///{where / 'mlflow.db'}", time.strftime("%Y%m%d-%H%M%S")
    for name in ("cold", "warm"):
        experiment = f"{EXPERIMENT}-{name}-{stamp}"
        passes[name] = p = sweep(a.overrides, uri, experiment, str(where / "cache"))
        print(f"{name}: {len(p['runs'])} finished of {p['recorded']} runs, wall {p['wall_s']:.1f} s "
              f"(exit {p['returncode']}; store {uri}, experiment {experiment})", flush=True)
    if not all(p["runs"] for p in passes.values()):
        print("error: a pass finished no run (its runs' status tells why)", file=sys.stderr)
        return 1
    print()
    print(table(columns(passes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
