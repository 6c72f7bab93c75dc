"""Which GPU to rent: one training run as three parts, a roofline time on a hardware profile, and
a time measured on one GPU moved to another through them.

The parts of one GPU's share of a run (ranks run side by side, so the tokens and micro-steps are
divided by num_gpus; every rank runs the whole optimizer):

    gemm_flops       matmul FLOPs: flops.py's bert_train_flops, as work.py counts them (Work.model_flops),
                     plus the forward recomputed under gradient checkpointing
    memory_bytes     bytes read and written by the memory-bound kernels (below)
    kernel_launches  kernels launched from the host (below)

and their time on a profile, each part at its ceiling, one after another (GEMMs and the memory-
bound kernels are separate kernels on one stream; a launch costs the host its floor either way):

    time_s = gemm_flops / (peak_tflops_<precision> x 1e12)
           + memory_bytes / (memory_bandwidth_tbps x 1e12)
           + kernel_launches x kernel_launch_us x 1e-6

**These are estimates**, said wherever they are used (ESTIMATE). What memory_bytes counts, per
encoder layer and token (H hidden, I intermediate; LAYER_COSTS has each figure and its breakdown):
the dropouts, residual adds and LayerNorms, GELU, the heads' layout copies and the bias gradients,
forward and backward (the backward only through the layers it reaches: layer-wise freezing stops
it); with attention=eager also the S x S score matrix per head (scale, mask, softmax, dropout and
the score GEMMs' reads and writes of it), which the fused kernels (sdpa's efficient/flash, xFormers,
our Triton kernel) never write. Per token for the embeddings (gathers, adds, LayerNorm, dropout;
their backward and the dense word-embedding gradient only while they train). Per parameter: the
autocast casts of the Linear weights (none for encoder=fused's half parameters with a master-weight
optimizer), gradient accumulation's adds, and per optimizer step the optimizer's passes over its
fp32 state (its class's step_cost), clipping's and GradScaler's. Elements are 4 bytes in fp32, 2 in the fused
encoder's half precision, and AUTOCAST_ELEMENT_BYTES under autocast. Left out: the pooler and
classifier (one row per sequence), the loss, data-parallel all-reduce (the interconnect, not the
memory), the GEMMs' own operand traffic (the GEMM part). Tokens are the padded ones work.py counts
model_flops on, also for encoder=fused, whose layers run on the real tokens only.

kernel_launches counts the same kernels: LAYER_COSTS per layer (hf as Hugging Face runs it,
compiled as Inductor fuses its elementwise chains, fused as encoder=fused's kernels), REST_LAUNCHES
for embeddings and head, per parameter tensor or multi-tensor chunk for the optimizer. Under CUDA
graphs (compile modes that replay them, compile.step_graph) the host launches the graphs only;
the device's own gap between a graph's kernels is left out.

The transfer (transfer()): a run's measured time on its GPU is split over the three parts in
proportion to their roofline times there (every part assumed as far from its ceiling as the
others), or, with a measured host overhead, that overhead is the launch part and the rest is split
over GEMM and memory; then GEMM time scales by the peak ratio, memory time by the bandwidth ratio,
and launch time stays (the host, not the GPU, sets it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Tuple

from torch import nn

from bertaccel.measure.flops import peak_tflops
from bertaccel.optimizers.cost import StepCost

ESTIMATE = "estimates of bytes and launches by plan/roofline.py"
# A kernel launch's host floor when the profile names none (hardware.kernel_launch_us). NVIDIA's
# "Getting Started with CUDA Graphs" (developer.nvidia.com/blog/cuda-graphs) measures a few
# microseconds per back-to-back launch of a short kernel from C++ (about 3.8 us there); PyTorch's
# dispatcher adds host time per op on top, so 5 us is an assumed floor, not a measurement of ours.
DEFAULT_KERNEL_LAUNCH_US = 5.0
# Under autocast, what a Linear writes is half (2 bytes); what autocast's fp32 ops (LayerNorm,
# softmax) write, and the residual stream they feed, is fp32 (4 bytes). 3 is the midpoint: an
# estimate, not counted op by op.
AUTOCAST_ELEMENT_BYTES = 3.0
# torch's multi-tensor apply (aten/src/ATen/native/cuda/MultiTensorApply.cuh, CUDA >= 13 builds,
# which the GPU runs of this project use): at most 252 tensors of 4 lists and 2240 blocks of 65536
# elements per launch (CUDA 12 builds: 36 tensors, 320 blocks: more launches than counted here).
FOREACH_TENSORS_PER_LAUNCH = 252
FOREACH_ELEMENTS_PER_LAUNCH = 2240 * 65536
PARAM_GROUPS = 2  # options/optimizer.py: decay and no-decay, each its own multi-tensor launches


class Uncounted(ValueError):
    """The parts or a roofline time cannot be counted; the message says why (one line)."""


@dataclass(frozen=True)
class Parts:
    """One GPU's share of a whole training run."""
    gemm_flops: float
    memory_bytes: float
    kernel_launches: float


