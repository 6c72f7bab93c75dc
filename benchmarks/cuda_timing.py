"""One way to time a GPU call for the benchmark tables, shared by the scripts that use it."""
from __future__ import annotations

import statistics
from typing import Callable

import torch


def cuda_ms(fn: Callable[[], None], warmup: int = 10, calls: int = 30, repeats: int = 5) -> float:
    """Milliseconds per call, calls enqueued back to back as in a training loop (CUDA events; the
    median of `repeats` batches of `calls`, after `warmup` calls): the GPU time when the GPU is
    the bottleneck, the host time when Python and launches are. A sync after every single call
    would add its own latency to small ops."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        per_call.append(start.elapsed_time(end) / calls)
    return statistics.median(per_call)
