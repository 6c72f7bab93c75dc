"""The `encoder` option, in one place: conf/encoder/<name>.yaml holds an option's settings, this
module their validation and the machine check (building: bertaccel/model.py -> encoder/swap.py;
half parameters: train/loop.py asks `half_params`).

hf: Hugging Face's BertLayer. fused: ours (encoder/layer.py), LightSeq's techniques, each one a
switch of the option (packed, fused_kernels, half_params) so that each can be measured on and off.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, List, Optional

import torch

from bertaccel.config import EncoderConfig, not_one_of
from bertaccel.option import Option, problems

if TYPE_CHECKING:
    from bertaccel.config import RunConfig

LAYERS = ("hf", "fused")
# The switches that mean something for layer=fused only, with the value encoder=hf implies.
FUSED_ONLY = {"packed": EncoderConfig.packed, "fused_kernels": EncoderConfig.fused_kernels,
              "half_params": EncoderConfig.half_params}


def is_fused(e: Any) -> bool:
    """encoder=fused's layer (ours), not Hugging Face's BertLayer."""
    return bool(e.layer == "fused")


def runs_fused_kernels(e: Any) -> bool:
    """Whether our fused layer runs its Triton kernels (fused_kernels=false: their arithmetic as
    PyTorch ops, which the plan counts as Hugging Face's layer)."""
    return is_fused(e) and bool(e.fused_kernels)


def check_encoder(e: Any) -> List[str]:
    """Why these settings cannot work anywhere, one line each."""
    if e.layer != "hf":
        return problems(not_one_of("encoder.layer", e.layer, LAYERS))
    return [f"encoder.{key}={getattr(e, key)} applies to encoder=fused only (Hugging Face's layer has no such "
            f"switch); drop it or use encoder=fused" for key, default in FUSED_ONLY.items() if getattr(e, key) != default]


def encoder_unusable(e: Any, device: torch.device) -> Optional[str]:
    """Why this machine cannot run the option (a skip, not bad input), or None. The attention core
    it runs with is a rule between the two sections (options/rules.py fused_encoder_core)."""
    if e.layer != "fused":
        return None
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        return "encoder=fused needs the triton package (pip install triton)"
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return ("encoder=fused needs a CUDA GPU; on a CPU its Triton kernels only run in Triton's interpreter "
                "(TRITON_INTERPRET=1), which is for correctness tests, not training")
    return None


class EncoderOption(Option):
    section, schema = "encoder", EncoderConfig

    def check(self, cfg: "RunConfig") -> List[str]:
        """Refuses a layer other than hf or fused, and a fused-only switch (packed, fused_kernels,
        half_params) changed from its default under layer=hf, which has no such switch. With
        encoder=fused and attention=sdpa, sdpa_backends do not apply (the fused layer calls torch's
        varlen flash / memory-efficient kernels itself, encoder/attention.py): not refused, since
        conf/attention/sdpa.yaml names backends by default."""
        return check_encoder(cfg.encoder)

    def unusable(self, cfg: "RunConfig", device: torch.device, caps: Any) -> Optional[str]:
        """encoder=fused without triton, or off a CUDA GPU (outside Triton's interpreter). With an
        attention core this machine cannot run: a rule (options/rules.py fused_encoder_core)."""
        return encoder_unusable(cfg.encoder, device)


OPTION = EncoderOption()


def half_params(cfg: RunConfig, optimizer_factory: Any) -> bool:
    """Whether the run keeps the model's parameters in the autocast dtype (fp32 masters in the
    optimizer): encoder=fused with half_params, a half precision, and an optimizer whose class
    keeps fp32 master weights of half parameters (`master_weights`). optimizer_factory: the
    option's class, or a partial of it (options/optimizer.py optimizer_class)."""
    cls = getattr(optimizer_factory, "func", optimizer_factory)
    # fp16 with clipping: GradScaler.unscale_ refuses fp16 gradients, and clipping them still scaled
    # overflows the fp16 norm to inf (every gradient then zeroed), so the parameters stay fp32 there.
    clipped_fp16 = cfg.precision.loss_scaling and cfg.optimizer.max_grad_norm is not None
    return (cfg.encoder.layer == "fused" and cfg.encoder.half_params and cfg.precision.autocast_dtype is not None
            and not clipped_fp16 and bool(getattr(cls, "master_weights", False)))
