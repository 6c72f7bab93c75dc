"""benchmarks/fused_kernels.py on the CPU: it compares like with like (ours, the eager PyTorch code and
the attention cores compute the same function), and without a GPU it refuses in one line."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import fused_kernels as bench  # noqa: E402


def test_each_rows_implementations_compute_the_same_function():
    g = torch.Generator().manual_seed(0)
    t, d, i = 7, 48, 96
    ln_inputs = [torch.randn(t, d, generator=g), torch.randn(d, generator=g), torch.randn(t, d, generator=g),
                 torch.randn(d, generator=g), torch.randn(d, generator=g)]
    gelu_inputs = [torch.randn(t, i, generator=g), torch.randn(i, generator=g)]
    rows = bench.ops(d, p=0.0)  # no dropout: the implementations draw different masks
    inputs = {"bias+dropout+residual+LayerNorm": ln_inputs, "bias+GELU": gelu_inputs}
    assert set(rows) == set(inputs)
    for name, impls in rows.items():
        torch.testing.assert_close(impls["ours"](*inputs[name]), impls["eager"](*inputs[name]), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_a_cpu_only_machine_is_refused_in_one_line():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the benchmark runs")
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / "fused_kernels.py")], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2
    assert r.stderr.strip() == "error: this benchmark times GPU kernels; no CUDA GPU is visible"
