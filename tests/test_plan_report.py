"""Predicted vs measured: the arithmetic of report/predicted.py on a synthetic store, and a real
sweep whose runs log their own predictions (plan/hook.py) that the plan CLI reproduces."""
from __future__ import annotations

import csv
import os
import sys

import pytest

from bertaccel.report.predicted import comparison, error_pct, median_abs
from bertaccel.report.scoring import Row
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

# Every test here starts a real process (the CLI, a script, a server) or trains: slow (docs/contributing.md).
pytestmark = pytest.mark.slow


def _store(tmp_path, runs):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("bertaccel", artifact_location=(tmp_path / "art").as_uri())
    for name, metrics, tags in runs:
        run = client.create_run(exp, run_name=name, tags={"status": "finished", **tags})
        client.log_param(run.info.run_id, "precision", "fp32")
        for k, v in metrics.items():
            client.log_metric(run.info.run_id, k, v)
        client.set_terminated(run.info.run_id)
    return uri


def test_errors_and_medians_on_a_synthetic_store(tmp_path):
    measured = {"train_time_s": 10.0, "step_time_ms": 50.0, "cost_usd": 0.01, "test_accuracy": 0.5}
    uri = _store(tmp_path, [
        ("a", {**measured, "predicted_train_time_s": 11.0, "predicted_step_time_ms": 45.0,
               "predicted_cost_usd": 0.011}, {"prediction_basis": "runs: x (1234abcd)"}),
        ("b", {**measured, "predicted_train_time_s": 7.0, "predicted_cost_usd": 0.007},
         {"prediction_basis": "runs: y (5678abcd)"}),
        ("c", {**measured, "predicted_train_time_s": 20.0}, {"prediction_basis": "profile 'a100': ..."}),
        ("d", measured, {"prediction_basis": "not predicted: no similar finished run"})])
    from bertaccel.report import rows_from_mlflow
    from bertaccel.record.tracking import search_runs

    rows = rows_from_mlflow(uri, "bertaccel")
    runs = {r.info.run_id: r for r in search_runs(uri, "bertaccel")}
    cells, s = comparison(rows, runs)
    by_name = {c[0]: c for c in cells}
    assert by_name["a"][1:4] == ["11", "10", "+10.0"] and by_name["a"][4:7] == ["45", "50", "-10.0"]
    assert by_name["b"][1:4] == ["7", "10", "-30.0"]
    assert by_name["a"][10:13] == ["null", "null", "null"]  # energy neither predicted nor measured
    # |errors| 10, 30 (from runs) and 100 (profile): medians 30 over all, 20 over those from runs.
    assert s["median_all"] == pytest.approx(30.0) and s["median_from_runs"] == pytest.approx(20.0)
    assert s["unpredicted"] == {"d": "not predicted: no similar finished run"}
    assert error_pct(None, 1.0) is None and error_pct(1.0, 0.0) is None and median_abs([None]) is None
    assert median_abs([-5.0, 1.0, None]) == pytest.approx(3.0)
    # The report's CLI: the table, the medians and the plot.
    r = warm_cli.run([sys.executable, "-m", "bertaccel.report", "--uri", uri, "--out", "rep"], cwd=tmp_path,
                     capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "## Appendix: predicted vs measured (bertaccel.plan)" in md  # (the report's last section)
    assert "30.0 % over 3 runs, 20.0 % over the 2 predicted from similar runs or a probe; goal <= 15 %: not met" in md
    assert "1 run(s) without a prediction: not predicted: no similar finished run" in md
    assert (tmp_path / "rep" / "plots" / "predicted_vs_measured.png").is_file()
    assert Row("x").run_id == ""  # rows without a run id (CSV) are simply not compared


def test_runs_log_their_prediction_and_the_plan_counts_their_work(cli, tmp_path):
    """Two runs of a sweep: the first has no similar run before it (CPU profile: no peak), the
    second is predicted from the first. The plan, run afterwards on the same command line, counts
    exactly the padded tokens and FLOPs the runs measured."""
    from bertaccel.record.tracking import search_runs

    grid = ["-m", "model=tiny", "train.device=cpu", "dataset.train_subset=96", "dataset.test_subset=32",
            "train.batch_size=16", "train.epochs=2", "freezing=layerwise", "optimizer=adamw,adamw_fused",
            "launcher.name=inline", "sweep.baseline=false"]  # (two runs: no defaults run added)
    r = cli(grid)
    assert r.returncode == 0, r.stderr[-3000:]
    runs = sorted((x for x in search_runs(cli.store, "bertaccel") if x.data.tags.get("bertaccel.role") != "sweep"),
                  key=lambda x: x.info.start_time)
    first, second = runs
    assert first.data.tags["prediction_basis"].startswith("not predicted: no similar finished run")
    assert not any(k.startswith("predicted_") for k in first.data.metrics)
    basis = second.data.tags["prediction_basis"]
    assert basis.startswith(f"runs: {first.info.run_name} ({first.info.run_id[:8]}); let go: optimizer"), basis
    m1, m2 = first.data.metrics, second.data.metrics
    # Same data, same shape: the second's predicted time is its FLOPs at the first's measured rate.
    assert m2["predicted_train_time_s"] == pytest.approx(m2["model_flops"] / (m1["model_flops"] / m1["train_time_s"]))
    assert m2["predicted_cost_usd"] == pytest.approx(m2["predicted_train_time_s"] / 3600 * 0.0893)
    assert "predicted_energy_kwh" not in m2  # no RAPL energy measured here, no TDP in the cpu profile: null
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    p = warm_cli.run([sys.executable, "-m", "bertaccel.plan", *grid[1:], f"tracking.uri={cli.store}",
                      f"cache_dir={tmp_path / 'cache'}", "--out", "plan"], cwd=tmp_path, capture_output=True,
                     text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    planned = {row["name"]: row for row in csv.DictReader(open(tmp_path / "plan" / "plan.csv"))}
    for run in runs:
        row = planned[run.info.run_name]
        assert float(row["padded_tokens"]) == run.data.metrics["padded_tokens"]
        assert float(row["model_flops"]) == pytest.approx(run.data.metrics["model_flops"], rel=1e-12)
        assert row["basis"].startswith("runs: ")  # both finished now: each is the other's similar run
