"""Per-run overhead (process start -> first training step) and CPU step time, as a table.

Runs the real CLI several times against one temporary MLflow store and tokenization cache: the
first run is cold (store created, data tokenized), the rest are warm, which is what each run
in its own process pays. Then the same as jobs of one multirun, where later jobs skip the
imports. Numbers come back from the MLflow records the runs wrote.

    python benchmarks/overhead.py [--repeats 3] [--steps 20] [--model minilm_l6]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from mlflow.tracking import MlflowClient


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="warm runs after the cold one")
    ap.add_argument("--steps", type=int, default=20, help="optimizer steps per run")
    ap.add_argument("--model", default="minilm_l6")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bertaccel-bench-")
    store = f"sqlite:///{work}/mlflow.db"
    base = [sys.executable, "-m", "bertaccel.run", f"model={args.model}", f"tracking.uri={store}",
            f"cache_dir={work}/cache", f"train.max_steps_per_epoch={args.steps}",
            "dataset.test_subset=128", "tracking.experiment=overhead"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    rows = []
    for i in range(args.repeats + 1):
        t0 = time.time()
        proc = subprocess.run(base, cwd=work, env=env, capture_output=True, text=True)
        wall = time.time() - t0
        if proc.returncode != 0:
            sys.exit(f"run {i} failed:\n{proc.stderr[-2000:]}")
        run_id = proc.stdout.strip().splitlines()[-1].split("mlflow_run_id=")[1].split()[0]
        run = MlflowClient(store).get_run(run_id)
        m, t = run.data.metrics, run.data.tags
        rows.append(("cold" if i == 0 else f"warm {i}", t["tokenize_cache"], m["startup_overhead_s"],
                     1000 * m["train_time_s"] / m["optimizer_steps"], m["throughput_samples_s"], wall))
    print(f"\nmodel={args.model}, {args.steps} optimizer steps of batch 32, device: {t['device_name']}")
    header = ("run", "token cache", "overhead_s (start->1st step)", "step_ms (mean)", "samples/s", "process wall_s")
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))
    for r in rows:
        print(f"{r[0]} | {r[1]} | {r[2]:.2f} | {r[3]:.0f} | {r[4]:.1f} | {r[5]:.1f}")
    warm = [r[2] for r in rows[1:]]
    if warm:
        print(f"\nwarm overhead median {statistics.median(warm):.2f} s (goal <= 5 s)")

    # The same runs as jobs of one multirun: imports are paid once, by the first job.
    proc = subprocess.run([*base[:3], "-m", *base[3:], "train.seed=1,2,3", "tracking.experiment=overhead_sweep"],
                          cwd=work, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"sweep failed:\n{proc.stderr[-2000:]}")
    client = MlflowClient(store)
    exp = client.get_experiment_by_name("overhead_sweep")
    runs = sorted(client.search_runs([exp.experiment_id]), key=lambda r: r.info.start_time)
    print("\nsame, as 3 jobs of one multirun (one process)")
    print("job | overhead_s | measured from")
    print("--- | --- | ---")
    for i, r in enumerate(runs):
        print(f"{i} | {r.data.metrics['startup_overhead_s']:.2f} | {r.data.tags['startup_overhead_s_source'].split(' minus ')[1]}")


if __name__ == "__main__":
    main()
