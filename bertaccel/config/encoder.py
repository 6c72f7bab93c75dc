"""encoder=<name>: the BERT layer the encoder runs. Its option: bertaccel/encoder/option.py."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EncoderConfig:
    """The BERT layer the encoder runs: Hugging Face's BertLayer (hf), or ours (fused,
    bertaccel/encoder/) with LightSeq's techniques, each a switch here so that each one can be
    measured on and off. Options in conf/encoder/; checks and machine check in bertaccel/encoder/option.py."""
    name: str = "hf"                   # the option that set this group (encoder=<name>)
    layer: str = "hf"                  # Which layer the encoder runs: hf | fused
    # Run the layers on the batch's real tokens only (no work on padding); false: on every padded
    # token (each row's padding a sequence of its own, so results are the same). Fused layer only.
    packed: bool = True
    # Run bias+GELU and bias+dropout+residual+LayerNorm as our Triton kernels; false: the same
    # arithmetic as PyTorch ops (a kernel each), for the on/off measurement. Fused layer only.
    fused_kernels: bool = True
    # Keep the model's parameters in the half dtype and their fp32 copies inside the optimizer's
    # flat buffers, so no weight is cast per step. Fused layer only, with precision fp16/bf16 and an
    # optimizer that keeps fp32 master weights (`master_weights` on its class).
    half_params: bool = True
