"""Per-run state of our Triton kernels (the warm-up itself is bertaccel/train/warmup.py).

Triton keeps the variants it compiled in memory, per kernel, for the life of the process. A
later run of a sweep in the same process would then compile nothing and report no warm-up at
all, where a run in a process of its own loads its variants from the on-disk cache
(compile_cache.py). Clearing the in-memory variants at the start of each run makes both cases
the same: every run loads or compiles its own, and says which (cold / warm).
"""
from __future__ import annotations

import sys
from typing import Any, Dict, Iterator, Protocol, Tuple

# The modules holding the @triton.jit kernels a training run compiles: our attention, and the
# fused encoder's elementwise kernels (encoder=fused). Looked up by name, never imported here:
# a module not imported in this process has compiled nothing.
KERNEL_MODULES = ("bertaccel.attention.triton_kernels", "bertaccel.encoder.kernels")


class JitKernel(Protocol):
    """What we read of a Triton JITFunction (Triton ships no types): per device, a tuple whose
    first item holds the compiled variants."""
    device_caches: Dict[Any, Tuple[Any, ...]]


def jit_kernels() -> Iterator[JitKernel]:
    """Every Triton JITFunction of KERNEL_MODULES imported in this process (device_caches: absent
    under the interpreter, where nothing is compiled)."""
    for name in KERNEL_MODULES:
        module = sys.modules.get(name)
        for value in vars(module).values() if module is not None else ():
            if hasattr(value, "device_caches"):
                yield value


def reset_kernel_caches() -> None:
    """Forget the compiled variants Triton keeps in memory for our kernels (per process)."""
    for fn in jit_kernels():
        fn.device_caches.clear()


def kernel_variants() -> int:
    """Variants of our kernels compiled (or loaded from the disk cache) in this process since the reset."""
    return sum(len(entry[0]) for fn in jit_kernels() for entry in fn.device_caches.values())
