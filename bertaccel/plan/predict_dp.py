"""Predict a data-parallel step time on N GPUs from a 1-GPU run, before renting N GPUs.

    python -m bertaccel.plan.predict_dp --uri sqlite:///mlflow.db --run-id <1-GPU run with layer_timing=true> \
        --bus-bandwidth-gb-s 350 --gpus 2,4,8 [--latency-ms 0.02] [--check-run-id <N-GPU run>]

The run's per-layer backward compute times and gradient bytes (artifact layer_timing.json) go
into backprop_estimator.predict_step_ms with a ring all-reduce at the given bus bandwidth
(nccl-tests' busbw on the target machine): what N ranks add to the backward (the all-reduce time
not hidden behind compute) is added to the step of N ranks that wait for the slowest of them
(backprop_estimator.slowest_rank_step_ms over the run's own steady steps, its step_ms series;
N=1: its median step, step_time_ms), so the parts of a step the phases do not cover (the host's
work, data, the GradScaler's checks) count as they were measured. (Forward + backward +
optimizer phases alone undershot a 1-GPU fp16 step by 18 % on an H200: 27.2 against 33.0 ms.
The 1-GPU median alone undershot the 4-GPU step of the thesis point by 30 % on 4 H200s; the
slowest of 4 draws by 13 %: see docs/scale.md.) --check-run-id compares a prediction with a real
N-GPU run's step_time_ms. Prints one Markdown table.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

from bertaccel.measure.backprop_estimator import error_pct, predict_step_ms, slowest_rank_step_ms
from bertaccel.measure.step_clock import steady_steps

if TYPE_CHECKING:  # (MLflow is imported when a run is read, not for --help)
    from bertaccel.record.access import Reader, RecordedRun


class PredictError(ValueError):
    """Bad input; the message is the one line the user sees."""


def _run(client: Reader, run_id: str) -> RecordedRun:
    try:
        return client.get_run(run_id)
    except Exception as e:  # noqa: BLE001 - MLflow raises several types for an unknown id
        raise PredictError(f"run {run_id} not found in the store ({type(e).__name__})") from None


def _layers(client: Reader, run: RecordedRun) -> Dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        try:
            path = client.download_artifacts(run.info.run_id, "layer_timing/layer_timing.json", d)
        except Exception:  # noqa: BLE001
            raise PredictError(f"run {run.info.run_id} has no layer_timing artifact: run it with layer_timing=true")
        table: Dict[str, Any] = json.loads(Path(path).read_text())  # (layer_timing's JSON object)
        return table


def _steady_steps(client: Reader, run: RecordedRun) -> List[float]:
    """The run's steps (its step_ms series) with each window's first steps left out, as
    step_time_ms leaves them out (step_clock.steady_steps); windows are the epochs, of equal step counts."""
    series = [m.value for m in sorted(client.get_metric_history(run.info.run_id, "step_ms"), key=lambda m: m.step)]
    if not series:
        raise PredictError(f"run {run.info.run_id} has no step_ms series (runs log it since 2026-11-26): run it again")
    epochs = max(1, int(run.data.params.get("train.epochs", "1")))
    per = -(-len(series) // epochs)
    return steady_steps([series[i:i + per] for i in range(0, len(series), per)])


def predict(uri: str, run_id: str, bus_gb_s: float, gpus: List[int], latency_ms: float,
            check_run_id: Optional[str] = None) -> str:
    from bertaccel.record.access import reader

    if bus_gb_s <= 0:
        raise PredictError(f"--bus-bandwidth-gb-s={bus_gb_s} must be > 0")
    client = reader(uri)
    run = _run(client, run_id)
    table = _layers(client, run)
    if table["world_size"] != 1:
        raise PredictError(f"run {run_id} ran on {table['world_size']} ranks: predict from a num_gpus=1 run")
    m = run.data.metrics
    missing = [k for k in ("forward_ms", "optimizer_ms", "step_time_ms") if k not in m]
    if missing:
        raise PredictError(f"run {run_id} has no {', '.join(missing)} (step graphs record no phases)")
    compute = [x["compute_ms"] for x in table["layers"]]
    grad_bytes = [x["grad_bytes"] for x in table["layers"]]
    check = _run(client, check_run_id) if check_run_id else None
    check_world = int(check.data.tags.get("world_size", "0")) if check else None
    lines = ["| GPUs | predicted ms/step | measured ms/step | error % |", "|---|---|---|---|"]
    steps = _steady_steps(client, run)
    one = predict_step_ms(compute, grad_bytes, bus_gb_s, 1, m["forward_ms"], m["optimizer_ms"])
    for n in gpus:
        added = predict_step_ms(compute, grad_bytes, bus_gb_s, n, m["forward_ms"], m["optimizer_ms"],
                                allreduce_latency_ms=latency_ms) - one
        p = slowest_rank_step_ms(steps, n) + added
        measured = check.data.metrics.get("step_time_ms") if check is not None and check_world == n else None
        err = f"{error_pct(p, measured):.1f}" if measured else "-"
        lines.append(f"| {n} | {p:.2f} | {'-' if measured is None else f'{measured:.2f}'} | {err} |")
    lines.append(f"\nfrom run {run_id}: the median step of N ranks waiting for the slowest, each a draw from its "
                 f"{len(steps)} steady 1-GPU steps (median {slowest_rank_step_ms(steps, 1):.2f} ms; "
                 f"backprop_estimator.slowest_rank_step_ms), + the exposed all-reduce time N ranks add to its backward "
                 f"of {len(compute)} layers ({sum(compute):.2f} ms of compute); ring all-reduce at {bus_gb_s:g} GB/s bus "
                 f"bandwidth, {latency_ms:g} ms latency per all-reduce. Assumes per-GPU compute does not change with N "
                 "and the ranks' steps are independent (see backprop_estimator.predict_step_ms).")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uri", default="sqlite:///mlflow.db")
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--bus-bandwidth-gb-s", type=float, required=True)
    ap.add_argument("--gpus", default="2,4,8")
    ap.add_argument("--latency-ms", type=float, default=0.0)
    ap.add_argument("--check-run-id")
    args = ap.parse_args(argv)
    try:
        gpus = [int(g) for g in args.gpus.split(",")]
        if any(g < 1 for g in gpus):
            raise ValueError
    except ValueError:
        print(f"error: --gpus={args.gpus!r} must be positive integers separated by commas, e.g. 2,4,8", file=sys.stderr)
        return 2
    try:
        print(predict(args.uri, args.run_id, args.bus_bandwidth_gb_s, gpus, args.latency_ms, args.check_run_id))
    except PredictError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