@dataclass(frozen=True)
class Trained:
    """What trains in one epoch (work.py counts it on the meta-device model, freezing applied)."""
    params: int              # trainable parameters: what the optimizer and the gradients touch
    tensors: int             # trainable parameter tensors: per-tensor and multi-tensor launches
    backward_layers: int     # encoder layers the backward runs through (down to the lowest that trains)
    embedding_params: int    # the word embeddings' parameters while the embeddings train, else 0
    linear_params: int       # trainable Linear weights of the encoder (autocast casts their gradients)


def trained(model: Any) -> Trained:
    """model: the classifier as work.py builds it (meta device), with this epoch's requires_grad."""
    backbone = model.base_model
    layers = list(backbone.encoder.layer)
    embeddings = any(p.requires_grad for p in backbone.embeddings.parameters())
    lowest = next((i for i, layer in enumerate(layers) if any(p.requires_grad for p in layer.parameters())),
                  len(layers))
    params = [p for p in model.parameters() if p.requires_grad]
    linears = [m.weight for layer in layers for m in layer.modules() if isinstance(m, nn.Linear)]
    return Trained(params=sum(p.numel() for p in params), tensors=len(params),
                   backward_layers=len(layers) if embeddings else len(layers) - lowest,
                   embedding_params=backbone.embeddings.word_embeddings.weight.numel() if embeddings else 0,
                   linear_params=sum(w.numel() for w in linears if w.requires_grad))


@dataclass(frozen=True)
class LayerCost:
    """One encoder layer's memory-bound work: elements read + written per token (multiples of H and
    I) and per attention pair per head (the score matrix), dropout-mask bytes, kernel launches."""
    forward_h: float
    forward_i: float
    backward_h: float
    backward_i: float
    forward_pair: float = 0.0
    backward_pair: float = 0.0
    mask_bytes_h: float = 0.0      # per direction (written forward, read backward)
    mask_bytes_pair: float = 0.0   # per direction
    forward_launches: int = 0
    backward_launches: int = 0


