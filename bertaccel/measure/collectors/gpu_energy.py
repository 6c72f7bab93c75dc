"""GPU energy over the training windows, from NVML's total-energy counter.

nvmlDeviceGetTotalEnergyConsumption (mJ since driver load, Volta and newer) is read at each
window's edges. Power is also sampled in the background, for two reasons: GPUs without the
counter get energy by integrating it, and a counter that went backwards inside a window (a
driver reload resets it) is replaced by the integral for that window instead of giving a
negative or wrapped number.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from bertaccel.measure.collectors.base import Reading, Sampler

J_PER_KWH = 3.6e6


def counter_delta_j(start_mj: Optional[int], end_mj: Optional[int], integrated_j: float) -> tuple:
    """(joules, how) for one GPU and one window: the counter delta, or the power integral when
    the counter is missing or went backwards."""
    if start_mj is None or end_mj is None:
        return integrated_j, "integrated"
    if end_mj < start_mj:
        return integrated_j, "reset"
    return (end_mj - start_mj) / 1000.0, "counter"


class NvmlEnergy(Sampler):
    metrics = ("energy_kwh", "avg_power_w")

    def __init__(self, handles: List[Any], interval_s: float):
        super().__init__(interval_s)
        import pynvml

        self.nvml = pynvml
        self.handles = handles
        self.has_counter = []
        for h in handles:
            try:
                pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
                self.has_counter.append(True)
            except pynvml.NVMLError:
                self.has_counter.append(False)
        self.energy_j = 0.0
        self.how: List[str] = []  # per GPU per window: counter | integrated | reset

    def _counter(self, i: int) -> Optional[int]:
        return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handles[i]) if self.has_counter[i] else None

    def _power_w(self) -> List[float]:
        return [self.nvml.nvmlDeviceGetPowerUsage(h) / 1000.0 for h in self.handles]

    def _open(self) -> None:
        self._start_mj = [self._counter(i) for i in range(len(self.handles))]
        self._prev_w = self._power_w()
        self._integrated_j = [0.0] * len(self.handles)

    def _sample(self, now: float, dt: float) -> None:
        watts = self._power_w()
        for i, w in enumerate(watts):  # trapezoid rule between consecutive samples
            self._integrated_j[i] += 0.5 * (w + self._prev_w[i]) * dt
        self._prev_w = watts

    def _close(self) -> None:
        for i in range(len(self.handles)):
            joules, how = counter_delta_j(self._start_mj[i], self._counter(i), self._integrated_j[i])
            self.energy_j += joules
            self.how.append(how)

    def results(self) -> Dict[str, Reading]:
        if self.error is not None:
            return {m: Reading.null(f"NVML sampling failed: {self.error}") for m in self.metrics}
        if not self.how:
            return {m: Reading.null("no training window was measured") for m in self.metrics}
        n = len(self.handles)
        if all(h == "counter" for h in self.how):
            src = f"NVML nvmlDeviceGetTotalEnergyConsumption delta over the training windows, {n} GPU(s)"
        else:
            counts = {k: self.how.count(k) for k in ("counter", "integrated", "reset")}
            src = (f"NVML power (nvmlDeviceGetPowerUsage every {self.interval_s} s) integrated over the "
                   f"training windows where the energy counter was unsupported or reset "
                   f"(GPU-windows: {counts['counter']} counter, {counts['integrated']} no counter, "
                   f"{counts['reset']} counter reset), {n} GPU(s)")
        return {
            "energy_kwh": Reading(self.energy_j / J_PER_KWH, src),
            "avg_power_w": Reading(self.energy_j / self.window_s if self.window_s > 0 else None,
                                   f"energy_kwh / training-window seconds ({self.window_s:.2f} s), "
                                   f"summed over {n} GPU(s)"),
        }
