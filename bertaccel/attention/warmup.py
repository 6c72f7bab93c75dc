"""Per-run state of our Triton attention kernels (the warm-up itself is bertaccel/train/warmup.py).

Triton keeps the variants it compiled in memory, per kernel, for the life of the process. A
later run of a sweep in the same process would then compile nothing and report no warm-up at
all, where a run in a process of its own loads its variants from the on-disk cache
(compile_cache.py). Clearing the in-memory variants at the start of each run makes both cases
the same: every run loads or compiles its own, and says which (cold / warm).
"""
from __future__ import annotations

import sys


def reset_kernel_caches() -> None:
    """Forget the compiled variants Triton keeps in memory for our kernels (per process)."""
    K = sys.modules.get("bertaccel.attention.triton_kernels")
    if K is None:  # never imported in this process: nothing compiled
        return
    for fn in (K._fwd_kernel, K._bwd_kernel):
        caches = getattr(fn, "device_caches", None)  # a JITFunction; absent under the interpreter
        if caches is not None:
            caches.clear()
