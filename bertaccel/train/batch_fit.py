"""train.batch_size=auto: the largest power-of-two micro-batch that fits the GPU's memory for this
configuration, found by trying real training steps before the run's first training window.

Why powers of two: they are the sizes GPU kernels tile best (multiples of 8 too, and of the
tensor-core tile), and doubling needs log2(n) tries, so the search costs a few steps. The thesis
(section 5.6.3) calls one batch size for GPUs of different memory unfair; `auto` gives each GPU
the largest it holds, so a hardware sweep compares each at its best.

How: sizes 1, 2, 4, ... up to the train split's rows (a larger batch would never be full) are
tried in turn, each a full forward + backward + optimizer step on a synthetic batch of the
dataset's longest padded length (the largest shape training will meet), with the run's precision,
attention backend, gradient checkpointing and optimizer (its state stays allocated between tries,
as in training). The first size that runs out of memory ends the search; memory is freed after
every try. Ascending rather than halving from a guess (accelerate's find_executable_batch_size
halves): only one try fails, and no starting guess is needed. Out-of-memory is recognized by
accelerate's own test (should_reduce_batch_size). The model's weights, its train/eval mode and
the random number generators are put back afterwards, so training starts exactly as with a fixed
batch size. The search is eager (no torch.compile): a compiled step usually needs less memory,
so the size found also fits compiled.

Not on a CPU: host memory has no limit that raises an error (the system swaps, or the OOM killer
ends the process), so there is nothing to search against; `auto` there is bad input (one line).
"""
from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, List, Tuple

import torch

from bertaccel.config import RunConfig


class BatchFitError(RuntimeError):
    """Not even a batch of one row fits."""


@dataclass
class Fit:
    batch_size: int
    tried: List[Tuple[int, bool]] = field(default_factory=list)  # (size, fitted) in the order tried
    seconds: float = 0.0
    length: int = 0                                              # the padded length tried at

    def describe(self) -> str:
        return ", ".join(f"{b} {'ok' if ok else 'out of memory'}" for b, ok in self.tried)


def cpu_refusal(device: torch.device) -> str:
    return (f"train.batch_size=auto fits the batch to a GPU's memory, but this run is on {device.type}: host "
            "memory has no limit that raises an error (it swaps, or the OOM killer ends the process); give a "
            "number, e.g. train.batch_size=32")


def is_out_of_memory(e: BaseException) -> bool:
    from accelerate.utils.memory import should_reduce_batch_size

    return bool(should_reduce_batch_size(e))


def largest_fitting(step: Callable[[int], None], cap: int, release: Callable[[], None] = lambda: None) -> Fit:
    """Try step(1), step(2), step(4), ... up to cap; the largest size whose step ran. An error
    that is not out-of-memory propagates; BatchFitError when size 1 does not fit."""
    fit = Fit(0)
    size = 1
    while size <= cap:
        try:
            step(size)
            ok = True
        except Exception as e:  # noqa: BLE001 - out-of-memory is decided by is_out_of_memory
            if not is_out_of_memory(e):
                raise
            ok = False  # (the exception and the frames holding its tensors go at the block's end)
        release()
        fit.tried.append((size, ok))
        if not ok:
            break
        fit.batch_size = size
        size *= 2
    if fit.batch_size == 0:
        raise BatchFitError(f"train.batch_size=auto: not even a batch of 1 row fits ({fit.describe()}); use a smaller "
                            "model, dataset.max_length or train.gradient_checkpointing=every")
    return fit


def release_device(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def training_step(model: torch.nn.Module, cfg: RunConfig, device: torch.device, length: int,
                  optimizer: torch.optim.Optimizer) -> Callable[[int], None]:
    """One real optimizer step of the run's kind on a synthetic batch of `size` rows x length,
    through the run's forward and loss (eager; its all-ones mask is passed, not dropped: the
    masked attention variant, which the padded batches of training run)."""
    from bertaccel.options.precision import Precision
    from bertaccel.train.forward import Forward, sdpa_backends

    precision = Precision(cfg.precision, device)
    precision.prepare(model)  # fp8: the layers the run trains (swapped once; loop.py's call then finds none)
    forward = Forward(model, precision, device, sdpa_backends(cfg), drop_full_mask=False)
    shape: Any = model.config  # (a PreTrainedModel's config; torch types attributes as Tensor | Module)
    vocab, labels = int(shape.vocab_size), int(shape.num_labels)

    def step(size: int) -> None:
        g = torch.Generator().manual_seed(size)
        ids = torch.randint(0, vocab, (size, length), generator=g).to(device)
        target = torch.randint(0, labels, (size,), generator=g).to(device)
        loss = forward.loss({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": target}, size)
        precision.scaler.scale(loss).backward()
        precision.scaler.step(optimizer)
        precision.scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return step


def _reset(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Between two tries: the gradients and the allocator's cache let go."""
    optimizer.zero_grad(set_to_none=True)
    release_device(device)


def fit_batch(model: torch.nn.Module, cfg: RunConfig, device: torch.device, length: int, rows: int) -> Fit:
    """The search of the module's docstring for this run's model on its device; model comes back
    with its weights, mode and the RNG state as they were (on the device)."""
    from bertaccel.options.optimizer import build_optimizer
    from bertaccel.train.checkpointing import apply_checkpointing

    started = time.perf_counter()
    cap = 1 << max(0, int(rows).bit_length() - 1)  # the largest power of two <= rows
    saved = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    was_training = model.training
    model.to(device)
    apply_checkpointing(model, cfg.train.gradient_checkpointing)  # (train() applies it again: idempotent)
    model.train()
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        optimizer = build_optimizer(model, cfg.optimizer)
        try:
            fit = largest_fitting(training_step(model, cfg, device, length, optimizer), cap,
                                  lambda: _reset(optimizer, device))
        finally:
            del optimizer
            model.zero_grad(set_to_none=True)
            release_device(device)
    model.load_state_dict(saved)
    model.train(was_training)
    fit.length = length
    fit.seconds = time.perf_counter() - started
    return fit


def fitted_batch(cfg: RunConfig, model: Any, device: torch.device, data: Any, tracker: Any) -> RunConfig:
    """train.batch_size=auto: the batch found (batch_fit.py), logged with the search's time, and a
    copy of cfg that has it (the run's record keeps `auto` as typed, like hardware=auto)."""
    import copy

    from bertaccel.options.hardware import device_name
    from bertaccel.train.warmup import data_lengths

    length = max(data_lengths(data.train.lengths, cfg.train.pad_to_multiple_of))
    fit = fit_batch(model, cfg, device, length, len(data.train))
    logging.getLogger("bertaccel").info(f"train.batch_size=auto: {fit.batch_size} rows at length {length} "
                                        f"({fit.describe()}; {fit.seconds:.2f} s)")
    tracker.log_metrics({"batch_size_used": fit.batch_size, "batch_search_time_s": fit.seconds})
    tracker.set_tags({
        "batch_size_used_source": (f"train.batch_size=auto: the largest power of two whose forward+backward+optimizer "
                                   f"step on a synthetic batch at the longest padded length {length} ran on "
                                   f"{device_name(device)} (tried: {fit.describe()}; batch_fit.py)"),
        "batch_search_time_s_source": ("time.perf_counter around the search, before the first training window "
                                       "(not in train_time_s; in startup_overhead_s)")})
    fitted = copy.deepcopy(cfg)
    fitted.train.batch_size = fit.batch_size
    return fitted
