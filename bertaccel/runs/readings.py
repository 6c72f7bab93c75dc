"""The measured side of a run's record: energy, GPU activity, FLOPs/MFU and the kernel profile.

Everything here becomes `name -> Reading(value, source)`; job.py logs the values as MLflow
metrics and every source as a `<name>_source` tag, so a null always says why.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping

from bertaccel.measure.collectors import Reading
from bertaccel.measure.flops import mfu, peak_tflops
from bertaccel.measure.profiling import CATEGORIES
from bertaccel.train.result import TrainResult

FLOPS_SOURCE = ("analytic matmul FLOPs of forward+backward (flops.py: 6*P*T + 12*L*B*S^2*H when all "
                "layers train; frozen layers' backward left out), T = padded tokens computed")


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
                          "FLOPs on padded tokens")
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
