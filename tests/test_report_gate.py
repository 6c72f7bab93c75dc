"""The comparability gate (runs on different devices, datasets, row counts or energy meters are
ranked with a warning naming what differs) and --occupancy-metric (what plays O, said in the
report), from CSVs and a real MLflow store."""
from __future__ import annotations

import sys

import pytest
from report_store import Store

from bertaccel.report import STRATEGIES, Row, rows_from_mlflow, score_rows
from bertaccel.report.gate import differences, warning
from bertaccel.report.occupancy import with_occupancy_metric
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

HEADER = "name,time_s,cost_usd,energy_kwh,occupancy_pct,accuracy"


def _cli(args, cwd):
    return warm_cli.run([sys.executable, "-m", "bertaccel.report", *args], cwd=cwd, capture_output=True, text=True)


def test_differences_name_what_and_how_many():
    rows = [Row("a", 1, energy_kwh=0.1, device="cpu", dataset="ag_news", train_rows=512, energy_source="RAPL"),
            Row("b", 1, energy_kwh=0.1, device="cpu", dataset="ag_news", train_rows=512, energy_source="RAPL"),
            Row("c", 1, energy_kwh=0.1, device="H200", dataset="ag_news", train_rows=4000, energy_source="NVML"),
            Row("d", 1, device="H200", dataset="ag_news", train_rows=512)]  # no energy: its source is not ranked
    assert differences(rows) == ["device: cpu (2 runs), H200 (2 runs)",
                                 "train rows per epoch: 512 (3 runs), 4000 (1 run)",
                                 "energy source: RAPL (2 runs), NVML (1 run)"]
    assert warning(rows[:2]) == ""
    # A CSV without a device column: its hardware column stands for the device.
    assert differences([Row("x", 1, hardware="t4"), Row("y", 1, hardware="a100")]) == \
        ["device: t4 (1 run), a100 (1 run)"]


@pytest.mark.slow
def test_cli_warns_in_every_ranking_table_when_runs_differ(tmp_path):
    (tmp_path / "runs.csv").write_text(f"{HEADER},device,dataset\n"
                                       "a,10,0.1,,,0.9,cpu,imdb\nb,12,0.12,,,0.9,cpu,ag_news\n")
    r = _cli(["--csv", "runs.csv", "--out", "rep"], tmp_path)
    assert r.returncode == 0, r.stderr
    line = "WARNING, not like for like: the runs ranked here differ in dataset: imdb (1 run), ag_news (1 run)"
    assert f"note: {line}" in r.stdout
    md = (tmp_path / "rep" / "report.md").read_text()
    for title in ("The answer", "Scores (thesis Table 5.4 form)", "Best configuration per strategy",
                  "Pareto front over time, cost, energy and accuracy (runs)", "Weight sensitivity"):
        section = md.split(f"## {title}")[1].split("\n## ")[0]
        assert line in section, title
    (tmp_path / "same.csv").write_text(f"{HEADER},device,dataset\na,10,0.1,,,0.9,cpu,imdb\nb,12,0.12,,,0.9,cpu,imdb\n")
    r = _cli(["--csv", "same.csv", "--out", "rep2"], tmp_path)
    assert r.returncode == 0 and "not like for like" not in (tmp_path / "rep2" / "report.md").read_text()


def test_mlflow_rows_carry_device_dataset_rows_and_energy_meter(tmp_path):
    store = Store(tmp_path)
    common = {"dataset.name": "ag_news_sample", "dataset.test_subset": "256", "train.seed": "1"}
    store.log("cpu run", common, {"train_time_s": 10.0, "energy_kwh": 0.001, "dataset_train_rows": 512},
              {"device_name": "cpu: AMD EPYC (2 threads)", "energy_kwh_source": "RAPL package energy_uj deltas ..."})
    store.log("gpu run", {**common, "dataset.test_subset": "null"},
              {"train_time_s": 5.0, "energy_kwh": 0.002, "dataset_train_rows": 512},
              {"device_name": "NVIDIA H200", "energy_kwh_source": "NVML nvmlDeviceGetTotalEnergyConsumption delta"})
    rows = {r.name: r for r in rows_from_mlflow(store.uri, "bertaccel")}
    cpu, gpu = rows["cpu run"], rows["gpu run"]
    assert (cpu.device, cpu.dataset, cpu.train_rows, cpu.test_rows, cpu.energy_source) == (
        "cpu: AMD EPYC (2 threads)", "ag_news_sample", 512, 256, "RAPL (CPU package)")
    assert gpu.test_rows is None and gpu.extra["test_rows"] == "dataset.test_subset = null: the full test split"
    assert differences([cpu, gpu]) == ["device: cpu: AMD EPYC (2 threads) (1 run), NVIDIA H200 (1 run)",
                                       "test rows: 256 (1 run), not given (1 run)",
                                       "energy source: RAPL (CPU package) (1 run), NVML (GPU board) (1 run)"]


@pytest.mark.slow
def test_occupancy_metric_picks_what_plays_o_from_mlflow(tmp_path):
    store = Store(tmp_path)
    # Hopper-like: low occupancy, high SM activity for the tensor-core-bound run.
    store.log("gemm bound", {}, {"train_time_s": 10.0, "cost_usd": 0.1, "energy_kwh": 0.01, "occupancy_pct": 13.0,
                                 "sm_active_pct": 91.0, "tensor_active_pct": 60.0, "test_accuracy": 0.9})
    store.log("many warps", {}, {"train_time_s": 10.0, "cost_usd": 0.1, "energy_kwh": 0.01, "occupancy_pct": 40.0,
                                 "sm_active_pct": 50.0, "test_accuracy": 0.9},
              {"tensor_active_pct_source": "null: GPM returned no valid sample"})
    rows = rows_from_mlflow(store.uri, "bertaccel")
    names = [r.name for r in rows]
    gemm, warps = names.index("gemm bound"), names.index("many warps")
    by_occ = score_rows(with_occupancy_metric(rows, "occupancy"), STRATEGIES)
    by_sm = score_rows(with_occupancy_metric(rows, "sm_active"), STRATEGIES)
    assert by_occ.best["balance"] == warps and by_sm.best["balance"] == gemm  # the choice of O flips the winner
    assert by_sm.scores["balance"][gemm] == pytest.approx(0.3 + 0.3 + 0.3 - 0.1 * 1.0)
    tensor = with_occupancy_metric(rows, "tensor_active")
    assert tensor[warps].occupancy_pct is None
    assert tensor[warps].extra["occupancy_pct"] == "tensor_active_pct null: GPM returned no valid sample"
    assert rows[warps].occupancy_pct == 40.0  # the rows as loaded are unchanged
    r = _cli(["--uri", store.uri, "--occupancy-metric", "sm_active", "--out", "rep"], tmp_path)
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "--occupancy-metric sm_active: O of the score is sm_active_pct" in md
    assert "| # | run | hardware | precision | time_s | cost_usd | energy_kwh | sm_active_pct | accuracy |" in md


@pytest.mark.slow
def test_occupancy_metric_on_a_csv_needs_its_column(tmp_path):
    (tmp_path / "runs.csv").write_text(f"{HEADER}\na,10,0.1,0.01,13,0.9\n")
    r = _cli(["--csv", "runs.csv", "--occupancy-metric", "tensor_active", "--out", "rep"], tmp_path)
    assert r.returncode == 2 and not (tmp_path / "rep").exists()
    assert r.stderr.strip() == ("error: --csv runs.csv: no tensor_active_pct column, which --occupancy-metric "
                                "tensor_active needs")
