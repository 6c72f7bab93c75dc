"""The effect of each axis (issue 44, item 5): right after the answer, for each swept value its
speed-up (geometric mean over the pairs that differ in that axis only), energy and accuracy change
against the axis's reference, with the spread. Real MLflow stores, written as job.py writes runs,
read through the report's own command; the expected numbers worked by hand."""
from __future__ import annotations

import sys

import pytest
from report_store import Store

from bertaccel.report import rows_from_mlflow
from bertaccel.report.baseline import default_choices
from bertaccel.report.effects import effects_tables
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

DEFAULTS = default_choices()  # precision=fp32 among them; train.batch_size's default is 32 (conf/config.yaml)


def _log(store, precision, batch, time_s, energy, accuracy, seed=None):
    """A finished run of a precision x train.batch_size sweep, named and logged as a sweep's run is."""
    name = f"precision={precision},train.batch_size={batch}" + (f",train.seed={seed}" if seed else "")
    params = {**DEFAULTS, "precision": precision, "train.batch_size": str(batch), "accumulation": "1",
              "num_gpus": "1", **({"train.seed": str(seed)} if seed else {})}
    metrics = {"train_time_s": time_s, "cost_usd": time_s / 100, "test_accuracy": accuracy}
    if energy is not None:
        metrics["energy_kwh"] = energy
    store.log(name, params, metrics, {"config_key_noseed": f"{precision}-{batch}"})


def _cells(md: str, title: str) -> dict:
    """{(axis, value vs reference): the row's other cells} of the report.md table titled title."""
    section = next(s for s in md.split("\n## ") if s.startswith(title))
    lines = [x for x in section.splitlines() if x.startswith("| ")][1:]
    rows = [[c.strip() for c in x.strip("|").split("|")] for x in lines]
    return {(r[0], r[1]): r[2:] for r in rows}


