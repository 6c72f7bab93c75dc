"""The optimizer step (`Step`) and its pieces, apart from the epoch loop that runs them
(train/loop.py): windows of micro-batches, a window's accumulated forward+backward, an
evaluation batch, and the per-run wrappers around the model (torch.compile, DDP, dynamo
settings). The model runs through the run's `Forward` (forward.py) everywhere.

The warm-up (warmup.py) runs the same methods the loop runs, so what it compiles is what
the loop will execute.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Dict, Iterable, Iterator, List, Optional, Union

import torch

from bertaccel import distributed
from bertaccel.config import RunConfig
from bertaccel.attention.option import jit_compiles
from bertaccel.encoder.option import is_fused
from bertaccel.options.compile import compiles, torch_compile_mode, uses_cuda_graphs
from bertaccel.measure.step_clock import PhaseClock
from bertaccel.options.accumulation import GradVariance
from bertaccel.options.optimizer import build_optimizer
from bertaccel.train.accumulation import Accumulation
from bertaccel.train.forward import Forward, labels_of, real_rows
from bertaccel.train.result import TrainResult
from bertaccel.train.state import Callback, Run, Window
from bertaccel.train.step_graph import StepGraphs
from bertaccel.train.warmup import IGNORE_INDEX

if TYPE_CHECKING:
    from torch.nn.parallel import DistributedDataParallel

NoSync = Callable[[], ContextManager[object]]  # DDP's no_sync, or nullcontext with one rank


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


def accumulate_window(forward: Forward, window: List[Dict[str, torch.Tensor]],
                      no_sync: NoSync = nullcontext,
                      phases: Optional[PhaseClock] = None,
                      grad_variance: Optional[GradVariance] = None) -> torch.Tensor:
    """Forward+backward over one window of host batches; returns the window's mean loss (detached).

    Each micro-batch's summed loss is divided by the window's sample count n (Forward.loss), so
    the gradient equals that of one batch of n samples. With k equal micro-batches of b that is
    the usual mean/k scaling; a partial last micro-batch or window is weighted exactly, not by 1/k.
    Filler rows (label IGNORE_INDEX) add nothing to the loss, its gradient or n.
    no_sync: data parallel, DDP's no_sync: the gradient all-reduce runs once, in the window's last
    backward, not after every micro-batch.
    Under data parallel n is this rank's count and DDP averages over the ranks: the gradient of
    the global batch when ranks have equal counts (every full step; see data.shard).
    phases: marks the forward/backward boundaries of the one-step breakdown (step_clock.py).
    grad_variance: accumulation=adaptive, sees each micro-batch's gradient (options/accumulation.py).
    """
    n = sum(real_rows(b) for b in window)
    total = torch.zeros((), device=forward.device)
    scaler = forward.precision.scaler
    for i, host_batch in enumerate(window):
        batch = forward.inputs(host_batch)
        with (no_sync() if i < len(window) - 1 else nullcontext()):
            loss = forward.loss(batch, n)
            if phases is not None:
                phases.forward_done()
            scaler.scale(loss).backward()
            if phases is not None:
                phases.backward_done()
            if grad_variance is not None:
                grad_variance.after_backward(real_rows(batch), n)
        total += loss.detach()
    return total


def eval_batch(forward: Forward, host_batch: Dict[str, torch.Tensor]) -> torch.Tensor:
    """Correct predictions among the host batch's data rows (a device scalar: no host sync)."""
    batch = forward.inputs(host_batch)
    with torch.no_grad():
        logits = forward.logits(batch)
    labels = labels_of(batch)
    return ((logits.argmax(-1) == labels) & (labels != IGNORE_INDEX)).sum()


@torch.no_grad()
def evaluate(forward: Forward, loader: Iterable[Dict[str, torch.Tensor]]) -> float:
    """Test accuracy, through the run's forward (a compiled one's eval graphs were warmed up too)."""
    forward.module.eval()
    correct = torch.zeros((), dtype=torch.long, device=forward.device)
    seen = 0
    for batch in loader:
        correct += eval_batch(forward, batch)
        seen += real_rows(batch)
    forward.module.train()
    # Data parallel: each rank saw its share of the test split (data.make_loader); the accuracy
    # is over the whole split.
    correct_all, seen_all = distributed.sum_across([int(correct), seen], forward.device)
    return correct_all / seen_all


