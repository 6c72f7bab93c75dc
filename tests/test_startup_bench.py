"""A sweep's start-up, accounted (runs/startup.py), through benchmarks/startup.py on the CPU: two
real 2-run sweeps (cold, warm) with the default launcher, process runs forked from the forkserver."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FORKED_PARTS, JOB_PARTS, MAIN_PARTS, startup_phases_of
from mlflow.tracking import MlflowClient

from bertaccel.runs import startup

# Every test here starts a real process (the CLI, a script, a server) or trains: slow (docs/contributing.md).
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "startup.py"


def test_every_run_of_a_forkserver_sweep_accounts_for_its_start_up_cold_and_warm(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dir", str(tmp_path / "bench"), "--",
                           "model=tiny", "train.device=cpu", "dataset.train_subset=32", "dataset.test_subset=16",
                           "train.batch_size=16", "train.seed=1,2"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout
    assert ("| phase (s) | cold: first run | cold: later runs (mean of 1) | warm: first run "
            "| warm: later runs (mean of 1) |") in out, out
    reached = re.search(r"\| \*\*launch to the first run's first step \(this script's clock\)\*\* "
                        r"\| ([\d.]+) \| - \| ([\d.]+) \| - \|", out)
    assert reached, out
    client = MlflowClient(f"sqlite:///{tmp_path / 'bench' / 'mlflow.db'}")
    experiments = sorted(e.name for e in client.search_experiments() if e.name.startswith("startup-"))
    assert [e.split("-")[1] for e in experiments] == ["cold", "warm"], experiments
    for name, reached_s in zip(experiments, map(float, reached.groups())):
        exp = client.get_experiment_by_name(name)
        runs = sorted((r for r in client.search_runs([exp.experiment_id])
                       if r.data.tags.get("bertaccel.role") != "sweep"), key=lambda r: r.info.start_time)
        assert [r.data.tags["status"] for r in runs] == ["finished", "finished"]
        first, later = (startup_phases_of(r) for r in runs)
        # The first run from the sweep process's start: its main process's parts, its job's, its
        # forked process's; the later run from its job's start, without the main process's parts.
        assert list(first)[:11] == [*MAIN_PARTS, *JOB_PARTS, *FORKED_PARTS], first
        assert list(later)[:7] == [*JOB_PARTS, *FORKED_PARTS], later
        assert first[startup.MAIN_IMPORTS] > 0.1  # torch, MLflow, Hydra: seconds, not nothing
        # The process's start is read to the clock tick: the first run's start-up is what this
        # script's own clock saw from its launch of the sweep, not more (psutil's process start,
        # up to 1 s early, was) and not much less (the launch takes milliseconds).
        overhead = runs[0].data.metrics["startup_overhead_s"]
        assert overhead - 0.02 <= reached_s <= overhead + 1.0, (overhead, reached_s)
        assert json.loads(runs[0].data.tags["train_windows_unix"])
