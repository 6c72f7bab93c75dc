"""One training step's pieces, apart from the epoch loop that runs them (train/loop.py): host batch
to model inputs, a window of accumulated micro-batches, an evaluation batch, and the per-run
wrappers around the model (torch.compile, DDP, dynamo settings, SDPA backends).

The warm-up (warmup.py) runs the same functions the loop runs, so what it compiles is what
the loop will execute.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Union

import torch
import torch.nn.functional as F

from bertaccel import distributed
from bertaccel.measure.step_clock import PhaseClock
from bertaccel.options.accumulation import GradVariance
from bertaccel.options.precision import Precision
from bertaccel.train.warmup import IGNORE_INDEX


def sdpa_backends(cfg: Any):
    """Context restricting torch SDPA to the configured backends (no-op when none are set)."""
    names = list(cfg.attention.sdpa_backends) if cfg.attention.hf_implementation == "sdpa" else []
    if not names:
        return nullcontext
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = [getattr(SDPBackend, n) for n in names]
    return lambda: sdpa_kernel(backends)


def windows(batches: Iterable[Dict[str, torch.Tensor]], k: Union[int, Callable[[], int]]
            ) -> Iterator[List[Dict[str, torch.Tensor]]]:
    """Group micro-batches into accumulation windows of k; a final shorter window still steps.
    k: a number, or a function read at the start of each window (accumulation=adaptive)."""
    window: List[Dict[str, torch.Tensor]] = []
    size = k() if callable(k) else k
    for batch in batches:
        window.append(batch)
        if len(window) == size:
            yield window
            window = []
            size = k() if callable(k) else k
    if window:
        yield window


def real_rows(batch: Dict[str, torch.Tensor]) -> int:
    """Rows that are data (compiled runs fill a short batch up with ignored rows: warmup.py)."""
    return int((batch["labels"] != IGNORE_INDEX).sum())


def mark_length_dynamic(batch: Dict[str, torch.Tensor]) -> None:
    """One compiled graph for every padded length: dim 1 symbolic instead of a graph per length.
    maybe_: where the model's code specializes on the length, dynamo keeps it static instead of
    failing, and the warm-up then simply compiles one graph per length."""
    for key in ("input_ids", "attention_mask"):
        if batch[key] is not None:  # no mask: the batch has no padding (model_inputs)
            torch._dynamo.maybe_mark_dynamic(batch[key], 1)


def model_inputs(host_batch: Dict[str, torch.Tensor], device: torch.device,
                 drop_full_mask: bool = True) -> Dict[str, Optional[torch.Tensor]]:
    """The batch on the device; drop_full_mask: attention_mask None where the batch has no padding.

    An all-ones mask means "attend everywhere", exactly what no mask means. Eager Hugging Face
    drops it itself, but by reading the device mask (a host sync per forward); here the check is
    made on the host batch before the copy. Compiled runs keep the mask (train() passes False):
    the no-mask variant is the one SDPA could run as flash attention, but on an H200 (torch 2.11)
    Inductor's compile of that variant hung in async_compile.wait and never returned."""
    mask = host_batch["attention_mask"]
    unpadded = drop_full_mask and mask.device.type == "cpu" and bool(mask.all())
    batch = {key: t.to(device, non_blocking=True) for key, t in host_batch.items() if key != "attention_mask"}
    batch["attention_mask"] = None if unpadded else mask.to(device, non_blocking=True)
    return batch


def accumulate_window(model: Callable, window: List[Dict[str, torch.Tensor]], precision: Precision,
                      device: torch.device, attention_ctx: Callable = nullcontext,
                      prepare: Optional[Callable[[Dict[str, torch.Tensor]], None]] = None,
                      drop_full_mask: bool = True,
                      no_sync: Callable[[], Any] = nullcontext,
                      phases: Optional[PhaseClock] = None,
                      grad_variance: Optional[GradVariance] = None) -> torch.Tensor:
    """Forward+backward over one window; returns the window's mean loss (detached).

    Each micro-batch's summed loss is divided by the window's sample count n, so the gradient
    equals that of one batch of n samples. With k equal micro-batches of b that is the usual
    mean/k scaling; a partial last micro-batch or window is weighted exactly, not by 1/k.
    Filler rows (label IGNORE_INDEX) add nothing to the loss, its gradient or n.
    prepare: called on each device batch before the forward (dynamic-length marking).
    drop_full_mask: see model_inputs. no_sync: data parallel, DDP's no_sync: the gradient
    all-reduce runs once, in the window's last backward, not after every micro-batch.
    Under data parallel n is this rank's count and DDP averages over the ranks: the gradient of
    the global batch when ranks have equal counts (every full step; see data.shard).
    phases: marks the forward/backward boundaries of the one-step breakdown (step_clock.py).
    grad_variance: accumulation=adaptive, sees each micro-batch's gradient (options/accumulation.py).
    """
    n = sum(real_rows(b) for b in window)
    total = torch.zeros((), device=device)
    for i, batch in enumerate(window):
        batch = model_inputs(batch, device, drop_full_mask)
        if prepare is not None:
            prepare(batch)
        with (no_sync() if i < len(window) - 1 else nullcontext()):
            with precision.autocast(), attention_ctx():
                logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            loss = F.cross_entropy(logits.float(), batch["labels"], reduction="sum", ignore_index=IGNORE_INDEX) / n
            if phases is not None:
                phases.forward_done()
            precision.scaler.scale(loss).backward()
            if phases is not None:
                phases.backward_done()
            if grad_variance is not None:
                grad_variance.after_backward(real_rows(batch), n)
        total += loss.detach()
    return total


