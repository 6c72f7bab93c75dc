"""SM occupancy, SM activity, tensor activity and DRAM bandwidth from NVML GPM (Hopper+).

GPM metrics are defined between two samples: every `interval_s` the sampler takes a sample
per GPU and asks NVML for the metrics over the interval since the previous one, so the
means are time-weighted averages over exactly the training windows.

Occupancy (warps resident / max warps per SM) is low even for a saturated tensor-core GEMM
(13% measured on an H200 for an 8192^3 bf16 matmul at 91% SM activity), which is why SM and
tensor activity are logged beside it rather than instead of it.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

from bertaccel.measure.collectors.base import Reading, Sampler, TimeWeightedMean

# metric name -> pynvml constant name
GPM_METRICS = {
    "occupancy_pct": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "sm_active_pct": "NVML_GPM_METRIC_SM_UTIL",
    "tensor_active_pct": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "dram_bw_util_pct": "NVML_GPM_METRIC_DRAM_BW_UTIL",
}


def gpm_support(handles: List[Any]) -> Optional[str]:
    """None when every GPU supports GPM, else the reason (named after the GPU)."""
    import pynvml

    for h in handles:
        name = pynvml.nvmlDeviceGetName(h)
        name = name.decode() if isinstance(name, bytes) else name
        try:
            supported = bool(pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
        except (pynvml.NVMLError, AttributeError) as e:
            return f"NVML GPM query failed on {name}: {type(e).__name__}: {e}"
        if not supported:
            return f"NVML GPM unsupported on {name} (GPM needs Hopper or newer)"
    return None


class GpmActivity(Sampler):
    metrics = tuple(GPM_METRICS)

    def __init__(self, handles: List[Any], interval_s: float):
        # GPM needs samples >= 100 ms apart to give stable values.
        super().__init__(max(interval_s, 0.1))
        import pynvml

        self.nvml = pynvml
        self.handles = handles
        self.ids = [getattr(pynvml, c) for c in GPM_METRICS.values()]
        self.means = {m: TimeWeightedMean() for m in GPM_METRICS}
        self.invalid = {m: 0 for m in GPM_METRICS}  # intervals with an error or a NaN value
        self.samples = [[pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()] for _ in handles]
        self.intervals = 0

    def _open(self) -> None:
        for h, pair in zip(self.handles, self.samples):
            self.nvml.nvmlGpmSampleGet(h, pair[0])

    def _metrics(self, prev: Any, cur: Any) -> List[Optional[float]]:
        pynvml = self.nvml
        get = pynvml.c_nvmlGpmMetricsGet_t()
        get.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        get.numMetrics = len(self.ids)
        get.sample1, get.sample2 = prev, cur
        for i, mid in enumerate(self.ids):
            get.metrics[i].metricId = mid
        pynvml.nvmlGpmMetricsGet(get)
        # NaN has been seen on an H200 (DRAM bandwidth, one interval of 45): treated like an error.
        return [get.metrics[i].value if get.metrics[i].nvmlReturn == 0 and math.isfinite(get.metrics[i].value)
                else None for i in range(len(self.ids))]

    def _sample(self, now: float, dt: float) -> None:
        for h, pair in zip(self.handles, self.samples):
            self.nvml.nvmlGpmSampleGet(h, pair[1])
            for name, value in zip(GPM_METRICS, self._metrics(pair[0], pair[1])):
                if value is not None:
                    self.means[name].add(value, dt)  # GPUs averaged by adding each with weight dt
                else:
                    self.invalid[name] += 1
            pair.reverse()  # the newer sample is the next interval's start
        self.intervals += 1

    def results(self) -> Dict[str, Reading]:
        if self.error is not None:
            return {m: Reading.null(f"GPM sampling failed: {self.error}") for m in self.metrics}
        out = {}
        for name, const in GPM_METRICS.items():
            mean = self.means[name].mean
            skipped = f" ({self.invalid[name]} invalid/NaN skipped)" if self.invalid[name] else ""
            out[name] = (Reading(mean, f"NVML GPM {const}, time-weighted mean of {self.intervals} "
                                       f"intervals of ~{self.interval_s} s over the training windows"
                                       f"{skipped}, {len(self.handles)} GPU(s)")
                         if mean is not None else Reading.null(f"GPM returned no valid {const} sample"))
        return out

    def close(self) -> None:
        for pair in self.samples:
            for s in pair:
                self.nvml.nvmlGpmSampleFree(s)
        self.samples = []


class NvmlUtilization(Sampler):
    """nvmlDeviceGetUtilizationRates().gpu: the share of time any kernel ran. Not occupancy."""

    metrics = ("gpu_util_pct",)

    def __init__(self, handles: List[Any], interval_s: float):
        super().__init__(interval_s)
        import pynvml

        self.nvml = pynvml
        self.handles = handles
        self.mean = TimeWeightedMean()

    def _sample(self, now: float, dt: float) -> None:
        for h in self.handles:
            self.mean.add(float(self.nvml.nvmlDeviceGetUtilizationRates(h).gpu), dt)

    def results(self) -> Dict[str, Reading]:
        if self.error is not None:
            return {"gpu_util_pct": Reading.null(f"NVML sampling failed: {self.error}")}
        if self.mean.mean is None:
            return {"gpu_util_pct": Reading.null("no training window was measured")}
        return {"gpu_util_pct": Reading(self.mean.mean, (
            f"NVML nvmlDeviceGetUtilizationRates().gpu (share of time a kernel ran, not occupancy), "
            f"time-weighted mean every {self.interval_s} s over the training windows"))}
