"""Per-run state, so that runs do not change each other's numbers.

With launcher.name=process (the default) every run has a fresh process, and only the seeds are
left to set. With launcher.name=inline the runs of a sweep share the sweep's process, and a
later run would inherit the earlier runs' dynamo caches and recompile budget (8 recompiles per
code object: past it, new shapes silently run eager), cached allocator blocks and a consumed
RNG stream: those are reset around the run. The on-disk compile caches are shared on purpose,
and labelled (compile_cache.py).
"""
from __future__ import annotations

import gc
import random
from contextlib import contextmanager
from typing import Iterator

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def _compiled_in_process() -> bool:
    """Whether dynamo has looked at any frame in this process (its counters are never cleared)."""
    from torch._dynamo.utils import counters

    return any(sum(counters[k].values()) for k in ("frames", "stats"))


def _reset_shared_process() -> None:
    # Only where something was compiled: on a GPU the reset imports Inductor's CUDA-graph trees
    # (1-3 s, ~900 modules), which a process of eager runs (the plan's shared probes, an inline
    # sweep of compile=off) would pay in its second run for caches that are empty.
    if _compiled_in_process():
        torch.compiler.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@contextmanager
def isolated_run(seed: int, shared_process: bool) -> Iterator[None]:
    """shared_process: the run is not alone in its process (launcher.name=inline)."""
    if shared_process:
        _reset_shared_process()
    seed_everything(seed)
    try:
        yield
    finally:
        if shared_process:
            _reset_shared_process()


def warm_up_device(device: torch.device) -> None:
    """Pay the once-per-process library start-up (CUDA context, cuBLAS handles and workspaces)
    outside any training window, so the first run of a sweep is not charged for it.

    Measured on an H200: without this, the same configuration took 9.4 s as the first job of a
    multirun and 6.6 s as the second. Every run does it (in a process where it already happened
    it takes milliseconds), so nothing is remembered between runs.
    """
    if device.type != "cuda":
        return
    x = torch.randn(256, 256, device=device, requires_grad=True)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
            (x @ x).float().sum().backward()
    torch.nn.functional.cross_entropy(torch.randn(8, 4, device=device), torch.zeros(8, dtype=torch.long, device=device))
    torch.cuda.synchronize(device)
