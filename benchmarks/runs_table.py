"""Print the runs of an MLflow experiment side by side (Markdown table).

    python benchmarks/runs_table.py [--uri sqlite:///mlflow.db] [--experiment bertaccel]
"""
from __future__ import annotations

import argparse

from mlflow.tracking import MlflowClient

COLUMNS = [("train_time_s", "train_s", "{:.1f}"), ("throughput_samples_s", "samples/s", "{:.0f}"),
           ("step_ms", "ms/step", "{:.1f}"), ("peak_memory_gib", "peak GiB", "{:.2f}"),
           ("cost_usd", "cost USD", "{:.5f}"), ("test_accuracy", "test acc", "{:.4f}"),
           ("compile_graphs", "graphs", "{:.0f}"),
           ("compile_time_s", "warm-up s", "{:.1f}"), ("step_time_ms", "median ms/step", "{:.1f}"), ("startup_overhead_s", "overhead_s", "{:.1f}")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uri", default="sqlite:///mlflow.db")
    ap.add_argument("--experiment", default="bertaccel")
    args = ap.parse_args()
    client = MlflowClient(args.uri)
    exp = client.get_experiment_by_name(args.experiment)
    if exp is None:
        raise SystemExit(f"no experiment {args.experiment!r} in {args.uri}")
    runs = sorted(client.search_runs([exp.experiment_id], max_results=10000), key=lambda r: r.info.start_time)
    print("| run | status | " + " | ".join(c[1] for c in COLUMNS) + " | reason |")
    print("|---" * (len(COLUMNS) + 3) + "|")
    for r in runs:
        m = dict(r.data.metrics)
        if "train_time_s" in m and m.get("optimizer_steps"):
            m["step_ms"] = 1000 * m["train_time_s"] / m["optimizer_steps"]
        cells = [fmt.format(m[k]) if k in m else "-" for k, _, fmt in COLUMNS]
        print(f"| {r.info.run_name} | {r.data.tags.get('status')} | " + " | ".join(cells)
              + f" | {r.data.tags.get('reason', '')} |")
    if runs:
        t = runs[-1].data.tags
        print(f"\ndevice: {t.get('device_name')}, hardware profile: {t.get('hardware_profile')}")


if __name__ == "__main__":
    main()
