"""benchmarks/grid_floor.py: the thesis grid's floors from a real MLflow store, against a hand computation."""
from __future__ import annotations

import gzip
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# Starts the script's process over a real SQLite MLflow store: slow (docs/contributing.md).
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "grid_floor.py"


def _store(tmp_path: Path) -> Path:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("bertaccel")
    runs = [  # precision, batch, train_time_s, gpu_util_pct, sm_active_pct, eval_time_s, startup_overhead_s
        ("fp32", "8", 200.0, 30.0, 20.0, 10.0, 5.0),
        ("fp32", "8", 100.0, 40.0, None, 12.0, 6.0),   # no SM reading: not counted, and said so
        ("fp16", "32", 60.0, 25.0, 10.0, 4.0, 3.0),
    ]
    for precision, batch, *values in runs:
        r = client.create_run(exp)
        for k, v in {"encoder": "hf", "optimizer": "adamw", "precision": precision, "train.batch_size": batch}.items():
            client.log_param(r.info.run_id, k, v)
        for k, v in zip(("train_time_s", "gpu_util_pct", "sm_active_pct", "eval_time_s", "startup_overhead_s"),
                        values):
            if v is not None:
                client.log_metric(r.info.run_id, k, v)
        client.set_terminated(r.info.run_id)
    # Not of the grid (batch 64 is not swept) and not finished: both left out.
    other = client.create_run(exp)
    client.log_param(other.info.run_id, "precision", "fp32")
    client.log_param(other.info.run_id, "train.batch_size", "64")
    client.log_metric(other.info.run_id, "train_time_s", 999.0)
    client.set_terminated(other.info.run_id)
    killed = client.create_run(exp)
    for k, v in {"encoder": "hf", "optimizer": "adamw", "precision": "fp32", "train.batch_size": "8"}.items():
        client.log_param(killed.info.run_id, k, v)
    client.log_metric(killed.info.run_id, "train_time_s", 999.0)
    client.set_terminated(killed.info.run_id, status="KILLED")
    gz = tmp_path / "grid.db.gz"
    with open(tmp_path / "mlflow.db", "rb") as src, gzip.open(gz, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return gz


def test_the_floors_are_the_runs_busy_seconds_summed(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), str(_store(tmp_path)), "--goal-min", "1"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:2]): [c.strip() for c in line.strip("|").split("|")[2:]]
            for line in out.stdout.splitlines() if line.startswith("| fp") or line.startswith("| all")}
    # fp32 / 8: training 300, kernels 200*0.30 + 100*0.40 = 100, SMs 200*0.20 = 40 (one missing),
    # evaluation 22, start-up 11
    assert rows[("fp32", "8")] == ["2", "300", "100", "40 (1 missing)", "22", "11"]
    assert rows[("fp16", "32")] == ["1", "60", "15", "6", "4", "3"]
    assert rows[("all", "")] == ["3", "360", "115", "46", "26", "14"]
    assert "3 finished runs of the thesis grid" in out.stdout
    assert "1 readings missing (not counted)" in out.stdout
    # (360 + 26 + 14) s = 6.7 min one at a time; floors 115 s = 1.9 min, 46 s = 0.8 min against a 1-minute goal
    assert "one run at a time: 6.7 min" in out.stdout
    assert "time-sliced: kernels busy, training only): 1.9 min, 1.92x the 1-minute goal" in out.stdout
    assert "every SM kept busy (training only): 0.8 min, 0.77x the goal" in out.stdout


def test_a_store_that_is_not_there_is_one_line(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "nothing.db.gz")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0
    assert "no such store" in out.stderr
