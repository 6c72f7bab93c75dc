"""Per-layer backward times and gradient all-reduce times, and the thesis' backprop-time
estimate from them (seed 004 sections 3.5.2 and 4.5.3; the recurrence is backprop_estimator.py).

`layer_timing=true` (off by default: the hooks and the extra steps cost time) runs, after the
last evaluation, a few forward+backward passes over training batches on the eager model (DDP
around it when the run has several ranks; no optimizer step, gradients dropped after), and:
- D_compute per layer: a layer's gradients are ready when the last of its parameters' gradient
  hooks (post-accumulate) fires; a layer's compute is the time from the previous layer's ready
  mark to its own (the first from the start of the backward). Layers in backward order: the
  head (classifier and pooler), the encoder layers from last to first, the embeddings;
- D_comm per layer: a standalone all-reduce of that layer's gradient bytes on the job's process
  group, median of a few (what the thesis' per-layer table holds); 0 on one rank;
- measured backward: start of the backward to the end of DDP's last all-reduce (DDP's
  finalizer waits for it), median over the steps.
The estimate is backprop_estimator.estimate_backward over those layers with no extra overhead
(the gaps between layers are inside the measured compute times); its error against the measured
backward is the thesis' check (0.35% on 2 GPUs). A 1-rank run's per-layer times and gradient
bytes are what predict_step_ms needs to predict N GPUs (bertaccel.predict_dp).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from bertaccel import distributed
from bertaccel.measure.backprop_estimator import LayerTimes, error_pct, estimate_backward

COMM_REPEATS = 5


@dataclass
class LayerTiming:
    name: str
    compute_ms: float
    comm_ms: float
    grad_bytes: int


@dataclass
class BackpropTiming:
    layers: List[LayerTiming]
    measured_backward_ms: float
    predicted_backward_ms: float
    error_pct: float
    world_size: int
    steps: int

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)


def layer_groups(model: torch.nn.Module) -> List[Tuple[str, List[torch.nn.Parameter]]]:
    """Trainable parameters per layer, in backward order (a BERT-for-classification model)."""
    bert = model.bert
    groups = [("head", [p for m in (model.classifier, bert.pooler) if m is not None for p in m.parameters()])]
    layers = list(bert.encoder.layer)
    groups += [(f"encoder.{i}", list(layers[i].parameters())) for i in reversed(range(len(layers)))]
    groups.append(("embeddings", list(bert.embeddings.parameters())))
    return [(name, [p for p in ps if p.requires_grad]) for name, ps in groups if any(p.requires_grad for p in ps)]


class _Marks:
    """Timestamps on the host (CPU) or CUDA events (GPU: recorded in stream order, no sync)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.start: Any = None
        self.ready: Dict[str, Any] = {}
        self.end: Any = None

    def now(self) -> Any:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def ms(self, a: Any, b: Any) -> float:
        return a.elapsed_time(b) if self.cuda else 1000 * (b - a)


def _backward_pass(step: Callable[[Dict[str, torch.Tensor]], torch.Tensor], batch: Dict[str, torch.Tensor],
                   groups: Sequence[Tuple[str, List[torch.nn.Parameter]]], device: torch.device) -> Tuple[List[float], float]:
    """One forward+backward; returns (per-layer compute ms in backward order, backward ms)."""
    marks = _Marks(device)
    handles = []
    for name, params in groups:
        for p in params:
            # The last hook of a layer to fire overwrites the earlier: its gradients' ready time.
            handles.append(p.register_post_accumulate_grad_hook(
                lambda _p, name=name: marks.ready.__setitem__(name, marks.now())))
    try:
        loss = step(batch)
        marks.start = marks.now()
        loss.backward()
        marks.end = marks.now()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    finally:
        for h in handles:
            h.remove()
    ready = [marks.ms(marks.start, marks.ready[name]) for name, _ in groups]
    compute = [ready[0]] + [max(0.0, b - a) for a, b in zip(ready, ready[1:])]
    return compute, marks.ms(marks.start, marks.end)


def allreduce_ms(n_bytes: int, device: torch.device, repeats: int = COMM_REPEATS) -> float:
    """Median time of an all-reduce of n_bytes of fp32 on the job's process group (0 on one rank)."""
    if not distributed.active():
        return 0.0
    where = device if dist.get_backend() == "nccl" else torch.device("cpu")
    buf = torch.zeros(max(1, n_bytes // 4), dtype=torch.float32, device=where)
    times = []
    for i in range(repeats + 1):  # the first is a warm-up (connection set-up, NCCL channels)
        if where.type == "cuda":
            torch.cuda.synchronize(where)
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        if where.type == "cuda":
            torch.cuda.synchronize(where)
        if i:
            times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times)


def measure(model: torch.nn.Module, step: Callable[[Dict[str, torch.Tensor]], torch.Tensor],
            batches: Iterable[Dict[str, torch.Tensor]], device: torch.device, steps: int) -> Optional[BackpropTiming]:
    """step(batch) -> loss: the run's forward (DDP model when parallel). None if no batch."""
    groups = layer_groups(model)
    computes, backwards = [], []
    for i, batch in enumerate(batches):
        if i == steps + 1:
            break
        compute, backward = _backward_pass(step, batch, groups, device)
        model.zero_grad(set_to_none=True)
        if i:  # the first pass warms up (allocator, DDP's first-iteration bucket rebuild)
            computes.append(compute)
            backwards.append(backward)
    if not computes:
        return None
    layers = []
    for j, (name, params) in enumerate(groups):
        grad_bytes = sum(p.numel() * p.element_size() for p in params)
        layers.append(LayerTiming(name, statistics.median(c[j] for c in computes), allreduce_ms(grad_bytes, device),
                                  grad_bytes))
    measured = statistics.median(backwards)
    predicted = estimate_backward([LayerTimes(x.name, x.compute_ms, x.comm_ms) for x in layers], 0.0).backward_ms
    return BackpropTiming(layers, measured, predicted, error_pct(predicted, measured), distributed.world_size(),
                          len(computes))
