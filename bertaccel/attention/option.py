"""The `attention` option, in one place: conf/attention/<name>.yaml holds an option's settings,
this module their validation and the machine check (building the model: bertaccel/model.py).

An option says which attention Hugging Face builds (`hf_implementation`: eager or sdpa), which
of our module swaps then replaces every BertSelfAttention (`swap`: a backend of
attention/kernels/, or null) and, for sdpa, which torch SDPA backends are allowed. Adding an
attention option that reuses an implementation is one YAML file; a new kernel is its module in
attention/kernels/ (its cores and its "can this machine run it" check, as BACKEND) plus the YAML.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Optional

import torch

from bertaccel.config import AttentionConfig
from bertaccel.option import Option

if TYPE_CHECKING:
    from bertaccel.config import RunConfig

HF_IMPLEMENTATIONS = ("eager", "sdpa")
SDPA_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")


def is_sdpa(a: Any) -> bool:
    """Hugging Face builds torch SDPA attention (its sdpa_backends then apply)."""
    return bool(a.hf_implementation == "sdpa")


def is_eager(a: Any) -> bool:
    """Hugging Face's eager attention, with no kernel swapped in: the S x S scores are written."""
    return bool(a.hf_implementation == "eager" and a.swap is None)


def jit_compiles(a: Any) -> bool:
    """Whether the swapped kernel is compiled per run (a warm-up compiles it before the first window)."""
    from .kernels import BACKENDS

    return a.swap is not None and BACKENDS[a.swap].jit_per_run


def fused_core_name(a: Any) -> str:
    """The attention core encoder=fused runs for this option: its swap kernel; torch's varlen
    kernels for sdpa; ours (triton) for eager, which names no kernel."""
    if a.swap is not None:
        return str(a.swap)
    return "sdpa" if is_sdpa(a) else "triton"


def check_attention(a: Any) -> List[str]:
    """Why these settings cannot work anywhere, one line each."""
    from .kernels import BACKENDS

    found = []
    if a.hf_implementation not in HF_IMPLEMENTATIONS:
        found.append(f"attention {a.name}: hf_implementation={a.hf_implementation!r} is not one of "
                     f"{', '.join(HF_IMPLEMENTATIONS)}")
    if a.swap is not None:
        if a.swap not in BACKENDS:
            found.append(f"attention {a.name}: swap={a.swap!r} is not one of {', '.join(BACKENDS)} (or null for none)")
        if a.hf_implementation != "eager":
            found.append(f"attention {a.name}: swap={a.swap} replaces the eager BertSelfAttention modules; "
                         f"set hf_implementation=eager")
    if a.sdpa_backends and a.hf_implementation != "sdpa":
        found.append(f"attention {a.name}: sdpa_backends apply to hf_implementation=sdpa only; set sdpa_backends=[]")
    for backend in a.sdpa_backends:
        if backend not in SDPA_BACKENDS:
            found.append(f"attention.sdpa_backends[]={backend!r} is not one of {', '.join(SDPA_BACKENDS)}")
    return found


def attention_unusable(a: Any, device: torch.device) -> Optional[str]:
    """Why this machine cannot run the option (a skip, not bad input), or None."""
    from .kernels import BACKENDS

    return BACKENDS[a.swap].unusable(device) if a.swap is not None else None


class AttentionOption(Option):
    section, schema = "attention", AttentionConfig

    def check(self, cfg: "RunConfig") -> List[str]:
        """Refuses an hf_implementation Hugging Face does not build (eager, sdpa), a swap that is no
        kernel of attention/kernels/, a swap over sdpa (it replaces the eager modules), and
        sdpa_backends outside torch's names or with an hf_implementation other than sdpa."""
        return check_attention(cfg.attention)

    def unusable(self, cfg: "RunConfig", device: torch.device, caps: Any) -> Optional[str]:
        """The swap kernel's own machine check (its BACKEND in attention/kernels/)."""
        return attention_unusable(cfg.attention, device)


OPTION = AttentionOption()
