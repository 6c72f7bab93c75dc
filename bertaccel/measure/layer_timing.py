"""Per-layer backward times and gradient all-reduce times, and the thesis' backprop-time
estimate from them (seed 004 sections 3.5.2 and 4.5.3; the recurrences are backprop_estimator.py).

`layer_timing=true` (off by default: the hooks and the extra steps cost time) runs, after the
last evaluation, a few forward+backward passes over training batches on the eager model (DDP
around it when the run has several ranks; no optimizer step, gradients dropped after). Every
rank enters each pass together (a small all-reduce, then the host waits for its device), so
the ranks' times share one clock: the pass's start. It records:
- D_compute per layer: a layer's gradients are ready when the last of its parameters' gradient
  hooks (post-accumulate) fires; a layer's compute is the time from the previous layer's ready
  mark to its own (the first from the start of the backward). Layers in backward order: the
  head (classifier and pooler), the encoder layers from last to first, the embeddings;
- D_comm per layer: a standalone all-reduce of that layer's gradient bytes on the job's process
  group, median of a few (what the thesis' per-layer table holds); 0 on one rank;
- under DDP, what DDP actually all-reduces: its gradient buckets (25 MiB each by default, cut
  across layers), in launch order, through a comm hook that does what DDP's default does
  (divide by the world size, all-reduce) and marks when each bucket was handed over and when
  its all-reduce ended; each bucket's standalone all-reduce time;
- every rank's forward time and its buckets' ready marks (gathered to rank 0);
- measured backward: start of the backward to the end of DDP's last all-reduce (DDP's
  finalizer waits for it), median over the passes, on rank 0.

Two estimates are logged. The thesis' (`backward_predicted_thesis_ms`): estimate_backward over
rank 0's layers, as in section 4.5.3. It assumes every rank is rank 0 and that the all-reduce
unit is a layer; at 4 ranks it missed by 24 % on an H200 host. The model (the logged
`backward_predicted_ms`): estimate_backward_ranks over DDP's buckets with every rank's compute
chain started at its own backward start, so a collective waits for the last rank's bucket,
applied pass by pass (the slowest rank changes from pass to pass) and the median taken.
A 1-rank run's per-layer times and gradient bytes are what predict_step_ms needs to predict N
GPUs (bertaccel.plan.predict_dp).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from bertaccel import distributed
from bertaccel.attention.hf_model import HFModule
from bertaccel.measure.backprop_estimator import LayerTimes, error_pct, estimate_backward, estimate_backward_ranks

if TYPE_CHECKING:
    from torch.nn.parallel import DistributedDataParallel

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
    predicted_thesis_ms: float = 0.0     # the thesis' estimate: rank 0's layers, standalone comm
    thesis_error_pct: float = 0.0
    buckets: List[Dict[str, Any]] = field(default_factory=list)   # DDP's buckets, launch order
    forward_ms_by_rank: List[float] = field(default_factory=list)
    backward_ms_by_rank: List[float] = field(default_factory=list)
    predicted_by_pass_ms: List[float] = field(default_factory=list)
    measured_by_pass_ms: List[float] = field(default_factory=list)
    # DDP's last all-reduce's end per pass: what follows it to the backward's end is DDP's
    # finalize (averaged gradients copied from the buckets into .grad) and the host's return.
    allreduce_end_by_pass_ms: List[float] = field(default_factory=list)

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)


def layer_groups(model: HFModule) -> List[Tuple[str, List[torch.nn.Parameter]]]:
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


class _BucketMarks:
    """DDP comm hook: DDP's default all-reduce (mean over ranks), with a mark when each bucket is
    handed over (its gradients are ready, in stream order) and when its all-reduce is done.
    Marks go to the pass being timed (self.marks); outside a timed pass it only all-reduces."""

    def __init__(self, names_of: Dict[int, str]):
        self.names_of = names_of    # id(parameter) -> its layer's name
        self.marks: Optional[_Marks] = None
        self.buckets: List[Dict[str, Any]] = []

    # No annotations: DDP checks the hook's (as strings here, under __future__ annotations); the
    # work, typed, is all_reduce's.
    def hook(self, state, bucket):  # noqa: ANN001, ANN201 - DDP's comm hook signature
        return self.all_reduce(bucket)

    def all_reduce(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """The bucket's mean over the ranks, marked when handed over and when done."""
        buffer = bucket.buffer()
        world = dist.get_world_size()
        marks = self.marks
        record: Optional[Dict[str, Any]] = None
        if marks is not None:
            layers = []
            for p in bucket.parameters():
                name = self.names_of.get(id(p), "frozen")
                if name not in layers:
                    layers.append(name)
            record = {"index": bucket.index(), "ready": marks.now(), "layers": layers,
                      "grad_bytes": buffer.numel() * buffer.element_size()}
            self.buckets.append(record)
        fut = dist.all_reduce(buffer.div_(world), async_op=True).get_future()

        def done(f: torch.futures.Future[List[torch.Tensor]]) -> torch.Tensor:
            # On NCCL this runs with a stream that waits for the all-reduce: the mark is its end.
            if record is not None and marks is not None:  # (a record is made only with marks)
                record["done"] = marks.now()
            return f.value()[0]
        return fut.then(done)


