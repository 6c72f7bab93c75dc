"""Peak memory of one run, reset at the run's start so that runs of a sweep don't inherit it."""
from __future__ import annotations

import resource
from pathlib import Path
from typing import Optional, Tuple

import torch

GIB = 1024 ** 3


class PeakMemory:
    def __init__(self, device: torch.device):
        self.device = device
        self.rss_reset = False

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            # "5" resets the kernel's peak-RSS mark (VmHWM) for this process (Linux >= 4.0).
            Path("/proc/self/clear_refs").write_text("5")
            self.rss_reset = True
        except OSError:
            self.rss_reset = False

    def read(self) -> Tuple[Optional[float], str]:
        """(peak in GiB, source tag)."""
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / GIB, "torch.cuda.max_memory_allocated"
        if self.rss_reset:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024 / GIB, "process peak RSS (VmHWM, reset at run start)"
        # ru_maxrss (KiB on Linux) covers the whole process life, so it may include earlier runs.
        return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB,
                "process peak RSS (ru_maxrss, whole process lifetime: not reset per run)")
