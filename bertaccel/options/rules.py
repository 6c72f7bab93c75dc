"""The rules between options: every combination of sections that cannot run, in one named table.

An option's own check (options/registry.py) reads its own section; a rule reads several, and is
asked only when each section it reads passed its own check (a rule then compares values each
section vouched for). validate() says every rule that refuses, one line each. Which sections a
rule reads is read from its function's code (`cfg.<section>`), never declared beside it, so a rule
cannot be asked about a section that failed because its list left that section out.

A rule is asked at one of three stages, as an option's checks are:
- "check": with the options' own checks (validate, options/checks.py);
- "later": it builds or reaches out, asked with the options' later checks once each section it
  reads passed those too (a sweep that leaves a section's later checks to the run's own process
  leaves the rule there with them);
- "machine": why this machine cannot run the combination (a skip, not bad input), asked by
  skip_reason (options/hardware.py) when no option's own machine check found a reason.
"""
from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable, Optional, Tuple

if TYPE_CHECKING:
    from bertaccel.config import RunConfig

STAGES = ("check", "later", "machine")


@functools.lru_cache(maxsize=None)
def reads_of(refusal: Callable[..., Optional[str]]) -> Tuple[str, ...]:
    """The sections (RunConfig's fields: groups, blocks, top-level settings) a rule's function
    reads, in the order its code first names them: each `cfg.<section>` of its first argument.
    A function that hands its config on whole (`f(cfg)`) could read anything: refused, so what is
    derived here is all it reads."""
    from bertaccel.config import RunConfig

    tree = ast.parse(textwrap.dedent(inspect.getsource(refusal)))
    func = tree.body[0]
    assert isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef))
    arg = func.args.args[0].arg
    sections = {f.name for f in fields(RunConfig)}
    named = [n for n in ast.walk(func) if isinstance(n, ast.Name) and n.id == arg]
    attrs = [n for n in ast.walk(func) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
             and n.value.id == arg]
    if len(attrs) != len(named) or any(a.attr not in sections for a in attrs):
        raise TypeError(f"rule {refusal.__name__}: read the config only as {arg}.<section> (a field of RunConfig), "
                        "so the sections it reads can be derived from its code")
    ordered = sorted(attrs, key=lambda a: (a.lineno, a.col_offset))
    return tuple(dict.fromkeys(a.attr for a in ordered))


@dataclass(frozen=True)
class Rule:
    name: str
    # its one line (a refusal; at stage "machine", the skip reason), or None when the combination runs:
    # (cfg) -> line, or at stage "machine" (cfg, device, caps) -> line
    refusal: Callable[..., Optional[str]]
    stage: str = "check"  # one of STAGES

    @property
    def reads(self) -> Tuple[str, ...]:
        """The sections it reads, from its function's code (reads_of)."""
        return reads_of(self.refusal)

    @property
    def says(self) -> str:
        """What it refuses (its function's docstring), for the config reference."""
        return " ".join((self.refusal.__doc__ or "").split())


# --- compile.step_graph=true: what a captured step (train/step_graph.py) cannot replay --------

def _step_graph_fp16(cfg: "RunConfig") -> Optional[str]:
    """compile.step_graph=true with fp16 loss scaling: GradScaler decides on the host whether to step."""
    if cfg.compile.step_graph and cfg.precision.loss_scaling:
        return ("compile.step_graph=true needs precision fp32 or bf16: fp16's GradScaler decides on the "
                "host whether to step (skip on inf), which a CUDA graph cannot")
    return None


def _step_graph_freezing(cfg: "RunConfig") -> Optional[str]:
    """compile.step_graph=true with freezing other than none: the trained parameters change every epoch."""
    from bertaccel.options.freezing import freezes

    if cfg.compile.step_graph and freezes(cfg.freezing):
        return ("compile.step_graph=true needs freezing=none: layer-wise freezing changes the trained "
                "parameters every epoch, and with them every captured graph")
    return None


def _step_graph_num_gpus(cfg: "RunConfig") -> Optional[str]:
    """compile.step_graph=true with num_gpus > 1: DDP's all-reduce runs from host-side hooks."""
    if cfg.compile.step_graph and cfg.num_gpus > 1:
        return ("compile.step_graph=true needs num_gpus=1: DDP's gradient all-reduce runs from autograd "
                "hooks on the host, outside anything a captured step could replay")
    return None


def _step_graph_eager_attention(cfg: "RunConfig") -> Optional[str]:
    """compile.step_graph=true with Hugging Face's eager attention, uncompiled: its mask builder
    copies a host scalar to the GPU, which capture forbids."""
    from bertaccel.attention.option import is_eager
    from bertaccel.encoder.option import is_fused
    from bertaccel.options.compile import compiles

    if (cfg.compile.step_graph and not compiles(cfg.compile) and is_eager(cfg.attention)
            and not is_fused(cfg.encoder)):
        # Seen on an H100 (torch 2.11, transformers 5.17): "Cannot copy between CPU and CUDA tensors
        # during CUDA graph capture"; sdpa and our kernels get the [B, S] mask handed through instead.
        return (f"compile.step_graph=true with attention={cfg.attention.name}: Hugging Face's eager mask builder "
                "copies a host scalar to the GPU, which CUDA-graph capture forbids; use attention=sdpa (or "
                "xformers, triton, encoder=fused)")
    return None


