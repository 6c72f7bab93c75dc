"""Data-parallel backward time, estimated layer by layer from compute and communication times.

This is the iterative estimator of the thesis' section 3.5.2 ("Backpropagation Time
Estimation", Table 3.4 and its pseudo-code), checked there in section 4.5.3 against
Tables 4.11 (2 GPUs) and 4.12 (4 GPUs). Pure functions, no torch.

The model (the thesis' rules, in the thesis' names):
  * The backward runs the layers one after another, in backward order (the classifier
    first, the embedding last). The first layer starts at T_start = 0 and the
    communication channel is idle then (T_previous = 0).
  * A layer's compute ends at T_compute = T_start + D_compute; the next layer's compute
    starts right after it, plus a fixed gap: T_start(next) = T_compute + Overhead.
  * A layer's gradient all-reduce starts when both its compute is done and the channel is
    free, i.e. when the previous layer's all-reduce is done (one collective at a time, in
    launch order, as NCCL runs them on one stream):
        T_done = max(T_compute, T_previous) + D_comm,   T_previous(next) = T_done
  * The backward is over when the last layer's all-reduce is done: backward = T_done of the
    last layer. (The pseudo-code prints T_previous of a "last layer" it does not compute: a
    sentinel one past the real layers, whose T_previous is the real last layer's T_done.)

Assumptions this inherits: the compute of a layer is not slowed by the all-reduces running
beside it (on a GPU they share SMs and memory bandwidth), a layer's time does not depend on
its neighbours, and the overhead between two layers is one constant. The thesis gives no
value for the overhead; 0.09 ms reproduces both of its calculated times (see
THESIS_OVERHEAD_MS).

Beyond the thesis, predict_step_ms builds the communication times from a 1-GPU run and a
measured all-reduce bus bandwidth (ring all-reduce cost) so the step time on N GPUs can be
predicted before running on N GPUs; its assumptions are in its docstring.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import Sequence, Tuple

# The overhead between two layers that reproduces the thesis' calculated backward times
# (134.853 ms on 2 GPUs, 166.27 ms on 4 GPUs, section 4.5.3) from Tables 4.11/4.12 with the
# 12 encoders of BERT-base. The thesis does not state it: it is solved from the 2-GPU result
# (the backward is communication bound there, so the total is linear in the overhead with
# slope 1) and the same value then gives the 4-GPU result to the thesis' last digit.
THESIS_OVERHEAD_MS = 0.09


def _check_finite(what: str, value: object) -> float:
    """A point in time: a real number (not a bool), finite; it may be negative."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{what} must be a number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{what} must be finite, got {value}")
    return value


def _check_time(what: str, value: object) -> float:
    """A duration (or a byte count): a point in time (_check_finite) that is not negative."""
    value = _check_finite(what, value)
    if value < 0:
        raise ValueError(f"{what} must not be negative, got {value}")
    return value


@dataclass(frozen=True)
class LayerTimes:
    """One backward task's inputs: its compute time and its gradient all-reduce time, in ms.

    A "layer" is whatever is all-reduced as one piece: a layer in the thesis' tables, a DDP
    gradient bucket when modelling PyTorch DDP.
    """
    name: str
    compute_ms: float
    comm_ms: float

    def __post_init__(self) -> None:
        # Validated here so a bad row fails where it is written, not deep in the recurrence.
        if not isinstance(self.name, str):
            raise TypeError(f"layer name must be a str, got {type(self.name).__name__}")
        object.__setattr__(self, "compute_ms", _check_time(f"compute_ms of layer {self.name!r}", self.compute_ms))
        object.__setattr__(self, "comm_ms", _check_time(f"comm_ms of layer {self.name!r}", self.comm_ms))