# (layer kind, attention kind) -> cost. Counted from the layers' code, each figure an estimate:
# hf forward: 2 x (dropout 2H + residual add 3H + LayerNorm 2H) + GELU 2I + the context's head
#   permute copy 2H = 16H + 2I; backward: 2 x (LayerNorm 3H + dropout 2H + residual-gradient sum 3H)
#   + GELU 3I + permute 2H + the six bias gradients' reads (5H + I) + Q/K/V input-gradient sums 6H
#   = 29H + 4I. Launches: 6 addmm, 2 dropouts, 2 adds, 2 LayerNorms, GELU, the copy (15 with a fused
#   attention kernel) forward; 12 mm, 6 bias sums, 4 adds, 2 dropouts, 2 LayerNorms, GELU, the copy,
#   the attention's 2 (30) backward. The per-layer operator count of the CPU (torch 2.13,
#   transformers 5.24, TorchDispatchMode, views left out) is the eager figure once its three-op
#   CPU dropout is one kernel, as on a GPU.
# eager scores: Q/K/V copies for the head-batched matmuls (6H each way); per pair forward: QK^T
#   write, scale r+w, mask add r+w, softmax r+w, dropout r+w, P@V read (10, and a 1-byte mask);
#   backward: dP write, dV's read of P, dropout 2, softmax 3, scale 2, dQ/dK's reads of dS (11).
#   Launches: 2 bmm, scale, mask add, softmax, dropout (23) forward; 4 bmm and 4 more (38) backward.
# compiled (Inductor): dropout + add + LayerNorm one kernel (3H) each, no masks (its dropout
#   regenerates the random numbers in the backward); scores: scale..dropout one kernel (5 / 7).
# fused (encoder=fused, its Triton kernels): bias+dropout+residual+LayerNorm one kernel 3H each
#   way, bias+GELU 2I forward; backward 2 x 4H + GELU 3I + QKV bias 3H; one QKV GEMM (no input-
#   gradient sums); 4 GEMMs + attention + 3 kernels forward, 8 GEMMs + attention's 2 + 7 backward.
LAYER_COSTS = {
    ("hf", "scores"): LayerCost(22, 2, 35, 4, 10, 11, 2, 1, 23, 38),
    ("hf", "fused"): LayerCost(16, 2, 29, 4, 0, 0, 2, 0, 15, 30),
    ("compiled", "scores"): LayerCost(8, 2, 14, 3, 5, 7, 0, 0, 13, 26),
    ("compiled", "fused"): LayerCost(8, 2, 14, 3, 0, 0, 0, 0, 11, 23),
    ("fused", "fused"): LayerCost(6, 2, 11, 3, 0, 0, 2, 0, 8, 17),
}
# Embeddings per token: 3 gathers 6H, 2 adds 6H, LayerNorm 2H, dropout 2H forward; while they
# train: dropout 2H, LayerNorm 3H, 3 gradient scatters 6H backward.
EMBEDDING_ELEMENTS_H = (16, 11)
# Launches outside the encoder layers, per micro-step: (forward, backward of the head, backward of
# the embeddings while they train). hf: 3 gathers, 2 adds, LayerNorm, dropout; pooler slice, GEMM,
# tanh, dropout, classifier GEMM, log-softmax, NLL; their backward; the embeddings' zero-fill and
# scatters. compiled: Inductor's fusions of the same, about half.
REST_LAUNCHES = {"hf": (15, 10, 14), "compiled": (8, 5, 7), "fused": (19, 14, 14)}  # fused: + packing


# What one optimizer step costs is its class's (`step_cost`, bertaccel/optimizers/cost.py; torch's
# classes: options/optimizer.py TORCH_STEP_COSTS); clipping and loss scaling are counted here.
OptimizerCost = StepCost
CLIPPING = OptimizerCost(3, foreach_ops=2, fixed_launches=6)     # clip_grad_norm_: norms r, scale r+w
LOSS_SCALING = OptimizerCost(2, foreach_ops=1, fixed_launches=2)  # GradScaler's unscale and update


@dataclass(frozen=True)
class Options:
    """What of a configuration changes its bytes and launches, read from the params a run logs."""
    layer: str            # hf | compiled | fused
    attention: str        # scores (eager) | fused (a kernel that never writes the S x S matrix)
    element_bytes: float
    casts: bool           # autocast casts the fp32 Linear weights per forward (not encoder=fused's half params)
    graphs: str           # none | model (compile with CUDA graphs) | step (compile.step_graph)
    optimizer: OptimizerCost
    clipping: bool
    loss_scaling: bool
    checkpointing: bool


