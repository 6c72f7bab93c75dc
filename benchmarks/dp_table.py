"""Data-parallel runs of one store side by side: scaling and the backprop-time estimate.

    python benchmarks/dp_table.py [--uri sqlite:///mlflow.db] [--experiment bertaccel] [--buckets]

Groups the finished runs by their configuration without num_gpus (so encoder=hf and
encoder=fused each get their own 1 / 2 / 4 GPU rows) and prints, per run: samples/s over the
training windows, scaling against the same configuration's 1-GPU run, the median step (and the
mean, train_time_s / steps, last: where it is far above the median, slow steps cost the
throughput that the median does not show; the run's step_ms series says which), and the
layer_timing=true estimate: measured backward, the model's prediction and error
(estimate_backward_ranks over DDP's buckets), and the thesis' per-layer estimate and its error.
--buckets adds, per multi-rank run, its DDP buckets: bytes, standalone all-reduce time, each
rank's ready mark and the all-reduce's end, so where the backward's time went can be read off.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from collections import defaultdict
from pathlib import Path

from mlflow.tracking import MlflowClient


def _config_without_gpus(run) -> str:
    name = run.data.tags.get("mlflow.runName", run.info.run_name or "")
    parts = [p for p in name.split(",") if not p.startswith("num_gpus=")]
    return ",".join(parts) or "(defaults)"


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uri", default="sqlite:///mlflow.db")
    ap.add_argument("--experiment", default="bertaccel")
    ap.add_argument("--buckets", action="store_true", help="each multi-rank run's DDP buckets as well")
    args = ap.parse_args(argv)
    client = MlflowClient(args.uri)
    exp = client.get_experiment_by_name(args.experiment)
    if exp is None:
        raise SystemExit(f"dp_table: no experiment {args.experiment!r} in {args.uri}")
    runs = [r for r in client.search_runs([exp.experiment_id], max_results=10000)
            if r.data.tags.get("bertaccel.role") != "sweep" and r.data.tags.get("status") == "finished"]
    groups = defaultdict(list)
    for r in runs:
        groups[_config_without_gpus(r)].append(r)
    print("| configuration | GPUs | samples/s | scaling | median ms/step | backward measured ms | model ms | "
          "model error % | thesis ms | thesis error % | test acc | mean ms/step |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    detail = []
    for config, members in sorted(groups.items()):
        members.sort(key=lambda r: int(r.data.tags.get("world_size", "1")))
        base = next((r.data.metrics.get("throughput_samples_s") for r in members
                     if r.data.tags.get("world_size", "1") == "1"), None)
        for r in members:
            m, world = r.data.metrics, int(r.data.tags.get("world_size", "1"))
            rate = m.get("throughput_samples_s")
            scaling = f"{rate / base:.3f}x" if rate and base else "-"
            print(f"| {config} | {world} | {_fmt(rate, '.0f')} | {scaling} | {_fmt(m.get('step_time_ms'), '.2f')} | "
                  f"{_fmt(m.get('backward_measured_ms'), '.2f')} | {_fmt(m.get('backward_predicted_ms'), '.2f')} | "
                  f"{_fmt(m.get('backward_estimate_error_pct'), '.1f')} | {_fmt(m.get('backward_predicted_thesis_ms'), '.2f')} | "
                  f"{_fmt(m.get('backward_thesis_error_pct'), '.1f')} | {_fmt(m.get('test_accuracy'), '.4f')} | "
                  f"{_fmt(m.get('step_time_mean_ms'), '.2f')} |")
            if args.buckets and world > 1 and "backward_measured_ms" in m:
                detail.append((config, world, r))
    for config, world, r in detail:
        with tempfile.TemporaryDirectory() as d:
            table = json.loads(Path(client.download_artifacts(r.info.run_id, "layer_timing/layer_timing.json", d)).read_text())
        print(f"\n{config}, {world} GPUs: forward ms by rank {[round(x, 2) for x in table['forward_ms_by_rank']]}, "
              f"backward ms by rank {[round(x, 2) for x in table['backward_ms_by_rank']]}")
        print(f"per pass, measured {[round(x, 2) for x in table['measured_by_pass_ms']]}")
        print(f"per pass, model    {[round(x, 2) for x in table['predicted_by_pass_ms']]}")
        print(f"per pass, last all-reduce end {[round(x, 2) for x in table.get('allreduce_end_by_pass_ms', [])]}")
        print("| bucket | layers | MiB | standalone all-reduce ms | ready ms by rank (from rank's backward start) | "
              "all-reduce end ms (rank 0) |")
        print("|---|---|---|---|---|---|")
        for b in table["buckets"]:
            print(f"| {b['index']} | {' '.join(b['layers'])} | {b['grad_bytes'] / 2**20:.1f} | {b['comm_ms']:.3f} | "
                  f"{' / '.join(f'{x:.2f}' for x in b['ready_ms_by_rank'])} | {b['done_ms']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