@dataclass(frozen=True)
class LayerTimeline:
    """When one layer's work happened in the estimate, all in ms from the backward's start."""
    name: str
    start_ms: float         # T_start: its compute starts
    compute_end_ms: float   # T_compute: its compute ends
    comm_start_ms: float    # max(T_compute, T_previous): its all-reduce gets the channel
    comm_done_ms: float     # T_done: its all-reduce ends

    @property
    def comm_wait_ms(self) -> float:
        """How long its gradient waited for the channel after its compute ended."""
        return self.comm_start_ms - self.compute_end_ms


@dataclass(frozen=True)
class BackwardEstimate:
    layers: Tuple[LayerTimeline, ...]   # in backward order, as given
    backward_ms: float                  # predicted backward time: the last all-reduce's end

    @property
    def compute_end_ms(self) -> float:
        """When the last layer's compute ends: the backward's length without communication."""
        return self.layers[-1].compute_end_ms

    @property
    def exposed_comm_ms(self) -> float:
        """Communication not hidden behind compute: what data parallelism adds to the backward."""
        return self.backward_ms - self.compute_end_ms


def estimate_backward(layers: Sequence[LayerTimes], overhead_ms: float) -> BackwardEstimate:
    """The thesis' iterative estimate (section 3.5.2) of the data-parallel backward time.

    layers: in backward order (the layer whose backward runs first comes first).
    overhead_ms: the gap between one layer's compute ending and the next one's starting
    (THESIS_OVERHEAD_MS reproduces the thesis' results).
    """
    overhead_ms = _check_time("overhead_ms", overhead_ms)
    layers = tuple(layers)
    if not layers:
        raise ValueError("layers is empty: the backward needs at least one layer")
    for layer in layers:
        if not isinstance(layer, LayerTimes):
            raise TypeError(f"layers must hold LayerTimes, got {type(layer).__name__}")

    timeline = []
    start_ms = 0.0      # T_0^start = 0: the backward starts at time zero
    previous_ms = 0.0   # T_0^previous = 0: the channel is idle at the start
    for layer in layers:
        compute_end_ms = start_ms + layer.compute_ms
        # The all-reduce needs this layer's gradient and the channel the previous one held.
        comm_start_ms = max(compute_end_ms, previous_ms)
        comm_done_ms = comm_start_ms + layer.comm_ms
        timeline.append(LayerTimeline(layer.name, start_ms, compute_end_ms, comm_start_ms, comm_done_ms))
        start_ms = compute_end_ms + overhead_ms
        previous_ms = comm_done_ms
    # The channel serialises the all-reduces, so the last one ends last (T_done never
    # decreases along the list): the backward is done when it is.
    return BackwardEstimate(layers=tuple(timeline), backward_ms=previous_ms)