def _logged(params: Mapping[str, str]) -> Mapping[str, str]:
    """A run's params with what its optimizer choice restates (record.run_record.option_settings:
    conf/optimizer/<name>.yaml) beneath them, as record.run_settings reads a logged run back."""
    from bertaccel.record.run_record import option_settings

    own = option_settings("optimizer", str(params["optimizer"])) if "optimizer" in params else None
    return {**(own or {}), **params}


def options(params: Mapping[str, str]) -> Options:
    """Each option read back from the params (Option.from_params) and asked what it means here.
    Raises Uncounted for an optimizer whose class declares no step_cost."""
    from bertaccel.attention.option import is_eager
    from bertaccel.encoder.option import is_fused, runs_fused_kernels
    from bertaccel.options.compile import compiles, uses_cuda_graphs
    from bertaccel.options.optimizer import keeps_master_weights, step_cost
    from bertaccel.options.registry import options as registered
    from bertaccel.options.train import checkpoints

    params = _logged(params)
    read = {o.section: o for o in registered()}
    c, a, e, p, opt, tr = (read[s].from_params(params) for s in ("compile", "attention", "encoder", "precision",
                                                                  "optimizer", "train"))
    if "optimizer.impl._target_" not in params:
        raise Uncounted(f"optimizer={params.get('optimizer')}: its class (optimizer.impl) is not among the params")
    cost = step_cost(opt)
    if cost is None:
        raise Uncounted(f"optimizer={params.get('optimizer')}: its class {opt.impl.get('_target_')} declares no "
                        "step_cost (bertaccel/optimizers/cost.py), so its passes and launches are not known")
    # encoder=fused with fused_kernels=false runs its kernels' arithmetic as PyTorch ops: counted as
    # Hugging Face's layer (or Inductor's, compiled).
    fused_layer = runs_fused_kernels(e)
    autocast = p.autocast_dtype is not None
    half = fused_layer and autocast and e.half_params and keeps_master_weights(opt)
    return Options(layer="fused" if fused_layer else "compiled" if compiles(c) else "hf",
                   attention="scores" if is_eager(a) and not is_fused(e) else "fused",
                   element_bytes=(2.0 if half else AUTOCAST_ELEMENT_BYTES) if autocast else 4.0,
                   casts=autocast and not half,
                   graphs="step" if c.step_graph else "model" if compiles(c) and uses_cuda_graphs(c.mode) else "none",
                   optimizer=cost, clipping=opt.max_grad_norm is not None, loss_scaling=p.loss_scaling,
                   checkpointing=checkpoints(tr))


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    intermediate: int

    @classmethod
    def of(cls, params: Mapping[str, str]) -> "Shape":
        try:
            return cls(*(int(params[f"model.{k}"]) for k in ("hidden_size", "num_hidden_layers",
                                                              "num_attention_heads", "intermediate_size")))
        except (KeyError, ValueError) as e:
            raise Uncounted(f"the model's shape is not among the params ({e})") from None

    @property
    def linear_params(self) -> int:
        """The encoder's Linear weights (what autocast casts per forward)."""
        return self.layers * (4 * self.hidden ** 2 + 2 * self.hidden * self.intermediate)


def _foreach_launches(ops: float, tensors: int, params: int, groups: int) -> float:
    per_op = groups * max(math.ceil(tensors / groups / FOREACH_TENSORS_PER_LAUNCH),
                          math.ceil(params / groups / FOREACH_ELEMENTS_PER_LAUNCH), 1)
    return ops * per_op


def _step(cost: OptimizerCost, t: Trained, groups: int) -> Tuple[float, float]:
    """(bytes, launches) of one optimizer-step cost over what trains."""
    launches = (_foreach_launches(cost.foreach_ops, t.tensors, t.params, groups) if cost.foreach_ops else 0.0)
    return cost.passes * 4.0 * t.params, launches + cost.per_tensor_ops * t.tensors + cost.fixed_launches


