"""Sweeps as MLflow parent runs; resume by config_hash, also after SIGKILL; parallel writers."""
from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest

from conftest import TINY, kill_mid_run, sweep_children

from bertaccel.record.tracking import runs_by_status, search_runs
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

# Every test here starts a real process (the CLI, a script, a server) or trains: slow (docs/contributing.md).
pytestmark = pytest.mark.slow

# Runs long enough (48 steps) to be caught mid-way by the SIGKILL test.
SWEEP = ["-m", "train.seed=1,2,3", *TINY, "dataset.train_subset=384", "train.epochs=2"]
# The same three configurations cut to 2 steps each, for the test that never acts mid-run.
QUICK_SWEEP = ["-m", "train.seed=1,2,3", *TINY, "train.max_steps_per_epoch=2"]


def test_sweep_has_a_parent_run_and_a_rerun_skips_finished_configurations(cli):
    first = cli(QUICK_SWEEP)
    assert first.returncode == 0, first.stderr[-2000:]
    (parent,) = [r for r in search_runs(cli.store, "bertaccel") if r.data.tags.get("bertaccel.role") == "sweep"]
    assert parent.data.tags["status"] == "finished (3 of 3 runs finished)" and parent.data.tags["runs_finished"] == "3"
    kids = sweep_children(cli.store)
    assert len(kids) == 3
    assert {k.data.tags["mlflow.parentRunId"] for k in kids} == {parent.info.run_id}
    assert {k.data.tags["sweep_id"] for k in kids} == {parent.data.tags["sweep_id"]}

    again = cli(QUICK_SWEEP)
    assert again.returncode == 0
    assert "resumed: already finished=3" in again.stdout
    assert len(sweep_children(cli.store)) == 3  # nothing ran twice
    assert len([r for r in search_runs(cli.store, "bertaccel") if r.data.tags.get("bertaccel.role") == "sweep"]) == 1


def test_failed_configurations_are_retried_only_with_the_flag(cli):
    # 3 steps a run, not the epoch's 8: lr=1e30 makes the loss non-finite by the 2nd step.
    sweep = ["-m", "optimizer.lr=1e-4,1e30", *TINY, "train.log_every_steps=1", "train.max_steps_per_epoch=3"]
    assert cli(sweep).returncode == 0
    again = cli(sweep)
    assert "already finished=1, failed/skipped before and not retried=1" in again.stdout
    assert len(runs_by_status(cli.store, "bertaccel")["failed"]) == 1
    retry = cli([*sweep, "sweep.retry_failed=true"])
    assert retry.returncode == 0
    assert len(runs_by_status(cli.store, "bertaccel")["failed"]) == 2  # ran (and failed) again
    assert len(runs_by_status(cli.store, "bertaccel")["finished"]) == 1


def test_sigkill_mid_sweep_then_rerun_finishes_every_configuration_exactly_once(cli, tmp_path):
    cmd = [sys.executable, "-m", "bertaccel.run", *SWEEP, f"tracking.uri={cli.store}",
           f"cache_dir={tmp_path / 'cache'}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = warm_cli.popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          start_new_session=True)
    killed = kill_mid_run(proc, cli.store, timeout_s=300)  # one done, the next one mid-way
    assert killed, "the sweep ended before it could be killed mid-run"
    before = Counter(r.data.tags.get("status") for r in sweep_children(cli.store))
    assert before["running"] == 1 and before["finished"] >= 1

    rerun = warm_cli.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    kids = sweep_children(cli.store)
    finished = [k for k in kids if k.data.tags["status"] == "finished"]
    per_config = Counter(k.data.tags["config_hash"] for k in finished)
    assert len(per_config) == 3 and set(per_config.values()) == {1}  # each exactly once
    assert Counter(k.data.tags["status"] for k in kids)["interrupted"] == 1  # the killed run, labelled
    assert f"already finished={before['finished']}" in rerun.stdout


WRITER = """
import sys
from bertaccel.record.tracking import RunTracker
uri, name = sys.argv[1], sys.argv[2]
t = RunTracker(uri, "parallel", name, {f"p{i}": str(i) for i in range(150)}, {"status": "running"}, "x: 1")
for step in range(25):
    t.log_metrics({"m": step, "n": step * 2}, step=step)
    t.set_tags({f"tag{step}": "v"})
t.finish("finished")
"""


def test_parallel_writers_to_one_sqlite_store_lose_nothing(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, store, f"w{i}"], stderr=subprocess.PIPE, text=True)
             for i in range(4)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    runs = search_runs(store, "parallel")
    assert sorted(r.info.run_name for r in runs) == ["w0", "w1", "w2", "w3"]
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=store)
    for r in runs:
        assert len(r.data.params) == 150 and r.data.tags["status"] == "finished"
        assert all(f"tag{s}" in r.data.tags for s in range(25))
        assert [m.value for m in client.get_metric_history(r.info.run_id, "n")] == [2.0 * s for s in range(25)]
