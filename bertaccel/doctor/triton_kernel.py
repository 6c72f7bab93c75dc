"""The smallest Triton kernel there is (x += 1), compiled and run once to answer "can Triton build
kernels for this GPU": importing triton says nothing about its compiler, ptxas or the driver.
Imported only where triton is installed."""
from __future__ import annotations

import time

import torch
import triton
import triton.language as tl


@triton.jit
def _add_one(x_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + 1, mask=mask)


def compile_and_run(device: torch.device) -> float:
    """Seconds to compile (or load from Triton's cache) and run the kernel; raises when Triton
    cannot, or when the kernel ran and gave a wrong answer."""
    x = torch.zeros(1000, device=device)
    start = time.perf_counter()
    _add_one[(triton.cdiv(x.numel(), 256),)](x, x.numel(), BLOCK=256)
    torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    if not bool((x == 1).all()):
        raise RuntimeError("Triton's test kernel ran but wrote wrong values")
    return seconds
