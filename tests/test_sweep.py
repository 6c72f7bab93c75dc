"""Multiruns through the real CLI into a temp MLflow store: names, statuses, cache, exit codes."""
from __future__ import annotations

import pytest
import yaml
from conftest import TINY
from mlflow.tracking import MlflowClient

from bertaccel.record.run_record import run_settings
from bertaccel.record.tracking import runs_by_status

# Every test here starts a real process (the CLI, a script, a server) or trains: slow (docs/contributing.md).
pytestmark = pytest.mark.slow

PARAMS = ["precision", "attention", "compile", "accumulation", "freezing", "optimizer", "hardware",
          "num_gpus", "model", "dataset", "precision.name", "attention.name", "optimizer.name",
          "optimizer.lr", "dataset.max_length", "train.seed", "train.batch_size"]
METRICS = ["train_time_s", "eval_time_s", "test_accuracy", "train_loss", "throughput_samples_s",
           "peak_memory_gib", "cost_usd", "optimizer_steps", "trainable_params"]
TAGS = ["status", "config_hash", "git_sha", "device_name", "hardware_profile", "peak_memory_gib_source",
        "cost_usd_source", "tokenize_cache"]


def test_2x2_multirun_logs_every_name(cli):
    proc = cli(["-m", "attention=eager,sdpa", "accumulation=1,2", *TINY, "train.epochs=2"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[sweep] run 4 of 4 finished" in proc.stdout
    assert "4 runs: finished=4 skipped=0 failed=0" in proc.stdout
    runs = runs_by_status(cli.store, "bertaccel")
    assert list(runs) == ["finished"] and len(runs["finished"]) == 4
    client = MlflowClient(cli.store)
    hashes = set()
    for run in runs["finished"]:
        d = run.data
        # (settings a choice only restates are tags config.<key>: run_settings reads both)
        assert not [p for p in PARAMS if p not in run_settings(run)], run.info.run_name
        assert not [m for m in METRICS if m not in d.metrics], run.info.run_name
        assert not [t for t in TAGS if t not in d.tags], run.info.run_name
        assert run.info.run_name == f"attention={d.params['attention']},accumulation={d.params['accumulation']}"
        assert 0.0 <= d.metrics["test_accuracy"] <= 1.0 and d.metrics["train_time_s"] > 0
        assert d.metrics["cost_usd"] > 0 and "USD/h" in d.tags["cost_usd_source"]
        # per-epoch series, step = epoch
        assert [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")] == [0, 1]
        assert len(client.get_metric_history(run.info.run_id, "trainable_params")) == 2
        # accumulation 2 halves the optimizer steps: 128 rows / 16 = 8 micro-batches per epoch
        assert d.metrics["optimizer_steps"] == 2 * 8 / int(d.params["accumulation"])
        artifact = client.download_artifacts(run.info.run_id, "config.yaml", str(cli.dir))
        assert yaml.safe_load(open(artifact))["attention"]["name"] == d.params["attention"]
        hashes.add(d.tags["config_hash"])
    assert len(hashes) == 4
    # tokenized once, reused by the three later runs of the sweep
    caches = sorted(r.data.tags["tokenize_cache"] for r in runs["finished"])
    assert caches == ["hit", "hit", "hit", "miss"]


def test_skipped_and_failed_runs_do_not_stop_the_sweep(cli):
    # fp16 cannot run on a CPU -> skipped; lr=1e30 blows the weights up -> NaN loss -> failed.
    proc = cli(["-m", "precision=fp32,fp16", "optimizer.lr=1e-4,1e30", *TINY, "train.log_every_steps=1"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "4 runs: finished=1 skipped=2 failed=1" in proc.stdout
    runs = runs_by_status(cli.store, "bertaccel")
    assert {k: len(v) for k, v in runs.items()} == {"finished": 1, "skipped": 2, "failed": 1}
    for run in runs["skipped"]:
        assert run.data.tags["reason"].startswith("precision=fp16 needs a CUDA GPU")
        assert "train_time_s" not in run.data.metrics  # nothing measured, nothing reported
    failed = runs["failed"][0]
    assert failed.data.tags["reason"].startswith("NonFiniteLoss: non-finite training loss")
    assert failed.info.status == "FAILED"


def test_sweep_with_no_finished_run_exits_nonzero(cli):
    proc = cli(["-m", "precision=fp16", *TINY, "sweep.baseline=false"])  # (no fp32 baseline added to finish)
    assert proc.returncode == 1
    assert "1 runs: finished=0 skipped=1 failed=0" in proc.stdout


def test_bad_value_in_a_sweep_is_recorded_and_the_rest_run(cli):
    proc = cli(["-m", "accumulation=0,1", *TINY])
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = runs_by_status(cli.store, "bertaccel")
    assert {k: len(v) for k, v in runs.items()} == {"finished": 1, "failed": 1}
    assert runs["failed"][0].data.tags["reason"] == "bad input: accumulation=0 must be an integer >= 1 or adaptive"


def test_single_run_prints_accuracy_time_and_run_id(cli):
    proc = cli(TINY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("test_accuracy=") and "train_time_s=" in last and "mlflow_run_id=" in last
    run_id = last.split("mlflow_run_id=")[1].split()[0]
    assert MlflowClient(cli.store).get_run(run_id).data.tags["status"] == "finished"


def test_single_bad_csv_is_one_line_and_nothing_written(cli):
    bad = cli.dir / "bad.csv"
    bad.write_text("body,label\nx,1\n")
    proc = cli(["dataset=csv", f"dataset.train_path={bad}", f"dataset.test_path={bad}", "model=tiny"])
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: {bad}: missing column(s) text; the header has body, label " \
                                  "(set dataset.text_columns / dataset.label_column)"
    assert not (cli.dir / "mlflow.db").exists()


def test_hub_model_and_dataset_offline_are_skipped_with_reason(cli):
    proc = cli(["-m", "model=tiny,bert_base_uncased", "dataset=ag_news_sample,ag_news", "train.device=cpu",
                "dataset.train_subset=64", "dataset.test_subset=32", "train.batch_size=16"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = runs_by_status(cli.store, "bertaccel")
    assert {k: len(v) for k, v in runs.items()} == {"finished": 1, "skipped": 3}
    reasons = sorted(r.data.tags["reason"] for r in runs["skipped"])
    # Skipped before any process started (bertaccel/runs/hub.py), each naming what it needs and the offline way.
    assert all(r.startswith("needs the Hugging Face hub for ") and "offline: " in r for r in reasons), reasons
    assert sum("dataset=ag_news (fancyzhx/ag_news)" in r for r in reasons) == 2
    assert sum("model=bert_base_uncased (bert-base-uncased)" in r for r in reasons) == 2