def _micro_step(shape: Shape, o: Options, t: Trained, tokens: float, pairs: float) -> Tuple[float, float]:
    """(bytes, launches) of one micro-step's memory-bound kernels; tokens and pairs (B x S^2) of it."""
    c = LAYER_COSTS[(o.layer, o.attention)]
    h, i, heads, e = shape.hidden, shape.intermediate, shape.heads, o.element_bytes
    forward = (tokens * (c.forward_h * h + c.forward_i * i) * e + pairs * heads * c.forward_pair * e
               + tokens * c.mask_bytes_h * h + pairs * heads * c.mask_bytes_pair)
    backward = (tokens * (c.backward_h * h + c.backward_i * i) * e + pairs * heads * c.backward_pair * e
                + tokens * c.mask_bytes_h * h + pairs * heads * c.mask_bytes_pair)
    again = t.backward_layers if o.checkpointing else 0  # checkpointed layers run their forward twice
    memory = (shape.layers + again) * forward + t.backward_layers * backward
    memory += tokens * h * e * (EMBEDDING_ELEMENTS_H[0] + (EMBEDDING_ELEMENTS_H[1] if t.embedding_params else 0))
    memory += t.embedding_params * 4.0  # the dense word-embedding gradient, written whole
    if o.casts:  # the Linear weights to half each forward, their gradients back to fp32
        memory += (shape.linear_params + t.linear_params) * 6.0  # fp32 -> half (r 4, w 2), gradient back
    rest = REST_LAUNCHES[o.layer]
    launches = ((shape.layers + again) * c.forward_launches + t.backward_layers * c.backward_launches
                + rest[0] + rest[1] + (rest[2] if t.embedding_params else 0))
    if o.casts:
        launches += 2 * (4 if o.layer == "fused" else 6) * shape.layers  # a cast per Linear weight each way
    return memory, launches


def count(shape: Shape, o: Options, gemm_flops: float, tokens: float, pairs: float, micro_steps: float,
          optimizer_steps: float, epochs: List[Trained]) -> Parts:
    """One GPU's parts. tokens, pairs (B x S^2), micro_steps and optimizer_steps are its share of the
    whole run, spread evenly over the epochs (what trains may change per epoch; the batches do not)."""
    memory = launches = 0.0
    n = len(epochs)
    per_micro_tokens, per_micro_pairs = tokens / micro_steps, pairs / micro_steps
    for t in epochs:
        micro, steps = micro_steps / n, optimizer_steps / n
        m_bytes, m_launches = _micro_step(shape, o, t, per_micro_tokens, per_micro_pairs)
        memory += micro * m_bytes
        launches += micro * {"none": m_launches, "model": 2, "step": 1}[o.graphs]  # graphs: fwd + bwd | micro
        memory += (micro - steps) * 3 * 4.0 * t.params  # accumulation: grad += new grad (r, r, w)
        launches += (micro - steps) * (0 if o.graphs == "step" else t.tensors)
        extra = [c for c, on in ((CLIPPING, o.clipping), (LOSS_SCALING, o.loss_scaling)) if on]
        for cost in [o.optimizer] + extra:
            s_bytes, s_launches = _step(cost, t, PARAM_GROUPS if cost is o.optimizer else 1)
            memory += steps * s_bytes
            launches += steps * (0 if o.graphs == "step" else s_launches)
        launches += steps if o.graphs == "step" else 0  # the captured step: one graph launch
    recompute = 0.0
    if o.checkpointing:  # the recomputed forward's GEMMs: 2 x MACs x tokens + 4 x pairs x H per layer
        layers = sum(t.backward_layers for t in epochs) / n
        recompute = layers * (2 * (shape.linear_params / shape.layers) * tokens + 4 * pairs * shape.hidden)
    return Parts(gemm_flops=gemm_flops + recompute, memory_bytes=memory, kernel_launches=launches)


