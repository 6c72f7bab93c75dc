"""benchmarks/search_vs_grid.py on the CPU at a toy size: the grid, its front, one search, the table."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "search_vs_grid.py"
SMALL = ["dataset.train_subset=64", "dataset.test_subset=32", "train.max_steps_per_epoch=2", "train.epochs=1"]


def test_grid_front_and_one_search_make_the_table(tmp_path):
    args = [sys.executable, str(SCRIPT), "--seeds", "0", "--trials", "2", "--out", str(tmp_path)]
    for o in SMALL:
        args += ["--override", o]
    r = subprocess.run(args, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("grid: 8 runs")  # the quick study's 8 configurations
    marked = [line for line in lines if line.startswith("  * ")]
    assert marked, r.stdout  # a front has at least one configuration
    (row,) = [line for line in lines if line.startswith("| 0 |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "2" and 1 <= int(cells[2]) <= 2  # 2 trials, each trained or resumed
    assert (tmp_path / "search_seed0" / "mlflow.db").is_file()