class Step(Callback):
    """The optimizer step over a window, through the run's Forward; the same forward/backward
    serves the warm-up and evaluation (what is compiled is what runs). It owns the optimizer
    (renew_optimizer) and, under compile.step_graph, the step's CUDA graphs (capture_graphs);
    event objects ask it for them rather than set them. As an event object it follows the
    parameters trainable each epoch and keeps the one-step phase clock for the window only."""

    def __init__(self, cfg: RunConfig, forward: Forward, no_sync: NoSync, accumulation: Accumulation,
                 result: TrainResult, base_lr: float) -> None:
        self.cfg, self.forward, self.no_sync = cfg, forward, no_sync
        self.precision = forward.precision
        self.accumulation, self.result = accumulation, result
        self.base_lr = base_lr  # the optimizer's lr when built; LrSchedule scales it per step
        # Per step: a plain value, not an OmegaConf read (~20 Python calls each) a plain loop does not pay.
        self.max_grad_norm = cfg.optimizer.max_grad_norm
        # compile=reduce-overhead with accumulation: the first micro-batch's gradients would be the
        # CUDA graph's output buffers, overwritten by the next micro-batch's replay before autograd
        # adds to them. Gradients in buffers of our own (zeroed, not freed, per step) make autograd
        # add into them in place. Without accumulation the optimizer reads them before any replay.
        self.graph_grad_buffers = uses_cuda_graphs(cfg.compile.mode) and accumulation.first > 1
        self.optimizer: Optional[torch.optim.Optimizer] = None
        self.trainable_params: List[torch.Tensor] = []
        self.graphs: Optional[StepGraphs] = None  # compile.step_graph: captured once the optimizer exists
        self.phases: Optional[PhaseClock] = None  # the current window's one-step breakdown

    def renew_optimizer(self) -> None:
        """The run's optimizer over the parameters trainable now, with fresh state."""
        self.optimizer = build_optimizer(self.forward.module, self.cfg.optimizer,
                                         capturable=self.cfg.compile.step_graph, lr=self.base_lr)

    def built_optimizer(self) -> torch.optim.Optimizer:
        """The optimizer renew_optimizer built (the loop builds it before its first step)."""
        if self.optimizer is None:
            raise RuntimeError("Step: no optimizer yet (renew_optimizer builds it before the first step)")
        return self.optimizer

    def capture_graphs(self, rows: int, lengths: List[int]) -> None:
        """compile.step_graph: the whole step captured per length (step_graph.py), over the
        optimizer built so far; the loop's steps replay them from then on."""
        # accumulation=1: forward, backward and update in one graph per length, fresh gradients
        self.graphs = StepGraphs(self.forward, self.built_optimizer(), self.max_grad_norm,
                                 whole_step=self.accumulation.first == 1)
        self.graphs.capture(rows, lengths)

    def __call__(self, window: List[Dict[str, torch.Tensor]]) -> torch.Tensor:
        """Forward+backward over one window, then the update; returns the window's mean loss."""
        if self.graphs is not None:
            return self.graphs.step(window, sum(real_rows(b) for b in window))
        if self.phases is not None:
            self.phases.begin_step()
        variance = self.accumulation.variance(self.trainable_params)
        window_loss = accumulate_window(self.forward, window, self.no_sync, self.phases, variance)
        if variance is not None:
            self.accumulation.after_window(variance, window, self.precision, self.result)
        self.update(self.trainable_params)
        if self.phases is not None:
            self.phases.step_done()
        return window_loss

    def update(self, params: List[torch.Tensor]) -> None:
        """Clip, step, zero: the update after a window's backward (also the warm-up's first update)."""
        scaler, optimizer = self.precision.scaler, self.built_optimizer()
        if self.max_grad_norm:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=not self.graph_grad_buffers)

    def micro(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        """One micro-batch's forward+backward, no update (the warm-up)."""
        return accumulate_window(self.forward, [batch])

    def eval_forward(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        return eval_batch(self.forward, batch)

    def evaluate(self, loader: Any) -> float:
        return evaluate(self.forward, loader)

    def epoch_start(self, run: Run, epoch: int) -> None:
        self.trainable_params = [p for p in self.forward.module.parameters() if p.requires_grad]
        if self.graph_grad_buffers:
            for p in self.trainable_params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)

    def window_start(self, run: Run, win: Window) -> None:
        self.phases = PhaseClock(self.forward.device)

    def window_end(self, run: Run, win: Window) -> None:
        win.phases, self.phases = self.phases, None  # the profiler window after training is not timed


def uses_fixed_shapes(cfg: RunConfig) -> bool:
    """Compiled runs pad every batch to a fixed row count, so the batch dimension never
    changes and the shape set is just the padded lengths (eager runs gain nothing from it)."""
    return compiles(cfg.compile) or cfg.compile.step_graph


def uses_triton(cfg: RunConfig, device_type: str) -> bool:
    """Our Triton kernels JIT-compile (or load) per run: attention=triton's, and encoder=fused's."""
    return (jit_compiles(cfg.attention) or is_fused(cfg.encoder)) and device_type == "cuda"


def compiles_anything(cfg: RunConfig, device_type: str) -> bool:
    """Whether a run has a warm-up to compile: torch.compile, our Triton kernels, step graphs."""
    return compiles(cfg.compile) or uses_triton(cfg, device_type) or bool(cfg.compile.step_graph)


def compile_model(model: torch.nn.Module, cfg: RunConfig) -> Callable[..., Any]:
    if not compiles(cfg.compile):
        return model
    return torch.compile(model, mode=torch_compile_mode(cfg.compile))


def data_parallel(model: torch.nn.Module, device: torch.device) -> Optional[DistributedDataParallel]:
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
    device_ids = [device.index] if device.type == "cuda" else None
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters:
        return DistributedDataParallel(model, device_ids=device_ids, gradient_as_bucket_view=True,
                                       forward_sync_buffers=False)
    return DistributedDataParallel(model, device_ids=device_ids, gradient_as_bucket_view=True, broadcast_buffers=False)


def dynamo_settings(cfg: RunConfig, n_shapes: int) -> ContextManager[object]:
    """Per-run dynamo settings (a context: nothing leaks into the next run of the process).

    - fail_on_recompile_limit_hit: past the recompile limit dynamo would otherwise run new
      shapes eagerly without a word, and the run's timings would silently mix compiled and
      eager steps. The limit is raised to cover the run's own shape set.
    - automatic_dynamic_local_pgo off: dynamo would otherwise remember, in the on-disk cache,
      which dimensions were dynamic in earlier runs, and a run's graphs would depend on what
      ran before it on this machine.
    """
    if not compiles(cfg.compile):
        return nullcontext()
    limit = max(8, 4 * n_shapes + 8)  # train/eval x padded/unpadded per length, and slack
    # (dynamo's config is a module of dynamic attributes: its patch() is untyped, a context manager)
    settings: ContextManager[object] = torch._dynamo.config.patch(
        recompile_limit=limit, accumulated_recompile_limit=max(256, 4 * limit),
        fail_on_recompile_limit_hit=True, automatic_dynamic_local_pgo=False)
    return settings