def eval_batch(model: Callable, batch: Dict[str, torch.Tensor], precision: Precision, device: torch.device,
               attention_ctx: Callable = nullcontext,
               prepare: Optional[Callable[[Dict[str, torch.Tensor]], None]] = None,
               drop_full_mask: bool = True) -> torch.Tensor:
    """Correct predictions among the batch's data rows (a device scalar: no host sync)."""
    batch = model_inputs(batch, device, drop_full_mask)
    if prepare is not None:
        prepare(batch)
    with torch.no_grad(), precision.autocast(), attention_ctx():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return ((logits.argmax(-1) == batch["labels"]) & (batch["labels"] != IGNORE_INDEX)).sum()


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader: Iterable, precision: Precision, device: torch.device,
             attention_ctx: Callable = nullcontext, step_model: Optional[Callable] = None,
             prepare: Optional[Callable[[Dict[str, torch.Tensor]], None]] = None,
             drop_full_mask: bool = True) -> float:
    """Test accuracy. step_model: the compiled model (its eval graphs were warmed up too)."""
    model.eval()
    correct = torch.zeros((), dtype=torch.long, device=device)
    seen = 0
    for batch in loader:
        correct += eval_batch(model if step_model is None else step_model, batch, precision, device, attention_ctx,
                              prepare, drop_full_mask)
        seen += real_rows(batch)
    model.train()
    # Data parallel: each rank saw its share of the test split (data.make_loader); the accuracy
    # is over the whole split.
    correct_all, seen_all = distributed.sum_across([int(correct), seen], device)
    return correct_all / seen_all


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def uses_fixed_shapes(cfg: Any) -> bool:
    """Compiled runs pad every batch to a fixed row count, so the batch dimension never
    changes and the shape set is just the padded lengths (eager runs gain nothing from it)."""
    return cfg.compile.mode != "off" or cfg.compile.step_graph


def uses_triton(cfg: Any, device_type: str) -> bool:
    """Our Triton kernels JIT-compile (or load) per run: attention=triton's, and encoder=fused's."""
    return (cfg.attention.swap == "triton" or cfg.encoder.layer == "fused") and device_type == "cuda"


def compiles_anything(cfg: Any, device_type: str) -> bool:
    """Whether a run has a warm-up to compile: torch.compile, our Triton kernels, step graphs."""
    return cfg.compile.mode != "off" or uses_triton(cfg, device_type) or bool(cfg.compile.step_graph)


def compile_model(model: torch.nn.Module, cfg: Any) -> Callable:
    if cfg.compile.mode == "off":
        return model
    return torch.compile(model, mode=None if cfg.compile.mode == "default" else cfg.compile.mode)


def data_parallel(model: torch.nn.Module, device: torch.device) -> Optional[torch.nn.Module]:
    """DDP around the model when this process is one rank of several (launch.py), else None.

    broadcast_buffers off: BERT's buffers (position ids) never change, and a broadcast per
    forward would make evaluation, where ranks run different batch counts, wait on each other.
    gradient_as_bucket_view on: each .grad is a view of DDP's all-reduce bucket, so DDP does not
    copy every averaged gradient back into .grad after the last all-reduce. That copy-back (one
    copy per parameter, ~200 for BERT-base) ran after the backward's last all-reduce on the host
    of the slowest rank: 0.7-2.2 ms per step on 2 H200s (2026-11-26, layer_timing's marks)."""
    if not distributed.active():
        return None
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    # torch 2.13 renamed the switch (and deprecated the old name); the GPU image's 2.11 has only the old.
    params = inspect.signature(DistributedDataParallel.__init__).parameters
    no_buffer_sync = {"forward_sync_buffers": False} if "forward_sync_buffers" in params else {"broadcast_buffers": False}
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                   gradient_as_bucket_view=True, **no_buffer_sync)


def dynamo_settings(cfg: Any, n_shapes: int):
    """Per-run dynamo settings (a context: nothing leaks into the next run of the process).

    - fail_on_recompile_limit_hit: past the recompile limit dynamo would otherwise run new
      shapes eagerly without a word, and the run's timings would silently mix compiled and
      eager steps. The limit is raised to cover the run's own shape set.
    - automatic_dynamic_local_pgo off: dynamo would otherwise remember, in the on-disk cache,
      which dimensions were dynamic in earlier runs, and a run's graphs would depend on what
      ran before it on this machine.
    """
    if cfg.compile.mode == "off":
        return nullcontext()
    limit = max(8, 4 * n_shapes + 8)  # train/eval x padded/unpadded per length, and slack
    return torch._dynamo.config.patch(recompile_limit=limit, accumulated_recompile_limit=max(256, 4 * limit),
                                      fail_on_recompile_limit_hit=True, automatic_dynamic_local_pgo=False)
