"""Imports that must not open a CUDA context: the forkserver's preload (runs/preload.py).

A process with a CUDA context cannot hand it to a fork: every run forked from such a server fails
at its first CUDA call ("Cannot re-initialize CUDA in forked subprocess"). None of the preload's
libraries opens one by itself, but one that transformers pulls in can: transformers' modeling
code imports its quantizers, the torchao quantizer imports torchao when it is installed, and
torchao's MX kernels ask torch.utils._triton.has_triton() and torch.cuda.get_device_capability()
at import, both of which read the GPU's properties through the CUDA runtime, after
torch.cuda.is_available(), which (unless torch is told to count through NVML) calls
cudaGetDeviceCount: that alone marks every later fork bad, with no context opened. Seen on a 4 x H200 host with torchao 0.18 in the wheelhouse
(2026-11-26): every run of a sweep failed that way, 1 GPU or 4.

NVML opens no context and knows the compute capability: triton_check_without_cuda() answers
both questions from it while the preload imports, and puts torch's functions back after, so
modules imported later (in a run process, where CUDA is allowed) ask torch's own. A module that
imported has_triton by name inside keeps the answer it bound: the one torch would have given.
Where NVML cannot answer, or torch has no CUDA (its has_triton then never touches CUDA), nothing
is replaced. run_process_cuda_check() is the run side: a run forked from a server that has a
context anyway says so in one line, with the way around it, instead of CUDA's message.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Callable, Iterator, Optional, Tuple


# torch.cuda.is_available() / device_count() count GPUs through NVML when this is "1" (torch's own switch).
NVML_CHECK_ENV = "PYTORCH_NVML_BASED_CUDA_CHECK"


def nvml_capability() -> Optional[Tuple[int, int]]:
    """Compute capability of the first GPU NVML lists, or None where NVML does not answer."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no library, no driver, no GPU: NVML cannot answer
        return None
    try:
        if pynvml.nvmlDeviceGetCount() < 1:
            return None
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(0))
        return int(major), int(minor)
    except Exception:  # noqa: BLE001
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def has_triton_from_nvml(capability: Optional[Callable[[], Optional[Tuple[int, int]]]] = None) -> Optional[bool]:
    """has_triton()'s answer for a CUDA build without a CUDA context; None if it cannot be had."""
    from torch.utils._triton import has_triton_package

    if not has_triton_package():
        return False
    cap = (capability or nvml_capability)()
    if cap is None:
        return None
    return cap[0] >= 7  # torch's own test (torch/utils/_triton.py: Triton needs sm_70 or newer)


@contextmanager
def triton_check_without_cuda(capability: Optional[Callable[[], Optional[Tuple[int, int]]]] = None,
                              cuda_build: Optional[bool] = None) -> Iterator[Optional[bool]]:
    """While inside, the questions libraries ask the GPU at import are answered from NVML:
    torch.utils._triton.has_triton() and torch.cuda.get_device_capability() (torchao asks both;
    every GPU of the host is taken to be the first one's kind), and torch.cuda.is_available()
    through torch's own NVML switch. Yields has_triton's answer, or
    None where NVML cannot answer and nothing was replaced."""
    import torch
    import torch.utils._triton as triton_utils

    if cuda_build is None:
        cuda_build = torch.version.cuda is not None
    cap = (capability or nvml_capability)() if cuda_build else None
    if cap is None:
        yield None
        return
    answer = has_triton_from_nvml(lambda: cap)
    originals = (triton_utils.has_triton, torch.cuda.get_device_capability)
    # torch.cuda.is_available() (torchao asks it first) counts GPUs through the CUDA runtime, which
    # marks every later fork bad even with no context opened, unless torch is told to ask NVML.
    env_before = os.environ.get(NVML_CHECK_ENV)
    os.environ[NVML_CHECK_ENV] = "1"

    def has_triton() -> bool:
        return bool(answer)

    def get_device_capability(device: object = None) -> Tuple[int, int]:
        return cap

    # (has_triton is an lru_cache wrapper upstream; a plain function stands in for it here)
    triton_utils.has_triton, torch.cuda.get_device_capability = has_triton, get_device_capability  # type: ignore[assignment]
    try:
        yield answer
    finally:
        triton_utils.has_triton, torch.cuda.get_device_capability = originals
        if env_before is None:
            os.environ.pop(NVML_CHECK_ENV, None)
        else:
            os.environ[NVML_CHECK_ENV] = env_before


def run_process_cuda_check() -> Optional[str]:
    """One line if this process was forked from one with a CUDA context (it cannot use CUDA)."""
    import torch

    if not torch.cuda._is_in_bad_fork():
        return None
    return ("this run's process was forked from the forkserver after its preload opened a CUDA context "
            "(a library imported there asked the GPU at import), so it cannot use CUDA; run with "
            "launcher.start_method=spawn, and tell us which library it was (python -X importtime -c "
            "'import bertaccel.runs.preload')")