@pytest.fixture(scope="module")
def grid_report(tmp_path_factory):
    """A 2x2 grid (precision fp32/fp16 x train.batch_size 8/32), the fp16 x 8 configuration twice
    (seeds 1 and 2), reported once through the command."""
    tmp = tmp_path_factory.mktemp("grid")
    store = Store(tmp)
    # (precision, batch): time_s, energy_kwh, accuracy
    _log(store, "fp32", 32, 10.0, 0.010, 0.90)
    _log(store, "fp16", 32, 5.0, 0.004, 0.89)
    _log(store, "fp32", 8, 30.0, 0.030, 0.92)
    _log(store, "fp16", 8, 18.0, 0.014, 0.900, seed=1)  # repeats: means 20.0 s, 0.015 kWh, 0.905
    _log(store, "fp16", 8, 22.0, 0.016, 0.910, seed=2)
    r = warm_cli.run([sys.executable, "-m", "bertaccel.report", "--uri", store.uri, "--out", "rep"], cwd=tmp,
                     capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return (tmp / "rep" / "report.md").read_text(), (tmp / "rep" / "report.html").read_text()


@pytest.mark.slow
def test_effects_table_arithmetic_against_a_hand_computation(grid_report):
    md, _ = grid_report
    cells = _cells(md, "The effect of each axis")
    assert set(cells) == {("precision", "fp16 vs fp32"), ("train.batch_size", "8 vs 32")}
    # precision fp16 vs fp32 (the default), batch held equal: at 32, 10 / 5 = 2.0; at 8, 30 / 20 (the
    # mean of 18 and 22) = 1.5; geometric mean sqrt(2.0 x 1.5) = 1.732. Energy 0.004 / 0.010 = 0.4 and
    # 0.015 / 0.030 = 0.5: sqrt(0.2) - 1 = -55.3 %. Accuracy 0.89 - 0.90 = -1.00 and 0.905 - 0.92 =
    # -1.50 points: mean -1.25.
    assert cells[("precision", "fp16 vs fp32")] == ["1.73x", "1.50x to 2.00x", "-55.3 % (-60.0 to -50.0 %)",
                                                    "-1.25 (-1.50 to -1.00)", "2"]
    # train.batch_size 8 vs 32 (the default): 10 / 30 = 0.333 and 5 / 20 = 0.25: sqrt(0.0833) = 0.289.
    # Energy 3.0 and 3.75: sqrt(11.25) - 1 = +235.4 %. Accuracy +2.00 and +1.50: +1.75.
    assert cells[("train.batch_size", "8 vs 32")] == ["0.29x", "0.25x to 0.33x", "+235.4 % (+200.0 to +275.0 %)",
                                                      "+1.75 (+1.50 to +2.00)", "2"]
    note = next(s for s in md.split("\n## ") if s.startswith("The effect of each axis")).splitlines()[2]
    assert "References: precision: fp32 (the default); train.batch_size: 32 (the default)" in note


@pytest.mark.slow
def test_the_effects_table_comes_right_after_the_answer(grid_report):
    md, page = grid_report
    titles = [s.splitlines()[0] for s in md.split("\n## ")[1:]]
    assert titles[0] == "The answer: which configuration to adopt"
    # (The notes on the runs belong to the answer and follow it; then the effects, before all else.)
    rest = [t for t in titles[1:] if t != "Notes on these runs"]
    assert rest[0] == "The effect of each axis (each value against the axis's reference, the other axes held equal)"
    assert page.index("<h2>The effect of each axis") > page.index("<h2>The answer")
    assert page.index("<h2>The effect of each axis") < page.index("<h2>Pareto front over")


def test_a_value_without_a_pair_says_so_and_no_number(tmp_path):
    store = Store(tmp_path)
    _log(store, "fp32", 32, 10.0, None, 0.90)
    _log(store, "fp16", 32, 5.0, None, 0.89)
    _log(store, "fp16", 8, 20.0, None, 0.905)
    _log(store, "bf16", 8, 16.0, None, 0.90)  # no fp32 run at batch 8: nothing to hold it against
    rows = rows_from_mlflow(store.uri, "bertaccel")
    (title, note, headers, cells), = effects_tables(rows)
    by = {(c[0], c[1]): c[2:] for c in cells}
    assert by[("precision", "bf16 vs fp32")] == [
        "no pair: no precision=fp32 run has the other axes' values of a precision=bf16 run (train.batch_size=8)",
        "", "", "", "none"]
    # The pairs there are: fp16 vs fp32 at 32 (2.0x, -1 pt); 8 vs 32 at fp16 (5 / 20 = 0.25x, +1.5 pts).
    # No run measured energy: null with the reason, never 0.
    assert by[("precision", "fp16 vs fp32")] == ["2.00x", "one pair", "null (energy_kwh null: not logged)",
                                                 "-1.00", "1"]
    assert by[("train.batch_size", "8 vs 32")] == ["0.25x", "one pair", "null (energy_kwh null: not logged)",
                                                   "+1.50", "1"]


def test_a_key_that_varies_only_with_another_is_named_beside_it_not_an_axis(tmp_path):
    store = Store(tmp_path)
    _log(store, "fp32", 32, 10.0, None, 0.90)
    _log(store, "fp16", 8, 4.0, None, 0.90)  # batch changed with precision: one axis, said as such
    (title, note, headers, cells), = effects_tables(rows_from_mlflow(store.uri, "bertaccel"))
    assert [c[:3] for c in cells] == [["precision (with train.batch_size, which varies with it)", "fp16 vs fp32",
                                       "2.50x"]]


@pytest.mark.slow  # several seconds on one core: the full suite runs it, the inner loop does not
def test_runs_equal_in_every_axis_but_of_two_configurations_are_averaged_with_a_warning(tmp_path):
    store = Store(tmp_path)
    _log(store, "fp32", 32, 10.0, None, 0.90)
    _log(store, "fp16", 32, 5.0, None, 0.89)
    # Another fp16 run whose configuration differs in something no axis shows (another identity).
    store.log("precision=fp16,train.batch_size=32", {**DEFAULTS, "precision": "fp16", "train.batch_size": "32",
                                                      "accumulation": "1", "num_gpus": "1"},
              {"train_time_s": 15.0, "cost_usd": 0.15, "test_accuracy": 0.89}, {"config_key_noseed": "other"})
    (title, note, headers, cells), = effects_tables(rows_from_mlflow(store.uri, "bertaccel"))
    assert [c[:3] for c in cells] == [["precision", "fp16 vs fp32", "1.00x"]]  # 10 / mean(5, 15)
    assert ("WARNING: 1 configuration(s) here are runs equal in every axis that differ in something else (their "
            "choices and names do not show it), averaged together: precision=fp16,train.batch_size=32 [") in note


@pytest.mark.slow  # several seconds on one core: the full suite runs it, the inner loop does not
def test_a_default_that_pairs_with_nothing_gives_way_to_the_first_value(tmp_path):
    """The design card's sweep (precision fp16,bf16 x attention xformers,triton) with the defaults run
    beside it (fp32, eager): fp32 differs from every other run in two axes, so it cannot be the
    reference; fp16 (the first value) is, and the note says why."""
    store = Store(tmp_path)
    for (precision, attention), t in {("fp16", "xformers"): 4.0, ("fp16", "triton"): 3.0,
                                      ("bf16", "xformers"): 5.0, ("bf16", "triton"): 6.0}.items():
        store.log(f"precision={precision},attention={attention}",
                  {**DEFAULTS, "precision": precision, "attention": attention, "train.batch_size": "32"},
                  {"train_time_s": t, "test_accuracy": 0.9})
    store.log("defaults", {**DEFAULTS, "train.batch_size": "32"}, {"train_time_s": 8.0, "test_accuracy": 0.9})
    rows = rows_from_mlflow(store.uri, "bertaccel")
    (title, note, headers, cells), = effects_tables(rows, [r.name for r in rows].index("defaults"))
    by = {(c[0], c[1]): c[2:4] for c in cells}
    # bf16 vs fp16: 4 / 5 = 0.8 and 3 / 6 = 0.5: sqrt(0.4) = 0.632.
    assert by[("precision", "bf16 vs fp16")] == ["0.63x", "0.50x to 0.80x"]
    assert by[("precision", "fp32 vs fp16")][0].startswith("no pair: no precision=fp16 run has the other axes' "
                                                           "values of a precision=fp32 run (attention=eager)")
    assert ("precision: fp16 (fp32 (the default) pairs with no other value; the first value)") in note
    # attention: the default (eager) pairs with nothing either; xformers came first: triton vs xformers is
    # 4 / 3 and 5 / 6: sqrt(1.111) = 1.054.
    assert by[("attention", "triton vs xformers")] == ["1.05x", "0.83x to 1.33x"]


def test_a_csv_of_hardware_and_precision_compares_time_per_sample_where_the_work_differs(tmp_path):
    from bertaccel.report.data import rows_from_csv

    (tmp_path / "runs.csv").write_text(
        "name,time_s,cost_usd,energy_kwh,occupancy_pct,accuracy,hardware,precision,train_samples\n"
        "t4 fp32,100,1,0.2,50,0.90,t4,fp32,1000\nt4 fp16,50,0.5,0.1,50,0.89,t4,fp16,1000\n"
        "a100 fp32,20,1,0.05,50,0.90,a100,fp32,2000\na100 fp16,8,0.5,0.02,50,0.90,a100,fp16,2000\n")
    rows = rows_from_csv(str(tmp_path / "runs.csv"))
    (title, note, headers, cells), = effects_tables(rows, 0)
    by = {(c[0], c[1]): c[2:] for c in cells}
    # a100 vs t4 (the default, auto, is not among them; the baseline t4 fp32 has t4), per sample: fp32
    # (100 / 1000) / (20 / 2000) = 10, fp16 (50 / 1000) / (8 / 2000) = 12.5; sqrt(125) = 11.18. Energy
    # per sample 0.05 / 2000 over 0.2 / 1000 = 0.125 and 0.02 / 2000 over 0.1 / 1000 = 0.1.
    assert by[("hardware", "a100 vs t4")] == ["11.18x", "10.00x to 12.50x", "-88.8 % (-90.0 to -87.5 %)",
                                              "+0.50 (+0.00 to +1.00)", "2"]
    assert note.startswith("the runs trained different numbers of samples, so time and energy are per sample")
    assert "hardware: t4 (the default auto is not among the runs; the answer's baseline 't4 fp32' has it)" in note