def _adaptive_step_graph(cfg: "RunConfig") -> Optional[str]:
    """accumulation=adaptive with compile.step_graph=true: the captured step cannot read each micro-batch's gradient."""
    from bertaccel.options.accumulation import is_adaptive

    if is_adaptive(cfg.accumulation) and cfg.compile.step_graph:
        return ("accumulation=adaptive with compile.step_graph=true: the captured step cannot "
                "read each micro-batch's gradient; use compile.step_graph=false")
    return None


# --- num_gpus > 1: what data parallelism cannot do --------------------------------------------

def _adaptive_num_gpus(cfg: "RunConfig") -> Optional[str]:
    """accumulation=adaptive with num_gpus > 1: the ranks would measure different variances."""
    from bertaccel.options.accumulation import is_adaptive

    if is_adaptive(cfg.accumulation) and cfg.num_gpus > 1:
        return ("accumulation=adaptive needs num_gpus=1: the ranks would measure different "
                "variances, and DDP's all-reduce inside the last backward hides each micro-batch's gradient")
    return None


def _freezing_num_gpus(cfg: "RunConfig") -> Optional[str]:
    """freezing other than none with num_gpus > 1: DDP registers its gradient hooks once."""
    from bertaccel.options.freezing import freezes

    if cfg.num_gpus > 1 and freezes(cfg.freezing):
        return (f"num_gpus={cfg.num_gpus} with freezing={cfg.freezing.name}: DDP registers its gradient "
                "hooks once, for the parameters trainable at the start; use num_gpus=1 or freezing=none")
    return None


def _inline_num_gpus(cfg: "RunConfig") -> Optional[str]:
    """launcher=inline with num_gpus > 1: a rank needs a process of its own."""
    from bertaccel.options.launcher import runs_inline

    if runs_inline(cfg.launcher) and cfg.num_gpus > 1:
        return (f"num_gpus={cfg.num_gpus} needs a process per rank: launcher=inline runs in the sweep's "
                "own process; use launcher=process (the default)")
    return None


def _auto_batch_num_gpus(cfg: "RunConfig") -> Optional[str]:
    """train.batch_size=auto with num_gpus > 1: the search runs in one process."""
    from bertaccel.options.train import fits_batch

    if fits_batch(cfg.train) and cfg.num_gpus > 1:
        return (f"train.batch_size=auto with num_gpus={cfg.num_gpus}: the search runs in one process; "
                "use num_gpus=1, or give the batch found by a num_gpus=1 run (metric batch_size_used)")
    return None


def _concurrent_inline(cfg: "RunConfig") -> Optional[str]:
    """sweep.concurrent > 1 with launcher=inline: runs side by side need processes of their own."""
    from bertaccel.options.launcher import runs_inline
    from bertaccel.options.sweep import shares_gpu

    if shares_gpu(cfg.sweep) and runs_inline(cfg.launcher):
        return (f"sweep.concurrent={cfg.sweep.concurrent} trains runs side by side, each in processes of its own: "
                "launcher=inline would run them in one process; use launcher=process (the default)")
    return None


def _concurrent_num_gpus(cfg: "RunConfig") -> Optional[str]:
    """sweep.concurrent > 1 with num_gpus > 1: a window times one GPU's run alone (train/exclusive.py)."""
    from bertaccel.options.sweep import shares_gpu

    if shares_gpu(cfg.sweep) and cfg.num_gpus > 1:
        return (f"sweep.concurrent={cfg.sweep.concurrent} shares one GPU between runs and times each alone, but "
                f"num_gpus={cfg.num_gpus} is a data-parallel run over several; use num_gpus=1 or sweep.concurrent=1")
    return None


# --- precision=fp8: what torchao's float8 training (options/fp8.py) needs around it, and what the
# fused encoder's own FP8 GEMMs (encoder/fp8_ops.py) need -------------------------------------

def _fp8_compile_off(cfg: "RunConfig") -> Optional[str]:
    """precision fp8 (encoder=hf) with compile=off: torchao's float8 scaling and casts are fused only by torch.compile."""
    from bertaccel.encoder.option import is_fused
    from bertaccel.options.compile import compiles

    if cfg.precision.fp8_recipe is not None and not is_fused(cfg.encoder) and not compiles(cfg.compile):
        # torchao's docs and torchtitan's float8 guide: torch.compile is required for its speed-up.
        # Eagerly each Linear runs an amax, a scale and a cast per tensor as separate kernels.
        return (f"precision={cfg.precision.name} needs torch.compile (compile=default): torchao fuses its FP8 "
                "scaling and casts only when compiled; eagerly they are separate kernels and FP8 is slower than bf16")
    return None


