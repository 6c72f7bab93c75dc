"""A finished run's readings, from its TrainResult, for its MLflow record (job.py logs them).

- run_metrics / run_metric_sources: the loop's own numbers (times, steps, samples, start-up, cost)
  and how each was measured, its `<metric>_source` tag;
- derived: the measured side, energy, GPU activity, FLOPs/MFU and the kernel profile, each a
  Reading(value, source), so a null always says why;
- log_accumulation, log_backprop: the adaptive-accumulation series and the layer-timing estimate.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

import torch

from bertaccel.config import RunConfig
from bertaccel.options.optimizer import scales_lr
from bertaccel.measure.collectors import Reading
from bertaccel.measure.flops import mfu, peak_tflops
from bertaccel.measure.profiling import CATEGORIES
from bertaccel.measure.step_clock import steady_source
from bertaccel.train.result import TrainResult

TIMER_SOURCE = "time.perf_counter (device synchronized at window edges)"
FLOPS_SOURCE = ("analytic matmul FLOPs of forward+backward (flops.py: 6*P*T + 12*L*B*S^2*H when all "
                "layers train; frozen layers' backward left out), T and B*S^2 as the encoder computed them: "
                "the packed real tokens and sum of L^2 for attention=xformers|triton and encoder=fused run "
                "eagerly; all B*S tokens and sum of L^2 + (S-L)^2 where they pack statically (CUDA graphs, "
                "torch.compile, encoder.packed=false); else the padded B*S and B*S^2")


def derived(readings: Mapping[str, Reading], result: TrainResult, profile: Mapping[str, Any],
            precision: str, num_gpus: int) -> Dict[str, Reading]:
    out = dict(readings)
    energy = readings.get("energy_kwh", Reading.null("no energy collector"))
    samples = result.samples
    if energy.value is not None and energy.value > 0:
        out["energy_per_sample_j"] = Reading(energy.value * 3.6e6 / samples,
                                             f"energy_kwh x 3.6e6 / {samples} samples trained")
        out["samples_per_kwh"] = Reading(samples / energy.value, f"{samples} samples trained / energy_kwh")
    else:
        why = energy.source[len("null: "):] if energy.value is None else "energy_kwh is 0"
        out["energy_per_sample_j"] = Reading.null(f"energy_kwh unavailable ({why})")
        out["samples_per_kwh"] = Reading.null(f"energy_kwh unavailable ({why})")

    tokens = result.tokens
    flops = result.model_flops
    out["model_flops"] = Reading(flops, FLOPS_SOURCE)
    out["achieved_tflops"] = Reading(flops / result.train_time_s / 1e12, "model_flops / train_time_s")
    out["padded_tokens"] = Reading(float(tokens.padded_tokens), "sum of B x S over the trained batches")
    out["real_tokens"] = Reading(float(tokens.real_tokens), "sum of the trained batches' attention masks")
    peak, peak_source = peak_tflops(profile, precision)
    out["mfu"] = (Reading(mfu(flops, result.train_time_s, peak, num_gpus),
                          f"model_flops / train_time_s / ({peak_source} x num_gpus={num_gpus}); "
                          "FLOPs on the tokens computed")
                  if peak is not None else Reading.null(f"{peak_source}; set hardware.peak_tflops_{precision}"))

    if result.profile is not None:
        kp = result.profile
        for c in CATEGORIES:
            out[f"profile_{c}_share"] = Reading(kp.shares[c], f"torch.profiler self time of {kp.timeline}, "
                                                              f"{kp.steps} steps after training")
    else:
        why = (f"profile failed: {result.profile_error}" if result.profile_error else
               "profile=false (set profile=true for a kernel profile)")
        for c in CATEGORIES:
            out[f"profile_{c}_share"] = Reading.null(why)
    return out


def run_metrics(cfg: RunConfig, result: Any, data: Any, raw: Any, peak_gib: Optional[float],
             price: Optional[float], started_at: float) -> Dict[str, Any]:
    """The run's metrics from train()'s result (the collectors' readings come apart)."""
    return {
        "train_time_s": result.train_time_s,
        "eval_time_s": result.eval_time_s,
        "test_accuracy": result.test_accuracy,
        "throughput_samples_s": result.samples / result.train_time_s,
        "train_samples": result.samples,
        "peak_memory_gib": peak_gib,
        "cost_usd": None if price is None else result.train_time_s / 3600 * price * cfg.num_gpus,
        "optimizer_steps": result.optimizer_steps,
        "tokenize_time_s": data.tokenize_time_s,
        "compile_graphs": result.compile_graphs,
        "compile_time_s": result.compile_time_s,
        "recompiles_in_window": result.recompiles_in_window,
        "compiles_in_eval": result.compiles_in_eval,
        "step_time_ms": result.step_time_ms,
        # The mean beside the median: throughput sees every step and the window's edges, the median
        # none of the slow ones (data-parallel runs on 4 H200s: mean 22 ms above a 53 ms median).
        "step_time_mean_ms": (1000 * result.train_time_s / result.optimizer_steps
                              if result.optimizer_steps else None),
        "time_to_train_s": result.last_window_end_unix - started_at,
        "startup_overhead_s": result.first_step_started_at - started_at,
        "dataset_train_rows": len(data.train),
        "dataset_train_rows_full": raw.train_rows_full,
        "train_loss": result.epochs[-1].train_loss,
        **result.phase_ms,
    }


def run_metric_sources(cfg: RunConfig, result: Any, peak_source: str, price: Optional[float],
                       profile: Mapping[str, Any], what_if_note: str, device: torch.device,
                    started_source: str) -> Dict[str, str]:
    """How each of run_metrics' values was measured (its `<metric>_source` tag)."""
    return {
        "train_time_s_source": TIMER_SOURCE, "eval_time_s_source": TIMER_SOURCE,
        "throughput_samples_s_source": "samples trained / train_time_s",
        # max_steps_per_epoch caps optimizer steps: with accumulation k a capped run trains k x the rows.
        "train_samples_source": "rows of every trained micro-batch, summed over epochs and ranks",
        "peak_memory_gib_source": peak_source,
        "cost_usd_source": (f"train_time_s / 3600 x {price} USD/h ({profile.get('price_source') or 'profile'})"
                            f" x num_gpus={cfg.num_gpus}{what_if_note}") if price is not None else
                           f"null: hardware profile '{profile['name']}' has no price_per_gpu_hour_usd",
        "compile_graphs_source": ("torch._dynamo counters['stats']['unique_graphs'] since the run's reset"
                                  if result.compile_graphs is not None else "null: compile=off"),
        "compile_time_s_source": result.compile_time_source,
        "recompiles_in_window_source": ("dynamo graphs + our Triton kernel variants + CUDA-graph "
                                        "recordings counted before and after each training window"),
        "compiles_in_eval_source": ("the same compile events counted before and after each evaluation (the warm-up "
                                    "covers the evaluation shapes: any here are in eval_time_s)"),
        "step_time_ms_source": steady_source(device),
        "step_time_mean_ms_source": ("train_time_s / optimizer steps: every step and the training windows' edges"
                                     if result.optimizer_steps else "null: no optimizer step"),
        "step_ms_source": ("each optimizer step's time, the training windows one after another (MLflow step = "
                           "the step's index); " + steady_source(device).split("; ", 1)[1]),
        **{f"{k}_source": (f"one-step breakdown (step_clock.PhaseClock): {steady_source(device)}; marks after "
                           "each forward and backward and after the update" if v is not None else
                           "null: compile.step_graph replays the whole step as one CUDA graph, no phase marks")
           for k, v in result.phase_ms.items()},
        "time_to_train_s_source": f"time.time() at the end of the last training window minus {started_source}",
        "startup_overhead_s_source": f"time.time() at the first training step minus {started_source}",
        "dataset_train_rows_full_source": "rows of the train split before dataset.train_subset",
        "lr_source": (f"the lr of each optimizer step (MLflow step = global step): optimizer.lr"
                      f"{' x effective batch / base_batch_size' if scales_lr(cfg.optimizer) else ''}"
                      f" x schedule {cfg.optimizer.schedule}"),
    }


def log_accumulation(tracker: Any, result: Any, metrics: Dict[str, Any]) -> None:
    """accumulation=adaptive: the window size and gradient variance of each optimizer step."""
    tracker.log_series("accumulation_k", result.accumulation_k)
    tracker.log_series("grad_variance", [v for v in result.grad_variance if v is not None])
    metrics["accumulation_mean"] = sum(result.accumulation_k) / len(result.accumulation_k)
    tracker.log_metrics({"accumulation_mean": metrics["accumulation_mean"]})
    tracker.set_tags({
        "accumulation_k_source": "accumulation=adaptive: micro-batches in each optimizer step's window "
                                 "(Systematic Training Compute Optimization, eq. 6, bounded to [2, accumulation_max]; the first is the max)",
        "grad_variance_source": "eq. 7 over each window's micro-batch gradients (mean-loss, fp16 scale removed); "
                                "MLflow step = the optimizer step it was measured in",
        "accumulation_mean_source": "mean of accumulation_k over the run's optimizer steps"})


def log_backprop(tracker: Any, timing: Any, metrics: Dict[str, Any], device: torch.device) -> None:
    """layer_timing=true: the thesis' estimate against the measured backward, and the per-layer
    table as an artifact (bertaccel.plan.predict_dp reads it)."""
    values = {"backward_measured_ms": timing.measured_backward_ms,
              "backward_predicted_ms": timing.predicted_backward_ms,
              "backward_estimate_error_pct": timing.error_pct,
              "backward_predicted_thesis_ms": timing.predicted_thesis_ms,
              "backward_thesis_error_pct": timing.thesis_error_pct}
    tracker.log_metrics(values)
    metrics.update(values)
    clock = "CUDA events" if device.type == "cuda" else "time.perf_counter"
    thesis = ("backprop_estimator.estimate_backward (Hardware Acceleration of Machine Learning, section 3.5.2) over rank 0's per-layer compute "
              "(gradient-ready hooks) and comm (standalone all-reduce of each layer's gradient bytes, "
              f"world_size={timing.world_size})")
    model = thesis if not timing.buckets else (
        f"backprop_estimator.estimate_backward_ranks over DDP's {len(timing.buckets)} gradient buckets: every "
        f"rank's bucket-ready marks from its own backward start (ranks started together), standalone all-reduce "
        f"of each bucket's bytes, world_size={timing.world_size}; median over the passes")
    tracker.set_tags({
        "backward_measured_ms_source": (f"layer_timing: median of {timing.steps} backward passes after training, "
                                        f"start of backward to the end of DDP's last all-reduce ({clock})"),
        "backward_predicted_ms_source": model,
        "backward_estimate_error_pct_source": "|predicted - measured| / measured x 100",
        "backward_predicted_thesis_ms_source": thesis,
        "backward_thesis_error_pct_source": "|thesis' estimate - measured| / measured x 100",
    })
    with tempfile.TemporaryDirectory(prefix="bertaccel-layers-") as d:
        (Path(d) / "layer_timing.json").write_text(json.dumps(timing.to_json(), indent=1))
        tracker.log_artifacts(d, "layer_timing")


def run_waits(run: Any) -> Dict[str, Any]:
    """A finished run's waits (wall.py reads them): start-up, warm-up and its cache state, evaluation,
    and the run's wall from its start to its record's end (MLflow end_time)."""
    m, tags = run.data.metrics, run.data.tags
    out: Dict[str, Any] = {k: m[k] for k in ("startup_overhead_s", "compile_time_s", "eval_time_s", "time_to_train_s")
                           if m.get(k) is not None}
    out["compile_cache"] = tags.get("compile_cache", "")
    out["started_source"] = tags.get("startup_overhead_s_source", "")
    try:
        windows = json.loads(tags.get("train_windows_unix", "[]"))
        if windows and run.info.end_time and "time_to_train_s" in out:
            # time_to_train_s ends at the last window; after it: the last evaluation and the record.
            out["run_wall_s"] = out["time_to_train_s"] + run.info.end_time / 1e3 - windows[-1][1]
    except (ValueError, TypeError, IndexError):
        pass
    return out