def estimate_backward_ranks(ranks: Sequence[Sequence[LayerTimes]], starts_ms: Sequence[float],
                            overhead_ms: float) -> BackwardEstimate:
    """The thesis' estimate with every rank in it: an all-reduce is one collective all ranks enter.

    The thesis' recurrence has one GPU's compute: it holds when every rank is as fast as the one
    timed. A collective starts only when the last rank's gradient is ready, so a rank whose
    backward starts later (a longer forward, a host that launched late) or whose layer is
    slower holds up every all-reduce after it, and the timed rank waits at its last one:
        T_comm_start(l) = max(max over ranks r of T_compute_r(l), T_done(l - 1))
    with each rank's compute chain as in estimate_backward, started at starts_ms[r] (all ranks
    on one clock, e.g. from a common forward start). One rank, started at 0: estimate_backward.

    ranks: per rank, the layers in backward order (the same names in the same order on every
        rank; the comm times of ranks[0] are used: the collective's duration is one number).
    starts_ms: when each rank's backward starts, on the common clock.
    Returns the timeline of rank 0 (ranks[0]), in ms from its own backward start.
    """
    overhead_ms = _check_time("overhead_ms", overhead_ms)
    ranks = [tuple(r) for r in ranks]
    if not ranks:
        raise ValueError("ranks is empty: at least one rank's layers are needed")
    if len(starts_ms) != len(ranks):
        raise ValueError(f"starts_ms has {len(starts_ms)} entries for {len(ranks)} ranks")
    starts = [_check_finite(f"starts_ms[{i}]", s) for i, s in enumerate(starts_ms)]
    names = [layer.name for layer in ranks[0]]
    for i, layers in enumerate(ranks):
        if not layers:
            raise ValueError(f"rank {i} has no layers: the backward needs at least one layer")
        if any(not isinstance(layer, LayerTimes) for layer in layers):
            raise TypeError(f"rank {i}'s layers must hold LayerTimes")
        if [layer.name for layer in layers] != names:
            raise ValueError(f"rank {i}'s layers {[x.name for x in layers]} differ from rank 0's {names}")

    origin = starts[0]
    # Each rank's compute chain does not depend on communication (the thesis' assumption).
    ends = []
    for layers, start in zip(ranks, starts):
        t, chain = start, []
        for layer in layers:
            chain.append((t, t + layer.compute_ms))
            t = t + layer.compute_ms + overhead_ms
        ends.append(chain)
    timeline = []
    previous_ms = origin  # the channel is idle when the timed rank's backward starts
    for j, layer in enumerate(ranks[0]):
        start_ms, compute_end_ms = ends[0][j]
        ready_ms = max(chain[j][1] for chain in ends)  # the last rank's gradient of this layer
        comm_start_ms = max(ready_ms, previous_ms)
        comm_done_ms = comm_start_ms + layer.comm_ms
        timeline.append(LayerTimeline(layer.name, start_ms - origin, compute_end_ms - origin,
                                      comm_start_ms - origin, comm_done_ms - origin))
        previous_ms = comm_done_ms
    return BackwardEstimate(layers=tuple(timeline), backward_ms=previous_ms - origin)


def error_pct(predicted_ms: float, measured_ms: float) -> float:
    """Relative error of a prediction in percent of the measurement, as a magnitude
    (the thesis' "error of 0.35%"): |predicted - measured| / measured * 100."""
    predicted_ms = _check_time("predicted_ms", predicted_ms)
    measured_ms = _check_time("measured_ms", measured_ms)
    if measured_ms == 0:
        raise ValueError("measured_ms must be positive to be a reference, got 0")
    return abs(predicted_ms - measured_ms) / measured_ms * 100.0