def parts_of(work: Any, params: Mapping[str, str]) -> Parts:
    """The parts of a configuration's run, per GPU, from work.py's Work and the params its run logs
    (predict.run_params). Raises Uncounted with the reason when they cannot be counted."""
    if not work.trained:
        raise Uncounted("the work does not say what trains per epoch (Work.trained)")
    if work.optimizer_steps is None:
        raise Uncounted(work.why_no_steps or "no optimizer steps counted")
    if not work.micro_batches:
        raise Uncounted("no micro-batch to train")
    gpus = int(params.get("num_gpus", "1"))
    return count(Shape.of(params), options(params), work.model_flops / gpus, work.tokens.padded_tokens / gpus,
                 work.tokens.attention_pairs / gpus, work.micro_batches / gpus, work.optimizer_steps, work.trained)


def kernel_launch_us(profile: Mapping[str, Any]) -> Tuple[float, str]:
    value = profile.get("kernel_launch_us")
    if value is None:
        return DEFAULT_KERNEL_LAUNCH_US, f"kernel_launch_us {DEFAULT_KERNEL_LAUNCH_US:g}, plan/roofline.py's default"
    return float(value), f"kernel_launch_us {value:g} of profile '{profile.get('name')}'"


@dataclass(frozen=True)
class RooflineTime:
    gemm_s: float
    memory_s: float
    launch_s: float

    @property
    def total_s(self) -> float:
        return self.gemm_s + self.memory_s + self.launch_s


def _ceilings(profile: Mapping[str, Any], precision: str) -> Tuple[float, float]:
    peak, why = peak_tflops(profile, precision)
    if peak is None:
        raise Uncounted(why)
    bandwidth = profile.get("memory_bandwidth_tbps")
    if bandwidth is None:
        raise Uncounted(f"hardware profile '{profile.get('name')}' has no memory_bandwidth_tbps")
    return peak, float(bandwidth)


def roofline_time(parts: Parts, profile: Mapping[str, Any], precision: str) -> RooflineTime:
    """Each part at the profile's ceiling. Raises Uncounted when the profile lacks one."""
    peak, bandwidth = _ceilings(profile, precision)
    return RooflineTime(parts.gemm_flops / (peak * 1e12), parts.memory_bytes / (bandwidth * 1e12),
                        parts.kernel_launches * kernel_launch_us(profile)[0] * 1e-6)


def transfer(seconds: float, parts: Parts, source: Mapping[str, Any], target: Mapping[str, Any], precision: str,
             overhead_s: Optional[float] = None) -> Tuple[float, str]:
    """A time measured on `source` moved to `target`: (seconds there, the basis). overhead_s: the
    host/launch overhead measured within `seconds` (kept as the launch part); None: the launch part
    is the roofline's share. Raises Uncounted when either profile lacks a ceiling."""
    peak_s, bw_s = _ceilings(source, precision)
    peak_t, bw_t = _ceilings(target, precision)
    there = roofline_time(parts, source, precision)
    if overhead_s is not None:
        launch = min(max(overhead_s, 0.0), seconds)
        busy = there.gemm_s + there.memory_s
        gemm = (seconds - launch) * (there.gemm_s / busy if busy else 0.0)
        why_launch = "measured overhead, host-bound"
    else:
        total = there.total_s
        if not total:
            raise Uncounted("the parts are all zero")
        launch, gemm = seconds * there.launch_s / total, seconds * there.gemm_s / total
        why_launch = f"host-bound; {kernel_launch_us(source)[1]}"
    memory = seconds - launch - gemm
    g, m = peak_s / peak_t, bw_s / bw_t
    moved = gemm * g + memory * m + launch

    def share(x: float) -> str:
        return f"{x / seconds * 100:.0f}%" if seconds else "0%"
    basis = (f"roofline from {source.get('name')} runs: GEMM {share(gemm)} x {g:.3g} (peak_tflops_{precision} "
             f"{peak_s:g}/{peak_t:g}), memory {share(memory)} x {m:.3g} (memory_bandwidth_tbps {bw_s:g}/{bw_t:g}), "
             f"launch {share(launch)} x 1 ({why_launch}); {ESTIMATE}")
    return moved, basis
