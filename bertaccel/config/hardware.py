"""hardware=<name>: a device's price, power and peaks. Read by bertaccel/options/hardware.py."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from bertaccel.option import bounded


@dataclass
class HardwareConfig:
    """A GPU's (or CPU's) price, power, peak FLOP/s and memory bandwidth, for a run's cost, energy
    and MFU and the plan's roofline; auto picks the profile that matches the device. Options in
    conf/hardware/; bertaccel/options/hardware.py."""
    name: str = "auto"  # the option that set this group (hardware=<name>)
    # Substrings of torch.cuda.get_device_name() that select this profile under hardware=auto.
    match: List[str] = field(default_factory=list)
    # One GPU's price per hour, for cost_usd
    price_per_gpu_hour_usd: Optional[float] = bounded(None, gt=0, note="null: no cost_usd")
    price_source: str = ""  # Where the price comes from (said with cost_usd)
    # Board power, watts: the plan's energy estimate where no run measured energy
    tdp_w: Optional[float] = bounded(None, gt=0, note="watts; null: unknown")
    # Peak bfloat16 TFLOP/s (dense, datasheet): MFU's denominator (precision.mfu_peak picks which), the roofline
    peak_tflops_bf16: Optional[float] = bounded(None, gt=0, note="null: none, no MFU")
    peak_tflops_fp16: Optional[float] = bounded(None, gt=0, note="null: none, no MFU")  # Peak float16 TFLOP/s
    peak_tflops_fp32: Optional[float] = bounded(None, gt=0, note="null: none, no MFU")  # Peak float32 TFLOP/s
    # Peak memory bandwidth (datasheet, TB/s): the memory-bound kernels' ceiling in the plan's
    # roofline (bertaccel/plan/roofline.py), which moves a time measured on one GPU to another.
    memory_bandwidth_tbps: Optional[float] = bounded(None, gt=0, note="TB/s; null: unknown, no roofline")
    # The host's floor per kernel launch, microseconds: a property of the host and driver more than
    # of the GPU, so no profile sets it; give a measured one here (hardware.kernel_launch_us=3.5).
    kernel_launch_us: Optional[float] = bounded(None, gt=0, note="null: plan/roofline.py's default, 5 us")
    # Use this profile on a device it does not match (hardware.py profile_mismatch), on purpose:
    # "what would this run cost there". The record says so (tag hardware_what_if, and
    # hardware_profile "<name> (what-if)", which the report shows). Not for hardware=auto.
    what_if: bool = False
    # Power usage effectiveness of the data centre (total facility energy / IT energy, >= 1):
    # co2e_kg counts energy_kwh x pue (bertaccel/measure/carbon.py). null: IT energy only, said in the tag.
    pue: Optional[float] = None  # (its range, >= 1, is checked by the hardware option: options/hardware.py)
    pue_source: str = ""  # Where the PUE comes from
