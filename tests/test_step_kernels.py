"""benchmarks/step_kernels.py on the CPU: the plumbing of its table (the numbers mean something on a GPU)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bertaccel.measure.profiling import categorize

# Every test here starts the script (a process, or its module with torch and bertaccel): slow (docs/contributing.md).
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "step_kernels.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=600)


def test_cpu_rows_split_the_step_into_categories():
    r = _run("--device", "cpu", "--tiny", "--batch-sizes", "4", "--seq", "32", "--modes", "eager,fused,fused-fp8",
             "--steps", "2", "--warmup-steps", "1", "--profile-steps", "2", "--top", "3")
    assert r.returncode == 0, r.stderr[-2000:]
    header = next(line for line in r.stdout.splitlines() if line.startswith("| B |"))
    row = next(line for line in r.stdout.splitlines() if line.startswith("| 4 | eager |"))
    cells = dict(zip([c.strip() for c in header.strip("|").split("|")], [c.strip() for c in row.strip("|").split("|")]))
    assert float(cells["ms/step"]) > 0
    assert cells["GPU ms/step"] == "-"  # no GPU timeline on a CPU: not measured, not 0
    per_category = [float(cells[f"{c} ms"]) for c in ("gemm", "attention", "elementwise", "optimizer", "other")]
    assert sum(per_category) > 0 and per_category[0] > 0  # the tiny model's linears are GEMMs
    # The fused AdamW update is categorized as the optimizer and counted in its column. Which
    # kernels rank among the most expensive by time depends on the machine's load, so only the
    # list's shape is checked: --top 3 names three per row.
    assert categorize("aten::_fused_adamw_") == "optimizer" and per_category[3] > 0
    listed = r.stdout.split("B=4 eager: most expensive kernels, ms/step\n", 1)[1].split("\n\n")[0].splitlines()
    assert len(listed) == 3 and all(float(line.split()[0]) >= 0 for line in listed), r.stdout
    # encoder=fused's row: the same model with our layers (Triton's interpreter on a CPU)
    assert any(line.startswith("| 4 | fused |") for line in r.stdout.splitlines()), r.stdout
    # and with its FP8 forward GEMMs (encoder/fp8_ops.py: torch._scaled_mm runs on a CPU too)
    assert any(line.startswith("| 4 | fused-fp8 |") for line in r.stdout.splitlines()), r.stdout


def test_reduce_overhead_on_a_cpu_is_one_line():
    r = _run("--device", "cpu", "--modes", "reduce-overhead")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "needs --device cuda" in r.stderr
    # The captured-step modes likewise, named in the line.
    r = _run("--device", "cpu", "--modes", "fused,fused-sdpa-fp8-graph")
    assert r.returncode == 2 and r.stderr.strip() == (
        "error: --modes fused-sdpa-fp8-graph replays CUDA graphs and needs --device cuda")
    # bertaccel's own step graphs (benchmarks/bertaccel_step.py) too, and --diff, which compares GPU kernels.
    r = _run("--device", "cpu", "--modes", "eager,ba-whole")
    assert r.returncode == 2 and r.stderr.strip() == (
        "error: --modes ba-whole replays CUDA graphs and needs --device cuda")
    r = _run("--device", "cpu", "--modes", "eager", "--diff", "eager")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "--diff eager" in r.stderr


def test_the_diff_lists_kernels_by_their_difference_and_sums_the_rest(capsys):
    """print_diff (--diff) over two rows' per-kernel times, against a hand computation."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("step_kernels", SCRIPT)
    sk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sk)
    base = {"per_name": {"gemm": 1.0, "adam": 0.8, "ln": 0.2}, "calls": {"gemm": 60, "adam": 7, "ln": 25}}
    ours = {"per_name": {"gemm": 1.1, "step": 0.5, "ln": 0.2, "add": 0.6}, "calls": {"gemm": 60, "step": 1, "ln": 25,
                                                                                     "add": 202}}
    sk.print_diff("B=32", "d", base, "ours", ours, top=3)
    lines = capsys.readouterr().out.strip().splitlines()
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("| ")][1:]
    # largest |difference| first: adam -0.8, add +0.6, step +0.5; then gemm's +0.1 and ln's 0 in "the other 2"
    assert [r[0] for r in rows[:3]] == ["adam", "add", "step"]
    assert rows[0] == ["adam", "0.8000", "7", "0.0000", "0", "-0.8000"]
    assert rows[1] == ["add", "0.0000", "0", "0.6000", "202", "+0.6000"]
    assert rows[3] == ["the other 2 kernels", "", "", "", "", "+0.1000"]
    assert rows[4] == ["all kernels (summed, not their union)", "2.0000", "92", "2.4000", "288", "+0.4000"]
