"""Carbon: co2e_kg from energy, grid intensity and PUE (bertaccel/measure/carbon.py), its checks, and the
report's fifth score term, column and plot."""
from __future__ import annotations

import sys

import pytest
from omegaconf import OmegaConf
from report_store import Store

from bertaccel.config import ConfigError
from bertaccel.measure.carbon import REGIONS, co2e
from bertaccel.measure.collectors import Reading
from bertaccel.options.checks import validate
from bertaccel.report import STRATEGIES, load_rows, score_rows
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)


def _carbon(region="world", intensity=None):
    return OmegaConf.create({"region": region, "intensity_g_per_kwh": intensity})


def test_co2e_is_energy_times_pue_times_the_region_intensity_with_its_source():
    energy = Reading(0.5, "NVML total energy counter")
    r = co2e(energy, _carbon("fr"), {"name": "h100", "pue": 1.2, "pue_source": "example DC"})
    assert r.value == pytest.approx(0.5 * 1.2 * REGIONS["fr"].g_per_kwh / 1000)
    assert "PUE 1.2 (hardware profile 'h100': example DC)" in r.source and "2023, life-cycle" in r.source and ": France" in r.source
    plain = co2e(energy, _carbon(), {"name": "cpu"})
    assert plain.value == pytest.approx(0.5 * 480.8 / 1000)
    assert "no pue: IT energy only" in plain.source and "Ember" in plain.source
    given = co2e(energy, _carbon("de", 100.0), {"name": "cpu"})
    assert given.value == pytest.approx(0.05) and "carbon.intensity_g_per_kwh=100 (given" in given.source


def test_co2e_is_null_with_energys_reason_never_zero():
    r = co2e(Reading.null("RAPL: /sys/class/powercap not readable"), _carbon(), {"name": "cpu"})
    assert r.value is None and r.source == "null: energy_kwh unavailable (RAPL: /sys/class/powercap not readable)"


@pytest.mark.parametrize("override,message", [
    ("carbon.region=mars", "carbon.region='mars' is not in bertaccel/measure/carbon.py's table; choose one of world"),
    ("carbon.intensity_g_per_kwh=-3", "carbon.intensity_g_per_kwh=-3.0 must be >= 0"),
    ("hardware.pue=0.9", "hardware.pue=0.9 must be >= 1"),
])
def test_bad_carbon_settings_are_one_line(compose_cfg, override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate(compose_cfg(["hardware=cpu", override]))


def test_carbon_is_not_part_of_the_config_hash(compose_cfg):
    from bertaccel.record.run_record import cfg_hash

    assert cfg_hash(compose_cfg(["carbon.region=fr"])) == cfg_hash(compose_cfg(["carbon.region=us"]))


CSV = ("name,time_s,cost_usd,energy_kwh,occupancy_pct,accuracy,co2e_kg\n"
       "fast_dirty,10,1.0,0.010,50,0.90,0.0048\n"
       "slow_clean,20,2.0,0.012,50,0.90,0.0004\n")


def test_fifth_weight_scores_carbon_and_four_weights_score_as_before(tmp_path):
    (tmp_path / "c.csv").write_text(CSV)
    rows = load_rows("", "", None, str(tmp_path / "c.csv"))
    assert [r.co2e_kg for r in rows] == [0.0048, 0.0004]
    with_carbon = score_rows(rows, {**STRATEGIES, "green": (0, 0, 0, 0, 1.0)})
    assert with_carbon.best["green"] == 1 and with_carbon.best["balance"] == 0
    for r in rows:
        r.co2e_kg = None
    without = score_rows(rows, STRATEGIES)
    assert all(with_carbon.scores[s] == without.scores[s] for s in STRATEGIES)  # w5 = 0: the thesis' score


@pytest.mark.slow
def test_cli_five_weights_carbon_column_and_plot(tmp_path):
    (tmp_path / "c.csv").write_text(CSV)
    r = warm_cli.run([sys.executable, "-m", "bertaccel.report", "--csv", "c.csv", "--weights",
                      "green=0.2,0.2,0.1,0,0.5", "--out", "rep"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "green              best: slow_clean" in r.stdout
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "| green | 0.2 | 0.2 | 0.1 | 0 | 0.5 |" in md and "| balance | 0.3 | 0.3 | 0.3 | 0.1 | 0 |" in md
    assert (tmp_path / "rep" / "plots" / "co2e_vs_accuracy.png").stat().st_size > 1000
    bad = warm_cli.run([sys.executable, "-m", "bertaccel.report", "--csv", "c.csv", "--weights", "1,2,3,4,5,6"],
                       cwd=tmp_path, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "or five with w5 for carbon" in bad.stderr


def test_mlflow_rows_carry_co2e_or_its_reason(tmp_path):
    st = Store(tmp_path)
    st.log("a", {"precision": "fp32"}, {"train_time_s": 5, "test_accuracy": 0.8, "energy_kwh": 0.01,
                                        "co2e_kg": 0.0048})
    st.log("b", {"precision": "fp32"}, {"train_time_s": 6, "test_accuracy": 0.8},
           tags={"co2e_kg_source": "null: energy_kwh unavailable (no RAPL)"})
    rows = {r.name: r for r in load_rows(st.uri, "bertaccel", None, None)}
    assert rows["a"].co2e_kg == 0.0048
    assert rows["b"].co2e_kg is None and rows["b"].extra["co2e_kg"] == "null: energy_kwh unavailable (no RAPL)"
