"""benchmarks/search_vs_grid.py on the CPU at a toy size: the grid, its front, one search, the table."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

# Every test here starts a real process (the CLI, a script, a server) or trains: slow (docs/contributing.md).
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "search_vs_grid.py"
# 32 tokens a row too: the table is checked, not the accuracy or the times in it.
SMALL = ["dataset.train_subset=64", "dataset.test_subset=32", "train.max_steps_per_epoch=2", "train.epochs=1",
         "dataset.max_length=32"]


def test_grid_front_and_one_search_make_the_table(tmp_path):
    args = [sys.executable, str(SCRIPT), "--study", "quick", "--seeds", "0", "--trials", "2", "--out", str(tmp_path),
            "--jobs", "2", "--accuracy-floor", "0"]
    for o in SMALL:
        args += ["--override", o]
    r = subprocess.run(args, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("grid (quick): 8 runs, 8 finished"), r.stdout  # the quick study's 8 configurations
    marked = [line for line in lines if line.startswith("  * ")]
    assert marked, r.stdout  # a front has at least one configuration
    (row,) = [line for line in lines if line.startswith("| motpe, 0 |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "2" and cells[2] in ("1 of 8", "2 of 8")  # 2 trials, each trained or resumed
    assert any(line.startswith("noise (median over ") for line in lines)
    assert "--accuracy-floor 0.0: 0 front configuration(s) below it are not to be found" in lines
    assert (tmp_path / "search_motpe_seed0" / "mlflow.db").is_file()
    # The search's parent run names its sampler and objectives, and the report marks the front it found.
    rep = warm_cli.run([sys.executable, "-m", "bertaccel.report", "--uri",
                        f"sqlite:///{tmp_path / 'search_motpe_seed0' / 'mlflow.db'}", "--out", str(tmp_path / "rep")],
                       capture_output=True, text=True)
    assert rep.returncode == 0, rep.stderr[-2000:]
    assert "(MOTPESampler): " in rep.stdout and "configurations on its front" in rep.stdout
    md = (tmp_path / "rep" / "report.md").read_text()
    assert ": the Pareto front it found" in md and "train_time_s (minimize), test_accuracy (maximize)" in md
