"""benchmarks/same_losses.sh (the before/after check of a refactor, docs/results/index.md) on the
tiny model: it runs the default job and the 2x2 sweep and writes one line per finished run."""
from __future__ import annotations

import math
import os
import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def test_same_losses_writes_the_default_job_and_the_four_sweep_runs(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run(["bash", str(REPO / "benchmarks" / "same_losses.sh"), str(REPO), str(tmp_path / "out"),
                        "model=tiny", "train.max_steps_per_epoch=2", "train.batch_size=16", "dataset.test_subset=32"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = (tmp_path / "out" / "losses.txt").read_text().splitlines()
    assert lines[-1].startswith("elapsed "), lines
    runs = {line.split(" train_loss ")[0]: line for line in lines[:-1]}
    assert len(runs) == 5, lines
    assert sum("accumulation=" in name and "freezing=" in name for name in runs) == 4, lines
    for line in runs.values():
        losses = [float(x) for x in re.search(r"train_loss \[(.*?)\]", line).group(1).split(",")]
        accuracy = float(line.rsplit("test_accuracy ", 1)[1])
        assert losses and all(math.isfinite(x) for x in losses) and 0 <= accuracy <= 1, line