def _fp8_fused_encoder(cfg: "RunConfig") -> Optional[str]:
    """precision fp8 with encoder=fused: its own FP8 GEMMs, which scale row-wise, need its fused kernels and compile=off."""
    from bertaccel.encoder.option import is_fused
    from bertaccel.options.precision import scales_rowwise

    p, e = cfg.precision, cfg.encoder
    if p.fp8_recipe is None or not is_fused(e):
        return None
    # The fused layer runs its GEMMs itself (torchao's Float8Linear would never be called): its own
    # FP8 path scales each token's row, which its LayerNorm and GELU kernels write (encoder/fp8_ops.py).
    if not scales_rowwise(p):
        return (f"precision={p.name} with encoder={e.name}: the fused layer's FP8 GEMMs scale row-wise (each "
                f"token's row from its LayerNorm or GELU kernel); use precision=fp8_rowwise, or encoder=hf for "
                f"torchao's {p.fp8_recipe} recipe")
    if not e.fused_kernels:
        return (f"precision={p.name} with encoder.fused_kernels=false: the FP8 rows are written by the fused "
                "LayerNorm and GELU kernels; use encoder.fused_kernels=true")
    from bertaccel.options.compile import compiles

    if compiles(cfg.compile):
        # Its FP8 ops are opaque to torch.compile (compiler.disable: a graph break at each). A
        # CUDA-graph capture of the step (compile.step_graph) replays them as they are.
        return (f"precision={p.name} with encoder=fused runs its FP8 GEMMs outside torch.compile (its FP8 kernels "
                f"are not torch.compile ops); use compile=off, with compile.step_graph=true to replay the step "
                f"from CUDA graphs")
    return None


# --- what the captured step builds (a later check: building an optimizer imports torch._dynamo) --

def _step_graph_optimizer(cfg: "RunConfig") -> Optional[str]:
    """compile.step_graph=true with an optimizer class that has no capturable mode, or refuses its
    settings in it: the captured step builds the optimizer capturable."""
    if not cfg.compile.step_graph:
        return None
    from bertaccel.options.optimizer import check_optimizer

    return check_optimizer(cfg.optimizer, capturable=True)


# --- what this machine cannot run together (skips, not bad input) ------------------------------

def _fp8_torchao(cfg: "RunConfig", device: Any, caps: Any) -> Optional[str]:
    """A skip: precision fp8 with encoder=hf where torchao's float8 training cannot be imported (it
    swaps the Linear layers; encoder=fused runs FP8 GEMMs of its own)."""
    from bertaccel.encoder.option import is_fused

    if cfg.precision.fp8_recipe is None or is_fused(cfg.encoder):
        return None
    from bertaccel.options.precision import torchao_unusable

    return torchao_unusable(cfg.precision)


def _fused_encoder_core(cfg: "RunConfig", device: Any, caps: Any) -> Optional[str]:
    """A skip: encoder=fused with an attention whose core the fused layer runs (encoder/attention.py)
    but this machine cannot."""
    from bertaccel.encoder.option import is_fused

    if not is_fused(cfg.encoder):
        return None
    from bertaccel.attention.option import fused_core_name
    from bertaccel.encoder.attention import core_unusable

    why = core_unusable(fused_core_name(cfg.attention), device)
    return f"encoder=fused: {why}" if why else None


RULES: Tuple[Rule, ...] = (
    Rule("step_graph_fp16", _step_graph_fp16),
    Rule("step_graph_freezing", _step_graph_freezing),
    Rule("step_graph_num_gpus", _step_graph_num_gpus),
    Rule("step_graph_eager_attention", _step_graph_eager_attention),
    Rule("adaptive_step_graph", _adaptive_step_graph),
    Rule("adaptive_num_gpus", _adaptive_num_gpus),
    Rule("freezing_num_gpus", _freezing_num_gpus),
    Rule("inline_num_gpus", _inline_num_gpus),
    Rule("auto_batch_num_gpus", _auto_batch_num_gpus),
    Rule("concurrent_inline", _concurrent_inline),
    Rule("concurrent_num_gpus", _concurrent_num_gpus),
    Rule("fp8_compile_off", _fp8_compile_off),
    Rule("fp8_fused_encoder", _fp8_fused_encoder),
    Rule("step_graph_optimizer", _step_graph_optimizer, stage="later"),
    Rule("fp8_torchao", _fp8_torchao, stage="machine"),
    Rule("fused_encoder_core", _fused_encoder_core, stage="machine"),
)


def rules_at(stage: str) -> Tuple[Rule, ...]:
    """The rules asked at one stage (STAGES), in the table's order."""
    return tuple(rule for rule in RULES if rule.stage == stage)
