"""The quick sweep end to end, then the report and the notebook executed on its store."""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient
import pytest

from bertaccel.record.tracking import search_runs
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

# Every test here starts a real process (the CLI, a script, a server) or trains: slow (docs/contributing.md).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


# The quick sweep's third axis with torch's fused AdamW in place of ours: conftest sets
# TRITON_INTERPRET=1, under which our Triton optimizer runs its kernel programs in Python (2.4 s a
# step, 4 of the 8 runs took 4 of the sweep's 5 minutes). tests/test_adamw_flat.py and
# test_flat_master.py test that optimizer; this test is about the sweep, the report and the notebook.
OPTIMIZERS = "optimizer=adamw,adamw_torch_fused"
# The quick study's grid on less data (its 512/256 rows, 2 epochs, 128 tokens): what is checked
# is that 8 runs finish and what the report and the notebook say of them, not how well they
# train, and a smaller run leaves it the same (benchmarks/search_vs_grid.py's test runs this
# study's 8 configurations on 64 rows too).
SMALL = ["dataset.train_subset=64", "dataset.test_subset=32", "train.epochs=1", "dataset.max_length=32"]


def test_quick_sweep_report_and_notebook(cli, monkeypatch, tmp_path):
    sweep = cli(["-m", "--config-name", "quick", OPTIMIZERS, *SMALL], timeout=900)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    assert "8 runs: finished=8" in sweep.stdout
    (parent,) = [r for r in search_runs(cli.store, "bertaccel") if r.data.tags.get("bertaccel.role") == "sweep"]
    sweep_id = parent.data.tags["sweep_id"]

    report = warm_cli.run([sys.executable, "-m", "bertaccel.report", "--uri", cli.store, "--sweep", sweep_id,
                           "--baseline", "accumulation=1,freezing=none,optimizer=adamw", "--out", "rep"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert report.returncode == 0, report.stderr
    md = (tmp_path / "rep" / "report.md").read_text()
    # CPU runs: no energy (no RAPL here) and no occupancy (no GPU); the report says so and scores
    # over time and cost only.
    assert "occupancy (occupancy_pct) is null for 8 of 8 rows: null: no GPU: this run is on the CPU" in md
    assert "time (time_s) is null" not in md  # the sweep's parent run is not a row
    # every run scored over fewer metrics, said once for all 8; runs labelled by their values
    fewer = md.split("## Rows scored over fewer metrics")[1].split("\n## ")[0]
    assert "| all 8 runs | energy_kwh, occupancy_pct |" in fewer, fewer
    assert "Runs are labelled accumulation / freezing / optimizer" in md

    # A small search in the same store (another seed, so no trial resumes a quick run): the
    # notebook shows the front it found.
    search = cli(["-m", "--config-name", "quick", OPTIMIZERS, *SMALL, "train.seed=7", "hydra/sweeper=optuna_pareto", "hydra.sweeper.n_trials=3",
                  "search.objectives=[train_time_s,test_accuracy]", "search.directions=[minimize,maximize]"], timeout=900)
    assert search.returncode == 0, search.stderr[-3000:]

    monkeypatch.setenv("BERTACCEL_TRACKING_URI", cli.store)
    monkeypatch.setenv("BERTACCEL_SWEEP_ID", sweep_id)
    nb = nbformat.read(ROOT / "notebooks" / "compare_runs.ipynb", as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("8 finished runs" in o.get("text", "") for o in outputs)
    shown = [str(o.get("data", {}).get("text/markdown", "")) + str(o.get("data", {}).get("text/plain", "")) for o in outputs]
    # Carbon: no energy on this CPU, so every run says why it has no co2e_kg (never 0).
    assert any("has `co2e_kg`: " in t and "energy_kwh unavailable" in t for t in shown), shown
    assert any("MOTPESampler, sampler seed 0, 3 trials" in t for t in shown), shown  # the search and its front
