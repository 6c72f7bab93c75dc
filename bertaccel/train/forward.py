"""The model's forward and the training loss, written once: `Forward`.

The step (step.accumulate_window), the step graph (step_graph.StepGraphs), evaluation
(step.eval_batch), layer timing (events.LayerTiming) and batch fitting (batch_fit.training_step)
all run the model through one `Forward`, so what the warm-up compiles and the step graph
captures is what the loop runs. It holds what a forward depends on besides the batch: the
callable that runs (the compiled model, DDP or the module), the module behind it, the precision
(autocast), the attention context (SDPA backends), the mask policy and the device.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Dict, Mapping, Optional, Union

import torch
import torch.nn.functional as F

from bertaccel.config import RunConfig
from bertaccel.attention.option import is_sdpa
from bertaccel.options.compile import compiles, uses_cuda_graphs
from bertaccel.options.precision import Precision
from bertaccel.train.warmup import IGNORE_INDEX

Batch = Dict[str, Optional[torch.Tensor]]
AttentionContext = Callable[[], ContextManager[object]]  # entered around every forward


def sdpa_backends(cfg: RunConfig) -> AttentionContext:
    """Context restricting torch SDPA to the configured backends (no-op when none are set)."""
    names = list(cfg.attention.sdpa_backends) if is_sdpa(cfg.attention) else []
    if not names:
        return nullcontext
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = [getattr(SDPBackend, n) for n in names]
    return lambda: sdpa_kernel(backends)


def labels_of(batch: Mapping[str, Optional[torch.Tensor]]) -> torch.Tensor:
    """A host or device batch's labels (a device `Batch` may lack its mask, never its labels)."""
    labels = batch["labels"]
    if labels is None:  # (model_inputs keeps the labels; only the mask may be dropped)
        raise ValueError("a training batch without labels")
    return labels


def real_rows(batch: Mapping[str, Optional[torch.Tensor]]) -> int:
    """Rows that are data (compiled runs fill a short batch up with ignored rows: warmup.py)."""
    return int((labels_of(batch) != IGNORE_INDEX).sum())


def mark_length_dynamic(batch: Batch) -> None:
    """One compiled graph for every padded length: dim 1 symbolic instead of a graph per length.
    maybe_: where the model's code specializes on the length, dynamo keeps it static instead of
    failing, and the warm-up then simply compiles one graph per length."""
    for key in ("input_ids", "attention_mask"):
        if batch[key] is not None:  # no mask: the batch has no padding (model_inputs)
            torch._dynamo.maybe_mark_dynamic(batch[key], 1)


def model_inputs(host_batch: Dict[str, torch.Tensor], device: torch.device, drop_full_mask: bool = True) -> Batch:
    """The batch on the device; drop_full_mask: attention_mask None where the batch has no padding.

    An all-ones mask means "attend everywhere", exactly what no mask means. Eager Hugging Face
    drops it itself, but by reading the device mask (a host sync per forward); here the check is
    made on the host batch before the copy. Compiled runs keep the mask (Forward.for_run): the
    no-mask variant is the one SDPA could run as flash attention, but on an H200 (torch 2.11)
    Inductor's compile of that variant hung in async_compile.wait and never returned."""
    mask = host_batch["attention_mask"]
    unpadded = drop_full_mask and mask.device.type == "cpu" and bool(mask.all())
    batch: Batch = {key: t.to(device, non_blocking=True) for key, t in host_batch.items() if key != "attention_mask"}
    batch["attention_mask"] = None if unpadded else mask.to(device, non_blocking=True)
    return batch


class Forward:
    """model: what runs (torch.compile's callable, DDP, or the module); module: the nn.Module
    behind it (train/eval mode, parameters, config). drop_full_mask: model_inputs' mask policy.
    dynamic_length: compiled runs with one graph for every length (mark_length_dynamic)."""

    def __init__(self, model: Callable[..., Any], precision: Precision, device: torch.device,
                 attention_ctx: AttentionContext = nullcontext, drop_full_mask: bool = True,
                 dynamic_length: bool = False, module: Optional[torch.nn.Module] = None) -> None:
        self.model, self.precision, self.device, self.attention_ctx = model, precision, device, attention_ctx
        self.drop_full_mask, self.dynamic_length = drop_full_mask, dynamic_length
        if module is None:  # (without module=, what runs is the nn.Module itself)
            if not isinstance(model, torch.nn.Module):
                raise TypeError("Forward: give module= when model is not the nn.Module itself")
            module = model
        self.module: torch.nn.Module = module

    @classmethod
    def for_run(cls, cfg: RunConfig, module: torch.nn.Module, model: Callable[..., Any], precision: Precision,
                device: torch.device) -> "Forward":
        """The run's forward: compiled runs keep every mask (model_inputs says why); a compiled run
        without CUDA graphs marks the length dynamic when compile.dynamic_length asks."""
        compiled = compiles(cfg.compile)
        # A CUDA-graph mode records a graph per concrete shape anyway; a dynamic-length graph
        # underneath only adds symbolic-size kernels (and failed in cudagraph trees on an H200).
        dynamic = compiled and not uses_cuda_graphs(cfg.compile.mode) and bool(cfg.compile.dynamic_length)
        return cls(model, precision, device, sdpa_backends(cfg), drop_full_mask=not compiled, dynamic_length=dynamic,
                   module=module)

    def through(self, model: Callable[..., Any]) -> "Forward":
        """The same forward run through another callable of the same module (layer timing: the
        eager model, whose hooks compile and CUDA graphs would not keep); no dynamic marking."""
        return Forward(model, self.precision, self.device, self.attention_ctx, self.drop_full_mask, False, self.module)

    def inputs(self, host_batch: Dict[str, torch.Tensor]) -> Batch:
        """A host batch on the device, by the mask policy (and marked dynamic where asked)."""
        batch = model_inputs(host_batch, self.device, self.drop_full_mask)
        if self.dynamic_length:
            mark_length_dynamic(batch)
        return batch

    def logits(self, batch: Batch) -> torch.Tensor:
        """The model's logits for a device batch, under the precision's autocast and the attention context."""
        with self.precision.autocast(), self.attention_ctx():
            logits: torch.Tensor = self.model(input_ids=batch["input_ids"],
                                              attention_mask=batch["attention_mask"]).logits
            return logits

    def loss(self, batch: Batch, n: Union[int, torch.Tensor]) -> torch.Tensor:
        """The cross entropy summed over the batch's data rows (filler rows, label IGNORE_INDEX,
        add nothing) and divided by n, the rows of the whole window, so that a window of
        micro-batches has the gradient of one batch of n rows.

        n: a number, or a device tensor holding it (a CUDA graph reads it per replay). CUDA divides
        a tensor by a Python number as a multiplication by the number's reciprocal; a device n is
        applied the same way, so a captured step computes the bits an eager one does."""
        labels = labels_of(batch)
        summed = F.cross_entropy(self.logits(batch).float(), labels, reduction="sum",
                                 ignore_index=IGNORE_INDEX)
        return summed * torch.reciprocal(n) if isinstance(n, torch.Tensor) else summed / n
