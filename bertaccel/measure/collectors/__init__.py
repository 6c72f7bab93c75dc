"""Measurement sources around the training window; `build_collectors` picks them per device.

The training loop only sees a CollectorSet (start/stop/results); which sources are active,
and why the others are null, is decided here.
"""
from __future__ import annotations

import logging
from typing import Callable, List, Sequence

import torch

from bertaccel.measure.collectors.base import Collector, CollectorSet, Reading, Unavailable
from bertaccel.measure.collectors.cpu_energy import DEFAULT_ROOT, RaplEnergy, find_packages
from bertaccel.measure.collectors.gpm import GPM_METRICS, GpmActivity, NvmlUtilization, gpm_support
from bertaccel.measure.collectors.gpu_energy import NvmlEnergy
from bertaccel.measure.collectors.nvml import nvml_handles

__all__ = ["Collector", "CollectorSet", "Reading", "build_collectors", "ENERGY_METRICS", "ACTIVITY_METRICS"]

log = logging.getLogger("bertaccel")

ENERGY_METRICS = ("energy_kwh", "avg_power_w")
ACTIVITY_METRICS = tuple(GPM_METRICS) + ("gpu_util_pct",)


def _make(factory: Callable[[], Collector], metrics: Sequence[str]) -> Collector:
    try:
        return factory()
    except Exception as e:  # noqa: BLE001 - a source that cannot start is null, not fatal
        return Unavailable(metrics, f"could not start: {type(e).__name__}: {e}")


def build_collectors(devices: Sequence[torch.device], interval_s: float = 0.2,
                     rapl_root: str = DEFAULT_ROOT, enabled: bool = True) -> CollectorSet:
    """enabled=false: no sampler threads at all (to measure what they cost the loop); every
    measurement is then null with that reason."""
    if not enabled:
        return CollectorSet([Unavailable(ENERGY_METRICS + ACTIVITY_METRICS,
                                         "telemetry.enabled=false (collectors switched off for this run)")])
    collectors: List[Collector] = []
    if any(d.type == "cuda" for d in devices):
        handles, why = nvml_handles(devices)
        if why:
            return CollectorSet([Unavailable(ENERGY_METRICS + ACTIVITY_METRICS, why)])
        collectors.append(_make(lambda: NvmlEnergy(handles, interval_s), ENERGY_METRICS))
        gpm_why = gpm_support(handles)
        collectors.append(Unavailable(tuple(GPM_METRICS), gpm_why) if gpm_why else
                          _make(lambda: GpmActivity(handles, interval_s), tuple(GPM_METRICS)))
        collectors.append(_make(lambda: NvmlUtilization(handles, interval_s), ("gpu_util_pct",)))
    else:
        packages, why = find_packages(rapl_root)
        collectors.append(Unavailable(ENERGY_METRICS, why) if why else
                          _make(lambda: RaplEnergy(packages, interval_s), ENERGY_METRICS))
        collectors.append(Unavailable(ACTIVITY_METRICS, "no GPU: this run is on the CPU"))
    return CollectorSet(collectors)
