"""Time, energy and cost to a target accuracy: the interpolation by hand, first-epoch and
never-reached cases, from a real MLflow store (per-epoch test_accuracy + train_windows_unix) and
from CSV columns; bad input is one line, exit 2."""
from __future__ import annotations

import sys

import pytest
from report_store import Store

from bertaccel.report import Row, rows_from_csv, rows_from_mlflow
from bertaccel.report.target import reach
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

HEADER = "name,time_s,cost_usd,energy_kwh,occupancy_pct,accuracy"


def _cli(args, cwd):
    return warm_cli.run([sys.executable, "-m", "bertaccel.report", *args], cwd=cwd, capture_output=True, text=True)


def _row(**kw):
    return Row("r", 33.0, 0.33, 0.033, 50, 0.90, epoch_accuracy=(0.80, 0.86, 0.90), epoch_time_s=(10.0, 12.0, 11.0),
               **kw)


def test_interpolated_within_the_epoch_it_was_reached_in():
    x = reach(_row(), 0.88)
    # Reached in epoch 3: 0.86 after 22 s, 0.90 after 33 s; halfway through epoch 3's 11 s.
    assert (x.reached, x.epoch) == (True, 3)
    assert x.time_s == pytest.approx(22 + (0.88 - 0.86) / (0.90 - 0.86) * 11)  # 27.5 s
    assert x.energy_kwh == pytest.approx(0.033 / 33 * 27.5)  # the run's average rate over its windows
    assert x.cost_usd == pytest.approx(0.33 / 33 * 27.5)
    assert "interpolated: 0.8600 after epoch 2, 0.9000 after epoch 3" in x.how
    at = reach(_row(), 0.86)  # reached exactly at the end of epoch 2
    assert (at.epoch, at.time_s) == (2, pytest.approx(22.0))


def test_first_epoch_is_an_upper_bound_and_not_reached_says_how_far():
    first = reach(_row(), 0.75)
    assert (first.epoch, first.time_s) == (1, 10.0) and "upper bound" in first.how
    never = reach(_row(), 0.95)
    assert never.reached is False and never.time_s is None
    assert never.how == "not reached: best 0.9000 after epoch 3 of 3"


def test_unknown_when_inputs_are_missing_and_null_energy_says_why():
    no_windows = reach(_row().__class__("r", 33.0, epoch_accuracy=(0.9,), extra={"epoch_time_s": "tag not logged"}),
                       0.5)
    assert no_windows.reached is None and no_windows.why["time_s"] == "epoch_time_s tag not logged"
    none = reach(Row("r", 10.0), 0.5)
    assert none.reached is None and none.why["time_s"] == "no per-epoch test_accuracy"
    no_energy = reach(Row("r", 33.0, 0.33, None, epoch_accuracy=(0.9,), epoch_time_s=(33.0,),
                          extra={"energy_kwh": "null: RAPL unavailable"}), 0.5)
    assert no_energy.energy_kwh is None and no_energy.why == {"energy_kwh": "null: RAPL unavailable"}
    assert no_energy.cost_usd == pytest.approx(0.33)


@pytest.mark.slow
def test_from_a_real_mlflow_store_and_the_cli(tmp_path):
    store = Store(tmp_path)
    t0 = 1_700_000_000.0
    # Windows of 10, 12 and 11 s with 1 s of evaluation between them (not counted).
    windows = [(t0, t0 + 10), (t0 + 11, t0 + 23), (t0 + 24, t0 + 35)]
    store.log("slow", {"train.seed": "1"}, {"train_time_s": 33.0, "cost_usd": 0.33, "energy_kwh": 0.033},
              {"energy_kwh_source": "RAPL package energy_uj deltas"}, epoch_accuracy=(0.80, 0.86, 0.90),
              windows=windows)
    store.log("never", {"train.seed": "1"}, {"train_time_s": 33.0, "cost_usd": 0.33, "energy_kwh": 0.033},
              epoch_accuracy=(0.5, 0.6, 0.7), windows=windows)
    store.log("old run", {"train.seed": "1"}, {"train_time_s": 33.0, "test_accuracy": 0.9})  # no windows tag
    rows = {r.name: r for r in rows_from_mlflow(store.uri, "bertaccel")}
    assert rows["slow"].epoch_accuracy == (0.80, 0.86, 0.90)
    assert rows["slow"].epoch_time_s == pytest.approx((10.0, 12.0, 11.0))
    assert reach(rows["slow"], 0.88).time_s == pytest.approx(27.5)
    assert reach(rows["old run"], 0.88).why["time_s"] == "epoch_time_s tag train_windows_unix not logged"
    r = _cli(["--uri", store.uri, "--target-accuracy", "0.88", "--out", "rep"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "target accuracy 0.88: reached by 1 of 3 runs" in r.stdout
    md = (tmp_path / "rep" / "report.md").read_text()
    # The per-run table is in the appendix; each run is named with its seed (repeats.run_label).
    table = md.split("### Time to accuracy 0.88 (MLPerf-style time to train)")[1].split("\n#")[0]
    assert "| slow (seed 1) | yes | 3 | 27.50 | 0.02750 | 0.275 |" in table
    assert "| never (seed 1) | no |  | null | null | null | not reached: best 0.7000 after epoch 3 of 3 |" in table
    assert "| old run (seed 1) | unknown |" in table and "train_windows_unix not logged" in table
    assert (tmp_path / "rep" / "plots" / "time_to_target.png").is_file()


@pytest.mark.slow
def test_csv_columns_and_bad_input(tmp_path):
    (tmp_path / "runs.csv").write_text(f"{HEADER},epoch_accuracy,epoch_time_s\n"
                                       "a,33,0.33,0.033,50,0.9,0.80;0.86;0.90,10;12;11\nb,20,0.2,0.02,50,0.7,,\n")
    rows = rows_from_csv(str(tmp_path / "runs.csv"))
    assert rows[0].epoch_accuracy == (0.80, 0.86, 0.90) and rows[0].epoch_time_s == (10, 12, 11)
    assert rows[1].epoch_accuracy == () and rows[1].extra["epoch_accuracy"] == "empty in the input"
    assert reach(rows[0], 0.88).time_s == pytest.approx(27.5)
    r = _cli(["--csv", "runs.csv", "--target-accuracy", "0.88", "--out", "rep"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "| a | yes | 3 | 27.50 | 0.02750 | 0.275 |" in (tmp_path / "rep" / "report.md").read_text()

    (tmp_path / "plain.csv").write_text(f"{HEADER}\na,33,0.33,0.033,50,0.9\n")
    (tmp_path / "bad.csv").write_text(f"{HEADER},epoch_accuracy,epoch_time_s\na,33,0.33,0.033,50,0.9,0.8;1.2,1;1\n")
    for args, expected in [
        (["--csv", "plain.csv", "--target-accuracy", "0.88"], "no epoch_accuracy column, which --target-accuracy needs"),
        (["--csv", "runs.csv", "--target-accuracy", "88"], "--target-accuracy: '88' must be in (0, 1] (test accuracy as a fraction, e.g. 0.88 for 88%)"),
        (["--csv", "bad.csv"], "line 2 column epoch_accuracy value 2: '1.2' must be in [0, 1]"),
    ]:
        r = _cli(args + ["--out", "rep2"], tmp_path)
        assert r.returncode == 2 and r.stderr.startswith("error: ") and expected in r.stderr, r.stderr
        assert r.stderr.strip().count("\n") == 0 and not (tmp_path / "rep2").exists()
