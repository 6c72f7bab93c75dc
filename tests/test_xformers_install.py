"""attention=xformers where xFormers cannot run: the skip reason names the line that installs it."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from bertaccel.attention.kernels.xformers import XFORMERS_INSTALL, xformers_unusable

PIP_LINE = "pip install --no-build-isolation --no-binary xformers xformers==0.0.35"


def test_install_line_builds_from_source_for_the_torch_at_hand():
    assert PIP_LINE in XFORMERS_INSTALL and "TORCH_CUDA_ARCH_LIST=" in XFORMERS_INSTALL


@pytest.mark.slow
def test_reason_when_xformers_is_absent_names_the_install_line():
    # A None entry in sys.modules makes `import xformers` raise ImportError, as on a machine without it.
    script = textwrap.dedent("""
        import sys, torch
        sys.modules["xformers"] = None
        from bertaccel.attention.kernels.xformers import xformers_unusable
        print(xformers_unusable(torch.device("cpu")))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.startswith("attention=xformers: xformers is not importable (ModuleNotFoundError"), out
    assert PIP_LINE in out


def test_reason_when_the_extension_was_built_for_another_torch():
    """PyPI's wheel is built for torch 2.10 (.ci/run installs it): on this torch its extension does
    not load, and the reason says so, what it was built for, and the line that rebuilds it."""
    xformers = pytest.importorskip("xformers")
    if xformers._has_cpp_library:
        pytest.skip(f"xformers {xformers.__version__}'s extension loads with this torch")
    reason = xformers_unusable(torch.device("cpu"))
    assert reason.startswith(f"attention=xformers: xformers {xformers.__version__}'s extension does not load "
                             f"with torch {torch.__version__}"), reason
    assert "built for PyTorch" in reason and PIP_LINE in reason


def test_a_run_with_attention_xformers_is_skipped_with_that_reason(tmp_path):
    """The reason reaches the run's record through the option's machine check."""
    from omegaconf import OmegaConf

    from bertaccel.attention.option import attention_unusable

    a = OmegaConf.create({"name": "xformers", "hf_implementation": "eager", "swap": "xformers", "sdpa_backends": []})
    reason = attention_unusable(a, torch.device("cpu"))
    assert reason is not None and reason.startswith("attention=xformers")
    assert reason == xformers_unusable(torch.device("cpu"))


def test_operators_are_named_by_dtype_and_gpu():
    """Flash for fp16/bf16 on sm80 and newer, CUTLASS otherwise (fp32, older GPUs, no GPU)."""
    xops = pytest.importorskip("xformers.ops")
    from bertaccel.attention.kernels.xformers import _xformers_ops

    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert _xformers_ops(torch.zeros(1, dtype=dtype)) is xops.MemoryEfficientAttentionCutlassOp  # not on a GPU
    if torch.cuda.is_available():
        half = torch.zeros(1, dtype=torch.float16, device="cuda")
        want = (xops.MemoryEfficientAttentionFlashAttentionOp if torch.cuda.get_device_capability() >= (8, 0)
                else xops.MemoryEfficientAttentionCutlassOp)
        assert _xformers_ops(half) is want
        assert _xformers_ops(half.float()) is xops.MemoryEfficientAttentionCutlassOp
