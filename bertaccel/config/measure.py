"""The telemetry and profile_window blocks: what a run measures (bertaccel/measure/); no option
of their own: their declared ranges are their checks."""
from __future__ import annotations

import threading
from dataclasses import dataclass

from bertaccel.option import bounded


@dataclass
class TelemetryConfig:
    """Energy and activity measured while a run trains (bertaccel/measure/)."""
    # Measure energy and activity while training; false: no collectors (their sampler threads share
    # the GIL with the loop), and the measurements are null with that reason.
    enabled: bool = True
    # Background sampling period of NVML power, GPM and utilization (RAPL polls at >= 1 s).
    # At most threading.TIMEOUT_MAX: the samplers wait on a threading.Event for this long.
    interval_s: float = bounded(0.2, gt=0, le=threading.TIMEOUT_MAX)
    # Where Linux exposes RAPL energy counters (CPU runs: package energy).
    rapl_root: str = "/sys/class/powercap"


@dataclass
class ProfileWindowConfig:
    """The torch.profiler window of profile=true (bertaccel/measure/)."""
    warmup_steps: int = bounded(3, ge=0)  # Steps run before recording (allocator, autotuning, caches settle)
    active_steps: int = bounded(5, gt=0)  # Steps recorded
    top_k: int = bounded(10, gt=0)  # Kernels listed in the artifact, the longest first
