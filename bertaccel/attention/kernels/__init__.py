"""The attention kernels a swap may name, one module each: `kernels/<name>.py` defines `BACKEND`
(a `Backend`), and `<name>` is the `attention.swap` value that runs it (conf/attention/*.yaml).

Found by convention, not listed: `BACKENDS` reads this package's modules the first time it is
asked (not at import: a sweep's processes import this package and must not pay for the kernels,
and each kernel imports its own library, xFormers or Triton, only inside its functions). Adding a
kernel is its module here and its YAML file in conf/attention/: the attention option's check,
its machine check, the swapped Hugging Face layer, the fused encoder (encoder/attention.py core())
and the config reference all read `BACKENDS`.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any, Callable, Dict, Iterator, Optional

import torch

from bertaccel.attention.packing import Packing


@dataclass(frozen=True)
class Backend:
    """One attention kernel, everything the package asks of it. dense_core: q/k/v [B, S, H, D], no
    padding -> [B, S, H, D]. packed_core: q/k/v [T, H, D] of the Packing's sequences -> [T, H, D].
    prepare: the kernel's per-batch object, built once per batch by PackedEncoder (not per layer).
    unusable: why this machine cannot run it (a skip), or None. jit_per_run: compiled per run (a
    warm-up before the first window). fused_core: our fused layer's core,
    qkv [T, 3, H, D] -> [T, H, D] (encoder/attention.py core()). order: where the kernel stands in
    the lists that name the kernels (a refusal's "one of ...", the config reference); kernels of
    one order by name."""
    dense_core: Callable[..., torch.Tensor]
    packed_core: Callable[..., torch.Tensor]
    prepare: Callable[[Packing], Any]
    unusable: Callable[[torch.device], Optional[str]]
    fused_core: Callable[..., torch.Tensor]
    order: int = 100
    # Compiled per run (a JIT kernel, loaded from or written to the run's compile cache): the
    # run then has a warm-up that compiles it before its first timed window (train/step.py).
    jit_per_run: bool = False


def no_prepare(packing: Packing) -> None:
    """`prepare` of a kernel that needs no per-batch object."""
    return None


def collect(package: str) -> Dict[str, Backend]:
    """Every module of `package` as {module name: its BACKEND}, in the kernels' order. A module
    without a Backend named BACKEND is refused (a TypeError, one line): every module here is a
    kernel, and a helper module in the package would otherwise be a swap name that fails later."""
    found = {}
    for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
        module = importlib.import_module(f"{package}.{info.name}")
        backend = getattr(module, "BACKEND", None)
        if not isinstance(backend, Backend):
            raise TypeError(f"{module.__file__} defines no BACKEND = Backend(...) (it has {backend!r}): every module "
                            f"of {package} is the attention kernel that attention.swap={info.name} runs; define "
                            f"its BACKEND or move the module out of the package")
        found[info.name] = backend
    return dict(sorted(found.items(), key=lambda item: (item[1].order, item[0])))


class _Kernels(Mapping):
    """{swap name: Backend} of this package, read at the first question and kept: the modules are
    code, the same for every run of the process."""

    def __init__(self, package: str):
        self._package = package
        self._found: Optional[Dict[str, Backend]] = None

    def _all(self) -> Dict[str, Backend]:
        if self._found is None:
            self._found = collect(self._package)
        return self._found

    def __getitem__(self, name: str) -> Backend:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def __repr__(self) -> str:
        return f"BACKENDS({', '.join(self)})"


# The attention kernels an attention option may name (conf/attention/*.yaml `swap:`).
BACKENDS: Mapping[str, Backend] = _Kernels(__name__)
