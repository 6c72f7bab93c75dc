"""Where a sweep's wall time goes: training windows vs everything else, per run and in total.

    python benchmarks/sweep_wall.py --uri sqlite:///mlflow.db [--experiment E] -- <bertaccel.run -m overrides>

Runs `python -m bertaccel.run -m <overrides>` (its own process, as a user would), times it from
the outside, then reads that sweep's runs back from MLflow and prints one table: per run the
train windows, the warm-up (compile_time_s) and its cache state (cold / warm), step_time_ms and
recompiles_in_window; last, the share of the sweep's wall time spent outside training windows.
"""
from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time

from mlflow.tracking import MlflowClient

COLUMNS = [("train_time_s", "train s", "{:.1f}"), ("step_time_ms", "ms/step", "{:.1f}"),
           ("compile_time_s", "warm-up s", "{:.1f}"), ("recompiles_in_window", "compiles in window", "{:.0f}"),
           ("eval_time_s", "eval s", "{:.1f}"), ("time_to_train_s", "time to train s", "{:.1f}"),
           ("test_accuracy", "accuracy", "{:.4f}")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uri", default="sqlite:///mlflow.db")
    ap.add_argument("--experiment", default="sweep_wall")
    ap.add_argument("overrides", nargs="+", help="after --: the overrides of bertaccel.run -m")
    a = ap.parse_args(argv)
    cmd = [sys.executable, "-m", "bertaccel.run", "-m", *a.overrides, f"tracking.uri={a.uri}",
           f"tracking.experiment={a.experiment}"]
    # Ctrl-C is KeyboardInterrupt below even where this process started with SIGINT ignored: a
    # shell without job control starts `cmd &` so (POSIX), and then Python installs no handler of
    # its own; a CI-like run started in the background lost every interrupt that way (the sweep
    # ran to its end, exit 0). bertaccel.run installs its own handlers for the same reason.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    t0 = time.time()
    # The sweep's own lines ("run k of N", the summary) pass through as they come: a long sweep
    # cut off by a time limit still shows how far it got.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines = []
    interrupted = False
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith(("[sweep]", "==", "sweep id")) or "run " in line[:12]:
                print(line, end="", flush=True)
        proc.wait()
    except KeyboardInterrupt:
        # Cut off (Ctrl-C, `timeout -s INT`): stop the sweep and still report the runs it
        # finished; measured on a GPU, a sweep past its time limit otherwise left nothing.
        interrupted = True
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    wall_s = time.time() - t0
    sweep = [line.split("sweep id ")[1].split()[0] for line in lines if "sweep id " in line]
    if not sweep:
        print("".join(lines[-40:]), file=sys.stderr)
        print(f"error: no sweep id in the output of {' '.join(cmd)} (exit {proc.returncode})", file=sys.stderr)
        return 1
    client = MlflowClient(a.uri)
    exp = client.get_experiment_by_name(a.experiment)
    runs = client.search_runs([exp.experiment_id], f"tags.sweep_id = '{sweep[-1]}'", max_results=10000)
    runs = sorted((r for r in runs if r.data.tags.get("bertaccel.role") != "sweep"), key=lambda r: r.info.start_time)
    print("| run | status | cache | " + " | ".join(c[1] for c in COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 3) + "|")
    train_total = 0.0
    for r in runs:
        m, t = r.data.metrics, r.data.tags
        train_total += m.get("train_time_s", 0.0)
        cells = [fmt.format(m[k]) if k in m else "-" for k, _, fmt in COLUMNS]
        print(f"| {r.info.run_name} | {t.get('status')} | {t.get('compile_cache', '-')} | " + " | ".join(cells) + " |")
    outside = 1 - train_total / wall_s
    if interrupted:
        planned = next((line.split()[1] for line in lines if line.startswith("[sweep]") and " runs; " in line), "?")
        print(f"\nsweep {sweep[-1]}: INTERRUPTED after {wall_s:.1f} s with {len(runs)} of {planned} runs recorded "
              f"(the last one may be unfinished); training windows {train_total:.3f} s, outside training windows "
              f"{100 * outside:.1f}% of the wall time so far")
        return 130
    print(f"\nsweep {sweep[-1]}: {len(runs)} runs, wall {wall_s:.1f} s (process start to exit), training windows "
          f"{train_total:.3f} s, outside training windows {100 * outside:.1f}% of the wall time")
    return 0 if proc.returncode == 0 else proc.returncode


if __name__ == "__main__":
    sys.exit(main())