def _timed_pass(loss_of: Callable[[Dict[str, torch.Tensor]], torch.Tensor], batch: Dict[str, torch.Tensor],
                groups: Sequence[Tuple[str, List[torch.nn.Parameter]]], device: torch.device,
                buckets: Optional[_BucketMarks]) -> Dict[str, Any]:
    """One forward+backward, every rank starting it together; times in ms from the pass's start."""
    marks = _Marks(device)
    handles = []
    for name, params in groups:
        for p in params:
            # The last hook of a layer to fire overwrites the earlier: its gradients' ready time.
            handles.append(p.register_post_accumulate_grad_hook(
                lambda _p, name=name: marks.ready.__setitem__(name, marks.now())))
    if buckets is not None:
        buckets.marks, buckets.buckets = marks, []
    try:
        # Every rank starts here together (the hooks are in place first: their set-up is not
        # counted as a rank's forward).
        distributed.start_together(device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the host leaves the all-reduce when every rank has
        t0 = marks.now()
        loss = loss_of(batch)
        marks.start = marks.now()
        loss.backward()
        marks.end = marks.now()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    finally:
        for h in handles:
            h.remove()
        if buckets is not None:
            buckets.marks = None
    ready = [marks.ms(marks.start, marks.ready[name]) for name, _ in groups]
    out: Dict[str, Any] = {
        "forward_ms": marks.ms(t0, marks.start),
        "backward_ms": marks.ms(marks.start, marks.end),
        "layer_compute_ms": _intervals(ready),
    }
    if buckets is not None:
        out["buckets"] = [{"index": b["index"], "layers": b["layers"], "grad_bytes": b["grad_bytes"],
                           "ready_ms": marks.ms(marks.start, b["ready"]),
                           "done_ms": marks.ms(marks.start, b["done"])} for b in buckets.buckets]
    return out


def _intervals(ready_ms: Sequence[float]) -> List[float]:
    """Each piece's compute from the ready marks (ms from the backward's start), in order: the
    first from the start, each later one from the mark before it (never negative)."""
    return [ready_ms[0]] + [max(0.0, b - a) for a, b in zip(ready_ms, ready_ms[1:])]


def _bucket_estimate(passes: Sequence[Sequence[Dict[str, Any]]], comm_ms: Sequence[float]) -> List[float]:
    """estimate_backward_ranks over DDP's buckets for each pass: passes[k][r] is rank r's record
    of pass k. A bucket's compute on a rank is the time from its previous bucket's ready mark
    (_intervals, as a layer's)."""
    out = []
    for ranks in passes:
        chains, starts = [], []
        for rec in ranks:
            compute = _intervals([b["ready_ms"] for b in rec["buckets"]])
            chains.append([LayerTimes(f"bucket{i}", c, comm) for i, (c, comm) in enumerate(zip(compute, comm_ms))])
            starts.append(rec["forward_ms"])
        out.append(estimate_backward_ranks(chains, starts, 0.0).backward_ms)
    return out


def measure(model: HFModule, loss_of: Callable[[Dict[str, torch.Tensor]], torch.Tensor],
            batches: Iterable[Dict[str, torch.Tensor]], device: torch.device, steps: int,
            parallel: Optional[DistributedDataParallel] = None) -> Optional[BackpropTiming]:
    """loss_of(batch) -> loss: the run's forward and loss (train.forward.Forward.loss) through the
    eager model (through `parallel`, the DDP model, when there are several ranks). None if no
    batch. Every rank calls it; rank 0's result is the one logged."""
    groups = layer_groups(model)
    buckets = None
    if parallel is not None and distributed.active():
        buckets = _BucketMarks({id(p): name for name, ps in groups for p in ps})
        # Registered once, after training (the profiler's window, if any, ran before): the
        # hook does DDP's default all-reduce, so nothing else changes for what follows.
        parallel.register_comm_hook(None, buckets.hook)
    passes = []
    for i, batch in enumerate(batches):
        if i == steps + 1:
            break
        rec = _timed_pass(loss_of, batch, groups, device, buckets)
        model.zero_grad(set_to_none=True)
        if i:  # the first pass warms up (allocator, DDP's first-iteration bucket rebuild)
            passes.append(rec)
    if not passes:
        return None
    # Every rank ran the same number of passes (equal shares of the training batches).
    every_rank = _gather(passes)
    layers = []
    for j, (name, params) in enumerate(groups):
        grad_bytes = sum(p.numel() * p.element_size() for p in params)
        layers.append(LayerTiming(name, statistics.median(p["layer_compute_ms"][j] for p in passes),
                                  allreduce_ms(grad_bytes, device), grad_bytes))
    measured = statistics.median(p["backward_ms"] for p in passes)
    thesis = estimate_backward([LayerTimes(x.name, x.compute_ms, x.comm_ms) for x in layers], 0.0).backward_ms
    bucket_rows: List[Dict[str, Any]] = []
    if buckets is not None:
        first = passes[0]["buckets"]
        comm = [allreduce_ms(b["grad_bytes"], device) for b in first]
        per_pass = _bucket_estimate(list(zip(*every_rank)), comm)
        predicted = statistics.median(per_pass)
        for i, b in enumerate(first):
            bucket_rows.append({
                "index": b["index"], "layers": b["layers"], "grad_bytes": b["grad_bytes"], "comm_ms": comm[i],
                "ready_ms_by_rank": [statistics.median(p["buckets"][i]["ready_ms"] for p in rank_passes)
                                     for rank_passes in every_rank],
                "done_ms": statistics.median(p["buckets"][i]["done_ms"] for p in passes)})
    else:  # one rank: the thesis' recurrence over each pass's own layer times
        per_pass = [estimate_backward([LayerTimes(x.name, c, x.comm_ms) for x, c in zip(layers, p["layer_compute_ms"])],
                                      0.0).backward_ms for p in passes]
        predicted = thesis
    return BackpropTiming(
        layers, measured, predicted, error_pct(predicted, measured), distributed.world_size(), len(passes),
        predicted_thesis_ms=thesis, thesis_error_pct=error_pct(thesis, measured), buckets=bucket_rows,
        forward_ms_by_rank=[statistics.median(p["forward_ms"] for p in rp) for rp in every_rank],
        backward_ms_by_rank=[statistics.median(p["backward_ms"] for p in rp) for rp in every_rank],
        predicted_by_pass_ms=per_pass, measured_by_pass_ms=[p["backward_ms"] for p in passes],
        allreduce_end_by_pass_ms=[max(b["done_ms"] for b in p["buckets"]) for p in passes] if buckets else [])


def _gather(passes: List[Dict[str, Any]]) -> List[List[Dict[str, Any]]]:
    """Every rank's pass records, in rank order (just this rank's on one rank)."""
    if not distributed.active():
        return [passes]
    out: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, passes)
    return out
