"""Collectors: the real NVML-free and RAPL paths, the threaded sampler, and never crashing a run."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from bertaccel.measure.collectors import ACTIVITY_METRICS, ENERGY_METRICS, CollectorSet, build_collectors
from bertaccel.measure.collectors.base import Collector, Sampler, TimeWeightedMean
from bertaccel.measure.collectors.cpu_energy import RaplEnergy, find_packages, wrapped_delta_uj
from bertaccel.measure.collectors.gpu_energy import counter_delta_j
from bertaccel.measure.collectors.nvml import nvml_handles

ALL = ENERGY_METRICS + ACTIVITY_METRICS


def _nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        return True
    except Exception:
        return False


def test_cpu_run_without_rapl_is_null_with_reasons(tmp_path):
    cs = build_collectors([torch.device("cpu")], interval_s=0.05, rapl_root=str(tmp_path / "absent"))
    cs.start()
    cs.stop()
    out = cs.results()
    assert set(out) == set(ALL)
    for name in ALL:
        assert out[name].value is None, name
        assert out[name].source.startswith("null: "), out[name]
    assert "does not exist" in out["energy_kwh"].source
    assert out["occupancy_pct"].source == "null: no GPU: this run is on the CPU"


@pytest.mark.skipif(_nvml_works(), reason="this machine has a working NVML")
def test_gpu_request_without_nvml_library_is_null_with_the_nvml_error():
    # The real pynvml path on a machine without libnvidia-ml: no torch.cuda call is needed.
    handles, why = nvml_handles([torch.device("cuda", 0)])
    assert handles == [] and why.startswith("NVML unavailable")
    out = build_collectors([torch.device("cuda", 0)]).results()
    assert set(out) == set(ALL)
    assert all(r.value is None and "NVML unavailable" in r.source for r in out.values())


def test_energy_counter_delta_and_reset_guard():
    assert counter_delta_j(1_000, 6_000, integrated_j=99.0) == (5.0, "counter")
    assert counter_delta_j(9_000, 2_000, integrated_j=7.5) == (7.5, "reset")      # went backwards
    assert counter_delta_j(None, None, integrated_j=3.25) == (3.25, "integrated")  # no counter


def test_rapl_wrap():
    assert wrapped_delta_uj(100, 350, 1000) == 250
    assert wrapped_delta_uj(900, 50, 1000) == 150


def _fake_powercap(root: Path, packages: dict, max_range: int = 1_000_000) -> None:
    """A powercap tree laid out like Linux's: packages intel-rapl:N plus a core subdomain."""
    for i, uj in packages.items():
        d = root / f"intel-rapl:{i}"
        d.mkdir(parents=True)
        (d / "name").write_text(f"package-{i}\n")
        (d / "energy_uj").write_text(f"{uj}\n")
        (d / "max_energy_range_uj").write_text(f"{max_range}\n")
        sub = root / f"intel-rapl:{i}:0"  # core subdomain: must not be counted twice
        sub.mkdir()
        (sub / "energy_uj").write_text("0\n")


def test_rapl_collector_sums_packages_across_windows_and_wraps(tmp_path):
    _fake_powercap(tmp_path, {0: 999_900, 1: 10})
    packages, why = find_packages(str(tmp_path))
    assert why is None and [p.name for p in packages] == ["intel-rapl:0", "intel-rapl:1"]
    rapl = RaplEnergy(packages, interval_s=0.05)
    rapl.start()
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("400\n")      # wrapped: +500 uJ
    (tmp_path / "intel-rapl:1" / "energy_uj").write_text("800010\n")  # +800,000 uJ
    time.sleep(0.05)
    rapl.stop()
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("900\n")      # between windows: not counted
    rapl.start()
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("1900\n")     # +1,000 uJ
    rapl.stop()
    out = rapl.results()
    assert out["energy_kwh"].value == pytest.approx((500 + 800_000 + 1_000) / 1e6 / 3.6e6)
    assert "package-0" in out["energy_kwh"].source and "package-1" in out["energy_kwh"].source
    assert out["avg_power_w"].value == pytest.approx(0.8015 / rapl.window_s)


def test_rapl_on_this_machine_if_readable():
    packages, why = find_packages("/sys/class/powercap")
    if why:
        pytest.skip(why)
    rapl = RaplEnergy(packages, interval_s=1.0)
    rapl.start()
    x = torch.randn(512, 512)
    t_end = time.time() + 1.0
    while time.time() < t_end:
        x = x @ x.T / 512
    rapl.stop()
    assert rapl.results()["energy_kwh"].value > 0


class _Counting(Sampler):
    metrics = ("ticks",)

    def __init__(self, interval_s):
        super().__init__(interval_s)
        self.ticks = 0
        self.covered_s = 0.0

    def _sample(self, now, dt):
        self.ticks += 1
        self.covered_s += dt

    def results(self):
        from bertaccel.measure.collectors.base import Reading

        return {"ticks": Reading(float(self.ticks), "test")}


def test_sampler_thread_covers_the_window_exactly():
    s = _Counting(0.02)
    s.start()
    time.sleep(0.3)
    s.stop()
    s.stop()  # a second stop is harmless
    assert s.ticks >= 5
    # The final tick at stop() closes the last interval: intervals add up to the window.
    assert s.covered_s == pytest.approx(s.window_s, abs=0.01)


def test_time_weighted_mean():
    m = TimeWeightedMean()
    assert m.mean is None
    m.add(10.0, 1.0)
    m.add(40.0, 3.0)
    m.add(99.0, 0.0)  # no time covered: no weight
    assert m.mean == pytest.approx(32.5)


class _Broken(Collector):
    metrics = ("broken_metric",)

    def start(self):
        raise OSError("device vanished")

    def results(self):
        raise AssertionError("never asked: start failed")


def test_a_failing_collector_is_null_with_reason_and_others_still_measure(tmp_path):
    _fake_powercap(tmp_path, {0: 0})
    packages, _ = find_packages(str(tmp_path))
    cs = CollectorSet([_Broken(), RaplEnergy(packages, 0.05)])
    cs.start()
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("3600000\n")  # 3.6 J
    cs.stop()
    out = cs.results()
    assert out["broken_metric"].value is None
    assert "_Broken.start() failed: OSError: device vanished" in out["broken_metric"].source
    assert out["energy_kwh"].value == pytest.approx(3.6 / 3.6e6)