def ring_allreduce_ms(grad_bytes: float, bus_bandwidth_gb_s: float, world_size: int,
                      latency_ms: float = 0.0) -> float:
    """Time of one ring all-reduce of grad_bytes over world_size ranks.

    A ring all-reduce moves 2*(N-1)/N of the buffer through each rank's link (reduce-scatter
    then all-gather), so at a bus bandwidth B (GB/s = 1e9 bytes/s, what nccl-tests reports as
    busbw) it takes 2*(N-1)/N * bytes / B, plus a fixed latency per collective. One rank
    does no communication: 0 ms, whatever the latency.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    grad_bytes = _check_time("grad_bytes", grad_bytes)
    latency_ms = _check_time("latency_ms", latency_ms)
    if isinstance(bus_bandwidth_gb_s, bool) or not isinstance(bus_bandwidth_gb_s, Real) \
            or not math.isfinite(bus_bandwidth_gb_s) or bus_bandwidth_gb_s <= 0:
        raise ValueError(f"bus_bandwidth_gb_s must be a positive finite number, got {bus_bandwidth_gb_s!r}")
    if world_size == 1:
        return 0.0
    moved_bytes = 2.0 * (world_size - 1) / world_size * grad_bytes
    return moved_bytes / (bus_bandwidth_gb_s * 1e9) * 1e3 + latency_ms


def predict_step_ms(per_layer_compute_ms: Sequence[float], per_layer_grad_bytes: Sequence[float],
                    allreduce_bandwidth_gb_s: float, world_size: int, forward_ms: float,
                    optimizer_ms: float, overhead_ms: float = 0.0,
                    allreduce_latency_ms: float = 0.0) -> float:
    """Predicted DDP training step time on world_size GPUs, in ms, from a 1-GPU run.

    per_layer_compute_ms: backward compute time of each layer measured on 1 GPU, in backward
        order (the layer whose backward runs first comes first).
    per_layer_grad_bytes: bytes of gradient each of those layers all-reduces (parameters
        that train x bytes per gradient element), same order and length.
    allreduce_bandwidth_gb_s: all-reduce bus bandwidth measured on the N GPUs (nccl-tests'
        busbw at a message size like the layers'), GB/s = 1e9 bytes/s.
    forward_ms, optimizer_ms: the 1-GPU forward and optimizer step times.
    overhead_ms: gap between two layers' backward compute (estimate_backward's overhead).
    allreduce_latency_ms: fixed cost of each all-reduce, for small messages.

    step = forward_ms + backward + optimizer_ms, the backward from estimate_backward with each
    layer's comm time = ring_allreduce_ms(its bytes). On 1 GPU the comm times are 0 and the
    backward is the sum of the compute times (plus the overheads between layers).

    Assumptions (each makes the prediction optimistic where it fails):
      * Per-GPU compute does not change with N: same per-GPU batch, and the all-reduce
        kernels running beside the backward do not slow it (they share SMs and memory).
        The thesis' own Table 4.10 shows forward and backward growing with N.
      * The bus bandwidth is the same for every layer's message: small messages are latency
        bound (use allreduce_latency_ms) and the bandwidth depends on topology and N.
      * A layer's all-reduce starts as soon as its gradient is ready and the previous
        all-reduce is done. PyTorch DDP groups gradients into buckets (25 MiB by default) and
        all-reduces a bucket when its last gradient is ready: pass per-bucket compute times
        and bytes to model that.
      * Nothing else overlaps: the forward (and its broadcast, if any) and the optimizer step
        run alone, the optimizer after the last all-reduce. Data loading, zero_grad etc. are
        not counted (fold them into forward_ms).
    """
    compute = list(per_layer_compute_ms)
    grad_bytes = list(per_layer_grad_bytes)
    if len(compute) != len(grad_bytes):
        raise ValueError(f"per_layer_compute_ms has {len(compute)} layers but per_layer_grad_bytes has {len(grad_bytes)}")
    if not compute:
        raise ValueError("per_layer_compute_ms is empty: the backward needs at least one layer")
    forward_ms = _check_time("forward_ms", forward_ms)
    optimizer_ms = _check_time("optimizer_ms", optimizer_ms)
    layers = [LayerTimes(f"layer{i}", c,
                         ring_allreduce_ms(b, allreduce_bandwidth_gb_s, world_size, allreduce_latency_ms))
              for i, (c, b) in enumerate(zip(compute, grad_bytes))]
    backward_ms = estimate_backward(layers, overhead_ms).backward_ms
    return forward_ms + backward_ms + optimizer_ms


def slowest_rank_step_ms(step_ms: Sequence[float], world_size: int) -> float:
    """The median step of world_size ranks that wait for each other every step, each rank's step
    drawn from the distribution of a 1-GPU run's steady steps (its step_ms series).

    DDP's all-reduces make every step end with the slowest rank's: a step of N ranks is the
    maximum of N draws. With independent draws P(max <= x) = F(x)**N, so its median is F's
    quantile at 0.5 ** (1/N) (N=1: the median; N=2: the 70.7th percentile; N=4: the 84.1th),
    read off the sorted steps with linear interpolation. Host jitter (the Python loop, the data
    loader, the GIL) is what spreads a 1-GPU run's steps; 4 ranks on one host add contention of
    their own, which a 1-GPU run cannot show, so this is still a lower bound."""
    times = sorted(_check_time("step_ms", t) for t in step_ms)
    if not times:
        raise ValueError("step_ms is empty: the 1-GPU run logged no steps")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    pos = 0.5 ** (1.0 / world_size) * (len(times) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(times) - 1)
    return times[lo] + (pos - lo) * (times[hi] - times[lo])
