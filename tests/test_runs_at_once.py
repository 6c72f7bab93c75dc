"""launcher.runs_at_once: a sweep runs G configurations side by side, each in processes of its
own and on GPUs of its own, all recorded in one store (hydra_plugins/bertaccel_launcher)."""
from __future__ import annotations

import os
import threading

import pytest

from bertaccel.config import ConfigError
from bertaccel.options.checks import validate
from bertaccel.record.tracking import search_runs
from hydra_plugins.bertaccel_launcher.bertaccel_launcher import GpuPool, visible_gpus

SMALL = ["model=tiny", "train.device=cpu", "dataset.train_subset=32", "dataset.test_subset=16", "train.batch_size=16"]


@pytest.mark.slow
def test_two_at_a_time_each_on_its_own_gpu_all_in_one_store(cli, monkeypatch):
    # Two "GPUs" by name: the launcher hands them out from CUDA_VISIBLE_DEVICES as it would on a
    # GPU host (the runs themselves use the CPU, so the names need not exist).
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "gpuA,gpuB")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # (conftest sets it for the xdist workers)
    proc = cli(["-m", "train.seed=1,2,3", "launcher.runs_at_once=2", *SMALL])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "3 runs: finished=3 skipped=0 failed=0" in proc.stdout, proc.stdout[-3000:]
    for k in (1, 2, 3):
        assert f"[sweep] run {k} of 3 finished" in proc.stdout
    runs = [r for r in search_runs(cli.store, "bertaccel") if r.data.tags.get("bertaccel.role") != "sweep"]
    assert sorted(r.info.run_name for r in runs) == ["train.seed=1", "train.seed=2", "train.seed=3"]  # none lost
    assert all(r.info.status == "FINISHED" and r.data.tags["status"] == "finished" for r in runs)
    assert {r.data.tags["cuda_visible_devices"] for r in runs} <= {"gpuA", "gpuB"}
    # Two CPU runs at once split the cores rather than each spinning a thread on every one.
    threads = max(1, len(os.sched_getaffinity(0)) // 2)
    assert {r.data.tags["device_name"].rsplit("(", 1)[1] for r in runs} == {f"{threads} threads)"}, runs[0].data.tags
    # Side by side: the first two runs overlap in time, and never on the same GPU.
    first, second = sorted(runs, key=lambda r: r.info.start_time)[:2]
    assert second.info.start_time < first.info.end_time
    assert first.data.tags["cuda_visible_devices"] != second.data.tags["cuda_visible_devices"]
    parent = next(r for r in search_runs(cli.store, "bertaccel") if r.data.tags.get("bertaccel.role") == "sweep")
    assert parent.data.tags["runs_finished"] == "3" and parent.data.tags["runs_failed"] == "0"


def test_a_run_waits_until_enough_gpus_are_free():
    pool = GpuPool(["0", "1"])
    first = pool.take(1)
    got = []
    waiter = threading.Thread(target=lambda: got.append(pool.take(2)))
    waiter.start()
    waiter.join(timeout=0.5)
    assert waiter.is_alive() and not got  # one GPU free, two needed: it waits
    pool.give_back(first)
    waiter.join(timeout=10)
    assert not waiter.is_alive() and sorted(got[0]) == ["0", "1"]


def test_visible_gpus_follow_the_users_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 3")
    assert visible_gpus() == ["2", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpus() == []  # the user hid every GPU


@pytest.mark.parametrize("overrides, message", [
    (["launcher.runs_at_once=0"], "launcher.runs_at_once=0 must be >= 1"),
    (["launcher.runs_at_once=2", "launcher.name=inline"], "use launcher=process"),
])
def test_runs_at_once_checks(compose_cfg, overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose_cfg(overrides))
