"""Compile our Triton attention kernels for every shape a run can meet, before its training window.

Triton compiles a new kernel variant the first time a launch differs in a compile-time property:
block sizes (they follow the padded length S), dropout on or off (training vs evaluation), dtype,
and integer specializations (S % 16, ...). With dynamic padding these arrive one at a time in the
middle of training: measured on an H200, a bertaccel.run with attention=triton took 81 ms/step
against 26 for sdpa, the difference being compilation inside the timed window. So the model
trains one step (and evaluates once) on every padded length the run can produce, at batch 2,
before the first window; the time it takes is reported as its own metric
(attention_jit_warmup_s), not hidden.

Each run starts from empty kernel caches: the on-disk cache is per run (isolation.py), and the
in-memory one is cleared here, so a later run of a sweep pays for (and reports) its own compiles.
"""
from __future__ import annotations

import time
from typing import Callable, ContextManager, List, Optional, Tuple

import torch
from torch import nn

from .swap import FusedSelfAttention


def padded_lengths(max_length: int, multiple: int) -> List[int]:
    """Every length PadCollator can produce: multiples of `multiple` up to max_length rounded up."""
    m = max(1, int(multiple))
    top = -(-int(max_length) // m) * m
    return list(range(m, top + 1, m))


def reset_kernel_caches() -> None:
    """Forget the compiled variants Triton keeps in memory for our kernels (per process)."""
    from . import triton_kernels as K

    for fn in (K._fwd_kernel, K._bwd_kernel):
        caches = getattr(fn, "device_caches", None)  # a JITFunction; absent under the interpreter
        if caches is not None:
            caches.clear()


def exercise_shapes(model: nn.Module, autocast: Callable[[], ContextManager], lengths: List[int],
                    device: torch.device) -> None:
    """Per padded length, one training forward+backward and one evaluation forward of the model
    itself, at batch 2, once with a padded row and once without: HF passes no mask at all for a
    batch without padding, and "no mask" is a kernel variant of its own (warming with padding
    only left 4 compiles inside a real training window). Through the model rather than the op
    alone, so the launches are exactly those training makes. Leaves no trace: gradients
    cleared, train/eval mode and the RNG state (dropout draws) restored."""
    was_training = model.training
    vocab = model.config.vocab_size
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        for seq in lengths:
            ids = torch.randint(0, vocab, (2, seq), device=device)
            padded = torch.ones(2, seq, dtype=torch.long, device=device)
            padded[1, seq // 2 + 1:] = 0
            for mask in (padded, torch.ones_like(padded)):
                model.train()
                with autocast():
                    logits = model(input_ids=ids, attention_mask=mask).logits
                logits.float().sum().backward()
                model.eval()
                with torch.no_grad(), autocast():
                    model(input_ids=ids, attention_mask=mask)
    model.zero_grad(set_to_none=True)
    model.train(was_training)


def warm_up_triton_attention(model: nn.Module, autocast: Callable[[], ContextManager], lengths: List[int],
                             device: torch.device) -> Tuple[Optional[float], str]:
    """(seconds, source): compile every kernel variant the run's padded lengths need; None with
    the reason when there is nothing to compile."""
    if not any(isinstance(m, FusedSelfAttention) and m.backend == "triton" for m in model.modules()):
        return None, "null: no attention=triton layers in this model"
    if device.type != "cuda":
        return None, "null: on a CPU the kernels run in Triton's interpreter, which compiles nothing"
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    reset_kernel_caches()
    exercise_shapes(model, autocast, lengths, device)
    torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    return seconds, (f"wall clock: Triton compilation of the attention kernels for {len(lengths)} padded "
                     f"lengths ({lengths[0]}..{lengths[-1]}), before the first training window")
