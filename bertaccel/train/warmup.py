"""Compile everything a run will execute, for every shape it will meet, before its first
training window, and count what still compiles inside the windows.

What compiles per shape: torch.compile (a graph per input shape unless the length is marked
dynamic; CUDA-graph recordings per shape under mode=reduce-overhead) and our Triton attention
(a kernel variant per dtype and dropout on/off: 3 per run, attention/triton_attention.py).
Left to the training loop, those compiles land inside the timed window: measured on an H100, a
200-step compile=default sweep run reported 422 ms/step where the steady state is ~21.

The shape set is bounded by the data pipeline: batches padded to a multiple of
`train.pad_to_multiple_of` (data.PadCollator) and, on compiled paths, to a fixed number of rows
(a short last batch gets ignored rows), so the shapes are (rows, S) for the padded lengths S
that this run's rows can produce. The warm-up runs one training micro-step and one evaluation
forward per shape, through the same functions the loop calls, once with a padded row and once
without (for a batch without padding HF passes no mask at all: another kernel variant).
"""
from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Sequence

import torch
from torch import nn

from bertaccel.attention.warmup import kernel_variants

IGNORE_INDEX = -100  # label of the rows that only fill a batch up (cross_entropy ignores them)


def padded_lengths(max_length: int, multiple: int) -> List[int]:
    """Every length PadCollator can produce: multiples of `multiple` up to max_length rounded up."""
    m = max(1, int(multiple))
    top = -(-int(max_length) // m) * m
    return list(range(m, top + 1, m))


def data_lengths(row_lengths: torch.Tensor, multiple: int) -> List[int]:
    """The padded lengths batches of these rows can have: a batch is padded to its longest row
    rounded up, so only the rounded-up length of some row can occur."""
    m = max(1, int(multiple))
    return sorted({int(v) for v in torch.unique((row_lengths + m - 1) // m * m)})


@dataclass
class WarmupPlan:
    train_rows: int
    eval_rows: int
    train_lengths: List[int]
    eval_lengths: List[int]
    # Calls per shape: 1 compiles; CUDA-graph trees need a warm-up call and a recording call.
    repeats: int = 1

    def describe(self) -> str:
        def span(ls: Sequence[int]) -> str:
            return f"{len(ls)} lengths {ls[0]}..{ls[-1]}" if ls else "no lengths"
        return (f"train {self.train_rows} rows x {span(self.train_lengths)}, eval {self.eval_rows} rows x "
                f"{span(self.eval_lengths)}, padded and unpadded, {self.repeats} call(s) each")


def synthetic_batch(rows: int, length: int, vocab_size: int, padded: bool) -> Dict[str, torch.Tensor]:
    """A host batch of the given shape and the loop's dtypes (values do not matter to compiled
    code: guards and kernel variants depend on shape, dtype, strides and the mask's presence)."""
    ids = torch.randint(0, vocab_size, (rows, length))
    mask = torch.ones(rows, length, dtype=torch.long)
    if padded:
        mask[-1, length // 2 + 1:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.zeros(rows, dtype=torch.long)}


def run_warmup(model: nn.Module, plan: WarmupPlan, train_micro: Callable[[Dict[str, torch.Tensor]], object],
               eval_forward: Callable[[Dict[str, torch.Tensor]], object], device: torch.device) -> float:
    """Run every shape of the plan through the loop's own step functions; returns seconds.

    Leaves no trace: gradients cleared, train/eval mode and the RNG state (dropout draws)
    restored, no optimizer step taken."""
    was_training = model.training
    shape: Any = model.config  # (a PreTrainedModel's config; torch types attributes as Tensor | Module)
    vocab = int(shape.vocab_size)
    devices = [device] if device.type == "cuda" else []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    with torch.random.fork_rng(devices=devices):
        for length in plan.train_lengths:
            for padded in (True, False):
                batch = synthetic_batch(plan.train_rows, length, vocab, padded)
                model.train()
                for _ in range(plan.repeats):
                    train_micro(batch)
                    # Gradients are dropped after each call, as a training step drops them: under
                    # compile=reduce-overhead the first backward's gradients are the CUDA graph's
                    # own output buffers, and accumulating into them after the next replay has
                    # overwritten them fails ("accessing tensor output of CUDAGraphs that has been
                    # overwritten").
                    model.zero_grad(set_to_none=True)
        model.eval()
        for length in plan.eval_lengths:
            for padded in (True, False):
                batch = synthetic_batch(plan.eval_rows, length, vocab, padded)
                for _ in range(plan.repeats):
                    eval_forward(batch)
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def warm_first_update(update: Callable[[List[torch.Tensor]], None], params: List[torch.Tensor],
                      scaler: torch.amp.GradScaler, device: torch.device) -> float:
    """One optimizer update, the loop's own (unscale, clip, step), on zero gradients, then undone;
    returns seconds. An optimizer's first step pays one-time costs a plain loop pays in its warm-up
    steps: our fused optimizers' Triton kernel is compiled (or loaded from the run's cache) and the
    Triton driver started, flat buffers and state are allocated. On 4 H200s (2026-11-27) an eager
    run's first step took 0.4-1.8 s against a ~36 ms median, 19 % of a 196-step window.

    Undone: the weights are copied back, the gradients dropped and the scaler's scale and growth
    count put back. The optimizer's state is not: the caller replaces the optimizer with a fresh
    one (the compiled kernel stays in the process), so training starts exactly as without this."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    weights = [p.detach().clone() for p in params]
    if scaler.is_enabled():
        scaler.scale(torch.zeros((), device=device))  # its scale exists (made at its first use)
    scale = scaler.state_dict() if scaler.is_enabled() else None
    for p in params:
        p.grad = torch.zeros_like(p)
    update(params)
    with torch.no_grad():
        for p, w in zip(params, weights):
            p.copy_(w)  # (a flat-buffer optimizer re-pointed p.data at its buffer: the copy lands there)
    for p in params:
        p.grad = None
    if scale is not None:
        scaler.load_state_dict(scale)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def compiled_graph_count() -> int:
    """Graphs dynamo compiled since the last reset (recompiles for new shapes included)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def compile_events(device: torch.device) -> Dict[str, int]:
    """Compiles so far in this process since the run's reset, by kind: dynamo graphs, compiled
    variants of our Triton kernels (attention, fused encoder), and CUDA-graph recordings (reduce-overhead,
    max-autotune). Inside a training window none may move; by kind, a warning can say which."""
    return {"dynamo graphs": compiled_graph_count(),
            "Triton kernel variants": kernel_variants(),
            "CUDA-graph recordings": _cudagraph_recordings(device)}


def new_events(before: Dict[str, int], after: Dict[str, int]) -> Dict[str, int]:
    """The kinds that moved between two compile_events readings, and by how much."""
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


def _cudagraph_recordings(device: torch.device) -> int:
    # Not imported: no CUDA-graph tree was ever built in this process. Importing it to find that
    # out cost 1.9-2.1 s on an H200 host, before every compile=off run's first window.
    cudagraph_trees = sys.modules.get("torch._inductor.cudagraph_trees")
    if device.type != "cuda" or cudagraph_trees is None:
        return 0
    try:
        manager = cudagraph_trees.get_container(device.index or 0).tree_manager
    except Exception:  # noqa: BLE001 - no tree manager yet (or another torch layout): nothing recorded
        return 0
    if manager is None:
        return 0
    # graph_counter is an itertools.count: its repr is the next id, i.e. the graphs recorded.
    match = re.search(r"\d+", repr(manager.graph_counter))
    return int(match.group()) if match else 0
