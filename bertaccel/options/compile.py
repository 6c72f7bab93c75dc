"""The `compile` option's checks: torch.compile's mode and kernel cache by name, and what
compile.step_graph=true (the whole step replayed from CUDA graphs, bertaccel/train/step_graph.py)
cannot be combined with."""
from __future__ import annotations

from typing import Any, Optional

from bertaccel.config import COMPILE_CACHES, COMPILE_MODES, not_one_of, uses_cuda_graphs


def check(cfg: Any) -> Optional[str]:
    """Refuses an unknown mode or cache; with step_graph=true, whatever a captured step cannot
    replay (step_graph_refusal: fp16 loss scaling, freezing, num_gpus > 1, Hugging Face's eager
    attention uncompiled, a mode with CUDA graphs of its own) and accumulation=adaptive."""
    why = (not_one_of("compile.mode", cfg.compile.mode, COMPILE_MODES)
           or not_one_of("compile.cache", cfg.compile.cache, COMPILE_CACHES))
    if why or not cfg.compile.step_graph:
        return why
    why = step_graph_refusal(cfg)
    if why is None and cfg.accumulation == "adaptive":
        # (asked after step_graph_refusal, whose num_gpus=1 leaves accumulation's own refusal of
        # adaptive, num_gpus>1 nothing to say first: the first refusal is what it always was)
        return ("accumulation=adaptive with compile.step_graph=true: the captured step cannot "
                "read each micro-batch's gradient; use compile.step_graph=false")
    return why


def step_graph_refusal(cfg: Any) -> Optional[str]:
    """Why this configuration cannot have step graphs (None if it can): what a captured step
    cannot replay (train/step_graph.py)."""
    if cfg.precision.loss_scaling:
        return ("compile.step_graph=true needs precision fp32 or bf16: fp16's GradScaler decides on the "
                "host whether to step (skip on inf), which a CUDA graph cannot")
    if cfg.freezing.name != "none":
        return ("compile.step_graph=true needs freezing=none: layer-wise freezing changes the trained "
                "parameters every epoch, and with them every captured graph")
    if cfg.num_gpus > 1:
        return ("compile.step_graph=true needs num_gpus=1: DDP's gradient all-reduce runs from autograd "
                "hooks on the host, outside anything a captured step could replay")
    if (cfg.compile.mode == "off" and cfg.attention.hf_implementation == "eager" and cfg.attention.swap is None
            and cfg.encoder.layer == "hf"):
        # Seen on an H100 (torch 2.11, transformers 5.17): "Cannot copy between CPU and CUDA tensors
        # during CUDA graph capture"; sdpa and our kernels get the [B, S] mask handed through instead.
        return (f"compile.step_graph=true with attention={cfg.attention.name}: Hugging Face's eager mask builder "
                "copies a host scalar to the GPU, which CUDA-graph capture forbids; use attention=sdpa (or "
                "xformers, triton, encoder=fused)")
    if uses_cuda_graphs(cfg.compile.mode):  # Inductor's own CUDA graphs
        return (f"compile.step_graph=true with compile={cfg.compile.mode} would capture CUDA graphs inside "
                "CUDA graphs; use compile=default (or off) with compile.step_graph=true")
    return None
