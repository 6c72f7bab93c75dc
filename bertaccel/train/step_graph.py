"""compile.step_graph=true: the whole optimizer step replayed from CUDA graphs, no host work.

At batch 32 a BERT step is a few milliseconds of GPU work behind tens of milliseconds of Python
and kernel launches (forward, autograd, clipping, the optimizer); torch.compile's
reduce-overhead graphs the model but still launches the loss, clipping and update from Python.
Here everything is captured:
- one "micro" graph per padded length (and, on top of compile=off, per mask variant: a batch
  without padding runs with no mask, as forward.model_inputs does): the run's Forward.loss, the
  one the eager step calls, with n (the window's sample count) read from a device scalar, then
  the backward accumulating into gradient buffers that live outside the graphs;
- one "update" graph: gradient clipping, the optimizer step (capturable: lr and state on the
  device), gradients zeroed in place.
A window of k micro-batches is then k micro replays and one update replay; the host only copies
the batch into the graph's input buffers.

Without accumulation (every window one micro-batch: whole_step) the micro and update bodies are
captured as ONE graph per length, and the gradients are not kept in buffers of our own: the
captured backward hands its fresh gradient tensors to the parameters (autograd steals them, as in
a plain loop with zero_grad(set_to_none=True)), the update reads them, and they are dropped before
the capture ends, so every replay reuses the same memory of the graphs' pool. Accumulating into
persistent buffers costs an add kernel per parameter in every backward and a zeroing pass per
step: on BERT-base, about 400 small kernels and two passes over the gradients that a plain
CUDA-graph loop does not run. Batches have a fixed row count (filler rows), so the
length is the only shape that varies. Works on top of compile=off or compile=default (Inductor
kernels captured as they are); compile=reduce-overhead would nest graphs.

Capture needs the optimizer's state to exist and the kernels to have run once, so the step is
run eagerly on a side stream first; the weights, gradients and optimizer state are then put
back exactly as they were, so the capture leaves no trace on training.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch

from bertaccel.train.forward import Batch, Forward
from bertaccel.train.warmup import synthetic_batch


def restore_first_step(params: List[torch.Tensor], weights: List[torch.Tensor],
                       optimizer: torch.optim.Optimizer) -> None:
    """Undo warm-up steps: the weights copied back and every optimizer state tensor zeroed (exp_avg,
    exp_avg_sq, step ...: the next step is a first step again; the flat-buffer optimizers reseed
    their fp32 masters from the parameters at a first step)."""
    with torch.no_grad():
        for p, w in zip(params, weights):
            p.copy_(w)
        for state in optimizer.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    v.zero_()


class _MicroGraph:
    def __init__(self, rows: int, length: int, masked: bool, device: torch.device):
        self.ids = torch.zeros(rows, length, dtype=torch.long, device=device)
        # None: this graph is for batches without padding, run with no mask at all.
        self.mask = torch.ones(rows, length, dtype=torch.long, device=device) if masked else None
        self.labels = torch.zeros(rows, dtype=torch.long, device=device)
        self.batch: Batch = {"input_ids": self.ids, "attention_mask": self.mask, "labels": self.labels}
        self.graph: Optional[torch.cuda.CUDAGraph] = None  # made at capture (CUDA only)
        self.loss: Optional[torch.Tensor] = None

    def load(self, batch: Dict[str, torch.Tensor]) -> None:
        # Host batches are pinned (train.pin_memory): these copies do not wait for the GPU.
        self.ids.copy_(batch["input_ids"], non_blocking=True)
        if self.mask is not None:
            self.mask.copy_(batch["attention_mask"], non_blocking=True)
        self.labels.copy_(batch["labels"], non_blocking=True)


class StepGraphs:
    """whole_step: every window is one micro-batch (accumulation=1): one graph per length runs
    forward, backward and update, with fresh gradients (the module docstring says why)."""

    def __init__(self, forward: Forward, optimizer: torch.optim.Optimizer, max_grad_norm: Optional[float],
                 whole_step: bool = False):
        self.forward, self.optimizer, self.max_grad_norm = forward, optimizer, max_grad_norm
        self.whole_step = whole_step
        self.device = device = forward.device
        self.mask_variants = (True, False) if forward.drop_full_mask else (True,)  # masked?
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.n = torch.ones((), device=device)  # the window's data rows, set before each replay
        self.micro: Dict[Tuple[int, int, bool], _MicroGraph] = {}  # (rows, length, masked)
        self.update: Optional[torch.cuda.CUDAGraph] = None  # made at capture, without whole_step

    # The two bodies, run eagerly once and then captured.
    def _micro_body(self, g: _MicroGraph) -> torch.Tensor:
        loss = self.forward.loss(g.batch, self.n)
        loss.backward()
        return loss.detach()

    def _update_body(self) -> None:
        if self.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm, foreach=True)
        self.optimizer.step()
        if self.whole_step:  # the next backward makes fresh ones (in the graph: the same pool memory)
            for p in self.params:
                p.grad = None
        else:
            torch._foreach_zero_([p.grad for p in self.params])

    def _whole_body(self, g: _MicroGraph) -> torch.Tensor:
        loss = self._micro_body(g)
        self._update_body()
        return loss

    def _body(self, g: _MicroGraph) -> torch.Tensor:
        """What a graph of g's shape runs: the micro body, or with whole_step the whole step."""
        return self._whole_body(g) if self.whole_step else self._micro_body(g)

    def prepare_gradients(self) -> None:
        """Gradients as the bodies expect them: buffers outside every graph, accumulated in place
        (zeros where missing), or with whole_step none at all (the backward makes them)."""
        for p in self.params:
            if self.whole_step:
                p.grad = None
            elif p.grad is None:
                p.grad = torch.zeros_like(p)

    def capture(self, rows: int, lengths: List[int]) -> None:
        """Capture a micro graph per length and mask variant, and the update graph (whole_step: a
        whole-step graph per length and mask variant); leaves weights, gradients and optimizer
        state as they were."""
        self.prepare_gradients()
        weights = [p.detach().clone() for p in self.params]
        shape: Any = self.forward.module.config  # (torch types a module's attributes as Tensor | Module)
        vocab = int(shape.vocab_size)
        for length in lengths:
            for masked in self.mask_variants:
                g = _MicroGraph(rows, length, masked, self.device)
                g.load(synthetic_batch(rows, length, vocab, padded=masked))
                self.micro[(rows, length, masked)] = g
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # eager run first: lazy state, cuBLAS workspaces, autotuning
            for g in self.micro.values():
                self._body(g)
            if not self.whole_step:
                self._update_body()
        torch.cuda.current_stream(self.device).wait_stream(side)
        torch.cuda.synchronize(self.device)
        pool = torch.cuda.graph_pool_handle()  # replayed one at a time: one memory pool for all
        for g in self.micro.values():
            g.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g.graph, pool=pool):
                g.loss = self._body(g)
        if not self.whole_step:
            self.update = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.update, pool=pool):
                self._update_body()
        restore_first_step(self.params, weights, self.optimizer)
        if not self.whole_step:
            with torch.no_grad():
                torch._foreach_zero_([p.grad for p in self.params])
        torch.cuda.synchronize(self.device)

    def step(self, window: List[Dict[str, torch.Tensor]], n: int) -> torch.Tensor:
        """One optimizer step over a window of host batches with n data rows; the window's loss."""
        self.n.fill_(n)
        if self.whole_step and len(window) != 1:
            raise RuntimeError(f"whole-step graphs replay windows of one micro-batch, not {len(window)}")
        total = torch.zeros((), device=self.device)
        for batch in window:
            # Host batches: the padding check reads no device memory.
            masked = len(self.mask_variants) == 1 or not bool(batch["attention_mask"].all())
            key = (*batch["input_ids"].shape, masked)
            g = self.micro.get(key)
            if g is None:
                raise RuntimeError(f"no CUDA graph for batch (rows, length, masked) = {key} "
                                   f"(captured: {sorted(self.micro)})")
            g.load(batch)
            if g.graph is None or g.loss is None:  # (both set at capture for every graph in self.micro)
                raise RuntimeError(f"CUDA graph {key} was not captured")
            g.graph.replay()
            total += g.loss
        if self.update is not None:
            self.update.replay()
        return total

