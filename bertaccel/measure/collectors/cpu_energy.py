"""CPU package energy over the training windows, from Linux RAPL (powercap sysfs).

Each top-level `intel-rapl:N` domain (one per CPU package; AMD Zen exposes the same files)
has a microjoule counter `energy_uj` that wraps at `max_energy_range_uj`. It is polled in the
background often enough to see every wrap, and deltas are summed per package.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from bertaccel.measure.collectors.base import Reading, Sampler
from bertaccel.measure.collectors.gpu_energy import J_PER_KWH

DEFAULT_ROOT = "/sys/class/powercap"


def wrapped_delta_uj(prev: int, cur: int, max_range_uj: int) -> int:
    """Counter increase from prev to cur, allowing for one wrap at max_range_uj."""
    return cur - prev if cur >= prev else cur + max_range_uj - prev


def find_packages(root: str) -> Tuple[List[Path], Optional[str]]:
    """(package domain dirs, None) or ([], why RAPL cannot be read here)."""
    base = Path(root)
    if not base.is_dir():
        return [], f"RAPL unavailable: {root} does not exist (no powercap driver, or a VM/container without it)"
    domains = sorted(p for p in base.iterdir() if re.fullmatch(r"intel-rapl:\d+", p.name))
    if not domains:
        return [], f"RAPL unavailable: no intel-rapl:N package domain under {root}"
    try:
        for d in domains:
            int((d / "energy_uj").read_text())
    except PermissionError:
        return [], (f"RAPL not readable: {domains[0]}/energy_uj is root-only (Linux >= 5.10); "
                    "run as root or grant read access to it")
    except (OSError, ValueError) as e:
        return [], f"RAPL not readable: {type(e).__name__}: {e}"
    return domains, None


class RaplEnergy(Sampler):
    metrics = ("energy_kwh", "avg_power_w")

    def __init__(self, packages: List[Path], interval_s: float):
        # One wrap of a 262 kJ counter takes ~40 min at 100 W: a poll per second sees all wraps.
        super().__init__(max(interval_s, 1.0))
        self.packages = packages
        self.max_range = [int((p / "max_energy_range_uj").read_text()) for p in packages]
        self.names = [self._name(p) for p in packages]
        self.energy_uj = 0

    @staticmethod
    def _name(p: Path) -> str:
        try:
            return (p / "name").read_text().strip()
        except OSError:
            return p.name

    def _read(self) -> List[int]:
        return [int((p / "energy_uj").read_text()) for p in self.packages]

    def _open(self) -> None:
        self._prev = self._read()

    def _sample(self, now: float, dt: float) -> None:
        cur = self._read()
        for i, (a, b) in enumerate(zip(self._prev, cur)):
            self.energy_uj += wrapped_delta_uj(a, b, self.max_range[i])
        self._prev = cur

    def results(self) -> Dict[str, Reading]:
        if self.error is not None:
            return {m: Reading.null(f"RAPL sampling failed: {self.error}") for m in self.metrics}
        if self.window_s <= 0:
            return {m: Reading.null("no training window was measured") for m in self.metrics}
        joules = self.energy_uj / 1e6
        where = ", ".join(f"{n} ({p})" for n, p in zip(self.names, self.packages))
        src = (f"RAPL package energy_uj deltas over the training windows: {where}; whole CPU "
               "package(s), other processes included, DRAM and GPUs not")
        return {"energy_kwh": Reading(joules / J_PER_KWH, src),
                "avg_power_w": Reading(joules / self.window_s,
                                       f"energy_kwh / training-window seconds ({self.window_s:.2f} s)")}
