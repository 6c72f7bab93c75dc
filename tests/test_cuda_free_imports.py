"""The forkserver's preload opens no CUDA context even when a library it pulls in asks Triton
about the GPU at import (torchao's MX kernels do; seen failing every run on a 4 x H200 host).
CPU-only here: CUDA's initialisation is replaced by one that raises, so any import that would
open a context on a GPU host fails the same way here."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# A stand-in for torchao.prototype.mx_formats.kernels: asks torch's has_triton() and the device's
# compute capability at import (torchao 0.18's is_sm_at_least_100()).
ASKS_AT_IMPORT = ("import torch\nfrom torch.utils._triton import has_triton\nGPU = torch.cuda.is_available()\n"
                  "ANSWER = has_triton()\n"
                  "SM100 = torch.cuda.get_device_capability() >= (10, 0)\n")

HARNESS = textwrap.dedent("""
    import sys, torch, torch.cuda
    import torch.utils._triton as triton_utils
    import os
    def is_available():  # as on a GPU host: through the CUDA runtime unless torch's NVML switch is on
        if os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") != "1":
            raise RuntimeError("cudaGetDeviceCount: every later fork is marked bad")
        return True
    torch.cuda.is_available = is_available
    def no_context(*a, **k):
        raise RuntimeError("a CUDA context was opened")
    torch.cuda._lazy_init = no_context
    from bertaccel.runs.cuda_free_imports import triton_check_without_cuda
    original, capability = triton_utils.has_triton, torch.cuda.get_device_capability
    mode = sys.argv[1]
    if mode == "plain":
        import asks_plain
        print("imported", asks_plain.ANSWER)
    else:
        cap = {"sm90": (9, 0), "sm60": (6, 0), "none": None}[mode]
        with triton_check_without_cuda(capability=lambda: cap, cuda_build=True) as answer:
            import asks_guarded
        print("answer", answer, "bound", asks_guarded.ANSWER if answer is not None else "-",
              "sm100", asks_guarded.SM100 if answer is not None else "-",
              "restored", triton_utils.has_triton is original and torch.cuda.get_device_capability is capability
              and "PYTORCH_NVML_BASED_CUDA_CHECK" not in os.environ,
              "package", triton_utils.has_triton_package())
""")


def _run(tmp_path, mode):
    (tmp_path / "asks_plain.py").write_text(ASKS_AT_IMPORT)
    (tmp_path / "asks_guarded.py").write_text(ASKS_AT_IMPORT)
    (tmp_path / "harness.py").write_text(HARNESS)
    return subprocess.run([sys.executable, str(tmp_path / "harness.py"), mode], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_the_stand_in_opens_a_context_without_the_guard(tmp_path):
    # The control: through torch's own has_triton, the import reaches CUDA's initialisation.
    proc = _run(tmp_path, "plain")
    pytest.importorskip("triton")
    assert proc.returncode != 0 and "every later fork is marked bad" in proc.stderr, proc.stdout + proc.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("mode, expected", [("sm90", "True"), ("sm60", "False")])
def test_inside_the_guard_the_answer_comes_from_nvml_and_the_original_is_put_back(tmp_path, mode, expected):
    pytest.importorskip("triton")
    proc = _run(tmp_path, mode)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["answer", expected, "bound", expected, "sm100", "False", "restored", "True",
                                   "package", "True"]


@pytest.mark.slow
def test_where_nvml_cannot_answer_nothing_is_replaced(tmp_path):
    # Nothing to answer with: has_triton is left as it was (and would open the context it opens).
    proc = _run(tmp_path, "none")
    pytest.importorskip("triton")
    assert proc.returncode != 0 and "every later fork is marked bad" in proc.stderr, proc.stdout


def test_a_run_forked_from_a_poisoned_server_says_so_in_one_line(monkeypatch):
    import torch

    from bertaccel.runs.cuda_free_imports import run_process_cuda_check
    assert run_process_cuda_check() is None  # this process was not forked from a CUDA one
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)
    why = run_process_cuda_check()
    assert "\n" not in why and "launcher.start_method=spawn" in why
