"""Per-run state, so that runs of one sweep process do not change each other's numbers.

Hydra's basic launcher runs every job of a multirun in one process. Without this, a later run
would inherit the earlier runs' dynamo caches and recompile budget (8 recompiles per code
object: past it, new shapes silently run eager), cached allocator blocks and a consumed RNG
stream. The on-disk compile caches are shared on purpose, and labelled (compile_cache.py).
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


@contextmanager
def isolated_run(seed: int) -> Iterator[None]:
    torch.compiler.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    seed_everything(seed)
    try:
        yield
    finally:
        torch.compiler.reset()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def compiled_graph_count() -> int:
    """Graphs dynamo compiled since the last reset (recompiles for new shapes included)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


_warmed_up = set()


def warm_up_device(device: torch.device) -> None:
    """Pay the once-per-process library start-up (CUDA context, cuBLAS handles and workspaces)
    outside any training window, so the first run of a sweep is not charged for it.

    Measured on an H200: without this, the same configuration took 9.4 s as the first job of a
    multirun and 6.6 s as the second.
    """
    if device.type != "cuda" or device in _warmed_up:
        return
    x = torch.randn(256, 256, device=device, requires_grad=True)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
            (x @ x).float().sum().backward()
    torch.nn.functional.cross_entropy(torch.randn(8, 4, device=device), torch.zeros(8, dtype=torch.long, device=device))
    torch.cuda.synchronize(device)
    _warmed_up.add(device)
