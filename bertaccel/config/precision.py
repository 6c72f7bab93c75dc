"""precision=<name>: the number format training computes in. Its option (checks, machine check,
effect): bertaccel/options/precision.py."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class PrecisionConfig:
    """The number format training computes in: float32, autocast to bfloat16 or float16, or fp8 GEMMs.
    Options in conf/precision/; checks and machine check in bertaccel/options/precision.py."""
    name: str = "fp32"                     # the option that set this group (precision=<name>)
    autocast_dtype: Optional[str] = None   # The dtype autocast runs in: float16 | bfloat16 | null (no autocast)
    loss_scaling: bool = False             # Scale the loss with a GradScaler, so small float16 gradients do not underflow
    mfu_peak: str = "fp32"                 # The peak MFU divides by: the hardware profile's peak_tflops_<this>
    fp8_recipe: Optional[str] = None       # torchao float8 training of the Linear layers: tensorwise | rowwise | null (none)
