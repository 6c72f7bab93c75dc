"""The process launcher (launch.py) through the real CLI: a run whose process aborts, runs out of
memory or loses a rank is recorded failed with what happened, and the sweep goes on.

Faults that need a real process to die (SIGABRT, SIGKILL of one rank) are injected from outside
bertaccel by tests/launcher_poison/sitecustomize.py, which Python runs at start-up in every
launcher worker when the test puts that directory on PYTHONPATH (see its docstring); the
20-run sweep uses real configurations only (tests/launcher_poison/conf/preset/).

Every run here is a fresh worker process (~10 s of Python and library start-up each on a
2-core machine), so the sweeps are as small as what they check allows.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Dict, List

import pytest

from bertaccel.record.tracking import search_runs

# Every test here starts a real process (the CLI, a script, a server) or trains: slow (docs/contributing.md).
pytestmark = pytest.mark.slow

POISON_DIR = Path(__file__).resolve().parent / "launcher_poison"
# A tiny BERT on 32 train / 16 test rows of the bundled AG News sample: 2 optimizer steps a run.
SMALL = ["model=tiny", "train.device=cpu", "dataset.train_subset=32", "dataset.test_subset=16",
         "train.batch_size=16"]


@pytest.fixture
def poisoned_cli(cli, monkeypatch):
    """cli (conftest) with the poison on: sitecustomize first on PYTHONPATH and the faults to
    inject in BERTACCEL_TEST_POISON (the subprocess copies os.environ when it starts)."""
    def _run(args: List[str], poison: str, timeout: int = 600):
        path = [str(POISON_DIR)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path))
        monkeypatch.setenv("BERTACCEL_TEST_POISON", poison)
        return cli(args, timeout)

    _run.store = cli.store
    return _run


def config_runs(store: str) -> Dict[str, object]:
    """The configuration runs (not the sweep parent runs) by run name; one run per name."""
    runs = [r for r in search_runs(store, "bertaccel") if r.data.tags.get("bertaccel.role") != "sweep"]
    by_name = {r.info.run_name: r for r in runs}
    assert len(by_name) == len(runs), sorted(r.info.run_name for r in runs)  # no duplicate run
    return by_name


def test_aborted_and_out_of_memory_runs_are_recorded_and_the_sweep_goes_on(poisoned_cli):
    # seed 2: the worker calls os.abort() as training starts (a crash in native code looks the
    # same: the process dies from SIGABRT); seed 3: MemoryError inside the run.
    proc = poisoned_cli(["-m", "train.seed=1,2,3", *SMALL], poison="abort:seed=2,memory:seed=3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "3 runs: finished=1 skipped=0 failed=2" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = config_runs(poisoned_cli.store)
    assert sorted(runs) == ["train.seed=1", "train.seed=2", "train.seed=3"]

    ok = runs["train.seed=1"]
    assert ok.data.tags["status"] == "finished" and ok.info.status == "FINISHED"
    assert 0.0 <= ok.data.metrics["test_accuracy"] <= 1.0

    aborted = runs["train.seed=2"]
    assert aborted.data.tags["status"] == "failed" and aborted.info.status == "FAILED"
    m = re.fullmatch(r"the run's process died from signal SIGABRT \(pid (\d+)\)", aborted.data.tags["reason"])
    assert m, aborted.data.tags["reason"]
    # The record is the one the dead worker opened (found by its launch_id tag), not a new one.
    assert aborted.data.tags["pid"] == m.group(1)
    assert aborted.data.tags["launch_id"] and "train_time_s" not in aborted.data.metrics

    oom = runs["train.seed=3"]
    assert oom.data.tags["status"] == "failed" and oom.info.status == "FAILED"
    assert oom.data.tags["reason"] == "MemoryError: poisoned run (tests/launcher_poison)"
    # what the sweep's summary table says too
    assert re.search(r"train\.seed=2\s+failed .* the run's process died from signal SIGABRT", proc.stdout)
    assert re.search(r"train\.seed=3\s+failed .* MemoryError: poisoned run", proc.stdout)
    assert len({r.data.tags["launch_id"] for r in runs.values()}) == 3


def test_a_killed_rank_fails_its_run_and_the_next_run_finishes(poisoned_cli):
    # Data parallel on the CPU: 2 gloo processes per run. In the seed-1 run, rank 1 sends itself
    # SIGKILL at its 3rd accumulation window (128 rows / 16 = 8 batches, 4 per rank: mid-epoch);
    # rank 0 is left waiting in an all-reduce, which the launcher must end, not the 60 s
    # collective timeout (nor the subprocess timeout, which only bounds the test).
    proc = poisoned_cli(["-m", "train.seed=1,2", "num_gpus=2", "launcher.collective_timeout_s=60",
                         "model=tiny", "train.device=cpu", "dataset.train_subset=128", "dataset.test_subset=32",
                         "train.batch_size=16", "sweep.baseline=false"],  # (no num_gpus=1 baseline runs)
                        poison="kill:seed=1:rank=1:window=3", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 runs: finished=1 skipped=0 failed=1" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = config_runs(poisoned_cli.store)
    # exactly one MLflow run per configuration, none left "running"
    assert sorted(runs) == ["train.seed=1", "train.seed=2"]
    assert all(r.info.status != "RUNNING" and r.data.tags["status"] != "running" for r in runs.values())

    killed = runs["train.seed=1"]
    assert killed.data.tags["status"] == "failed" and killed.info.status == "FAILED"
    # (rank 0 may have recorded its own symptom first: the launcher keeps it after the cause)
    assert re.fullmatch(r"rank 1 of 2 died from signal SIGKILL \(pid \d+\)( \(rank 0 reported: .*\))?",
                        killed.data.tags["reason"], re.S), \
        killed.data.tags["reason"]
    assert killed.data.tags["world_size"] == "2" and "train_time_s" not in killed.data.metrics

    nxt = runs["train.seed=2"]
    assert nxt.data.tags["status"] == "finished" and nxt.info.status == "FINISHED"
    assert nxt.data.tags["world_size"] == "2" and nxt.data.tags["backend"] == "gloo"
    assert 0.0 <= nxt.data.metrics["test_accuracy"] <= 1.0
    # both ranks trained: 128 rows / 16 = 8 optimizer steps' worth of samples over the job
    assert nxt.data.metrics["throughput_samples_s"] * nxt.data.metrics["train_time_s"] == pytest.approx(128)


def test_twenty_run_sweep_with_three_poisoned_configurations_loses_nothing(cli):
    """20 runs, 3 of them configurations that cannot work, no fault injection: 17 finished,
    2 failed and 1 skipped, each with its reason, nothing lost and nothing left running.

    A Hydra multirun is a cartesian product, so the 20 runs are two sweeps into one store:
    16 good runs (train.seed=1..16), then one sweep over `preset` with the three poisons as
    presets (tests/launcher_poison/conf/preset/, added by hydra.searchpath) beside preset=none,
    the 17th good run. Each sweep has a finished run, so each exits 0."""
    good = cli(["-m", "train.seed=range(1,17)", *SMALL])
    assert good.returncode == 0, good.stderr[-3000:]
    assert "[sweep] run 16 of 16 finished" in good.stdout
    assert "16 runs: finished=16 skipped=0 failed=0" in good.stdout, good.stdout[-3000:]

    poisoned = cli(["-m", "preset=none,poison_nan_loss,poison_huge_model,poison_fp16_on_cpu", "train.seed=17",
                    f"hydra.searchpath=['file://{POISON_DIR / 'conf'}']", *SMALL])
    assert poisoned.returncode == 0, poisoned.stderr[-3000:]
    assert "4 runs: finished=1 skipped=1 failed=2" in poisoned.stdout, poisoned.stdout[-3000:]

    runs = config_runs(cli.store)
    assert len(runs) == 20
    statuses = sorted(r.data.tags["status"] for r in runs.values())
    assert statuses == ["failed"] * 2 + ["finished"] * 17 + ["skipped"]
    finished = [r for r in runs.values() if r.data.tags["status"] == "finished"]
    assert sorted(int(r.data.params["train.seed"]) for r in finished) == list(range(1, 18))
    assert all(r.info.status == "FINISHED" and "test_accuracy" in r.data.metrics for r in finished)

    nan = runs["preset=poison_nan_loss"]
    assert nan.info.status == "FAILED" and nan.data.tags["status"] == "failed"
    assert nan.data.tags["reason"].startswith("NonFiniteLoss: non-finite training loss (nan)"), nan.data.tags["reason"]
    huge = runs["preset=poison_huge_model"]
    assert huge.info.status == "FAILED" and huge.data.tags["status"] == "failed"
    assert "can't allocate memory" in huge.data.tags["reason"], huge.data.tags["reason"]
    assert huge.data.params["model.intermediate_size"] == "100000000000000"
    fp16 = runs["preset=poison_fp16_on_cpu"]
    assert fp16.data.tags["status"] == "skipped" and fp16.data.params["precision"] == "fp16"
    assert fp16.data.tags["reason"].startswith("precision=fp16 needs a CUDA GPU"), fp16.data.tags["reason"]
    # two sweeps, two parent runs, every configuration run under one of them
    parents = [r for r in search_runs(cli.store, "bertaccel") if r.data.tags.get("bertaccel.role") == "sweep"]
    assert len(parents) == 2
    assert {r.data.tags["mlflow.parentRunId"] for r in runs.values()} == {p.info.run_id for p in parents}


def test_forkserver_workers_see_the_launchers_environment_of_now(compose_cfg, tmp_path, monkeypatch):
    """launcher.start_method=forkserver: workers fork from a server started with the first run,
    yet each run must see the launching process's environment at its own launch (the sweep's
    parent-run id is set after the server may have started)."""
    import time

    from bertaccel.runs.launch import launch
    from bertaccel.context import SweepContext
    from bertaccel.record.sweep import set_sweep

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = compose_cfg([*SMALL, "launcher.start_method=forkserver", f"tracking.uri={store}",
                       f"cache_dir={tmp_path / 'cache'}", "sweep.resume=false"])
    try:
        for sweep in ("first", "second"):
            set_sweep(SweepContext(f"sweep-{sweep}", f"parent-{sweep}"))
            outcome = launch(cfg, {}, f"run-{sweep}", time.time(), "test")
            assert outcome.status == "finished", outcome.reason
    finally:
        set_sweep(None)
    tags = {r.info.run_name: r.data.tags for r in search_runs(store, "bertaccel")}
    assert tags["run-first"]["sweep_id"] == "sweep-first"
    assert tags["run-second"]["sweep_id"] == "sweep-second"  # not the server's start-up environment
