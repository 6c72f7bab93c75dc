"""A prediction: the work of a configuration at a calibrated rate, priced on a hardware profile.

    train_time_s = overhead per step x optimizer steps + model_flops / (TFLOP/s per GPU x 1e12 x num_gpus)
    step_time_ms = train_time_s / optimizer steps x 1000   (a mean; a run logs the median step)
    cost_usd     = train_time_s / 3600 x price_per_gpu_hour_usd x num_gpus   (as job.py prices a run)
    energy_kwh   = power per GPU x num_gpus x train_time_s / 3.6e6
    mfu          = model_flops / (train_time_s x num_gpus) / peak_tflops_<precision>
(the overhead per step: fit.py; 0 where the calibration could not tell it apart)
Each number is null with the reason when an input is.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from .calibrate import Calibration
from .work import Work

PREDICTED = ("step_time_ms", "train_time_s", "cost_usd", "energy_kwh")  # what a run logs as predicted_<name>
# What a user waits for (wall.py), also logged as predicted_<name> by a run and compared by the report.
PREDICTED_WAIT = ("warmup_s", "startup_overhead_s", "eval_time_s", "run_wall_s")


@dataclass
class Prediction:
    name: str
    hardware: str
    precision: str
    num_gpus: int
    config_hash: str = ""
    work: Optional[Work] = None
    achieved_tflops_per_gpu: Optional[float] = None
    mfu: Optional[float] = None
    power_w_per_gpu: Optional[float] = None
    step_time_ms: Optional[float] = None
    train_time_s: Optional[float] = None
    cost_usd: Optional[float] = None
    energy_kwh: Optional[float] = None
    basis: str = ""
    power_basis: str = ""
    why: Dict[str, str] = field(default_factory=dict)  # column -> why it is null
    run_ids: List[str] = field(default_factory=list)
    overhead_ms_per_step: float = 0.0
    # What a user waits for (wall.py fills them; null with the reason in `why` until then)
    warmup_s: Optional[float] = None
    startup_overhead_s: Optional[float] = None
    eval_time_s: Optional[float] = None
    run_wall_s: Optional[float] = None
    wait_basis: Dict[str, str] = field(default_factory=dict)  # column -> where it came from

    def get(self, column: str) -> Optional[float]:
        value: Optional[float] = getattr(self, column)  # (a column: one of the Optional[float] fields)
        return value


def price(name: str, config_hash: str, work: Work, cal: Calibration, profile: Mapping[str, Any],
          precision: str, num_gpus: int) -> Prediction:
    from bertaccel.measure.flops import peak_tflops

    p = Prediction(name, profile["name"], precision, num_gpus, config_hash, work,
                   basis=cal.basis, power_basis=cal.power_basis, run_ids=list(cal.run_ids))
    peak, peak_source = peak_tflops(profile, precision)
    if cal.tflops_per_gpu is None and not cal.overhead_ms_per_step:
        for col in PREDICTED + ("mfu",):
            p.why[col] = cal.basis
        return p
    # The overhead is paid per optimizer step (accumulation=adaptive: at most one per 2 micro-batches).
    steps = work.optimizer_steps or work.micro_batches / num_gpus / 2
    p.overhead_ms_per_step = cal.overhead_ms_per_step
    compute_s = work.model_flops / (cal.tflops_per_gpu * 1e12 * num_gpus) if cal.tflops_per_gpu else 0.0
    p.train_time_s = cal.overhead_ms_per_step / 1e3 * steps + compute_s
    if p.train_time_s <= 0:
        for col in PREDICTED + ("mfu",):
            p.why[col] = f"null: {cal.basis} gives no time"
        p.train_time_s = None
        return p
    p.achieved_tflops_per_gpu = work.model_flops / (p.train_time_s * num_gpus) / 1e12
    p.mfu = p.achieved_tflops_per_gpu / peak if peak else None
    if p.mfu is None:
        p.why["mfu"] = f"null: {peak_source}"
    if work.optimizer_steps:
        p.step_time_ms = p.train_time_s / work.optimizer_steps * 1000
    else:
        p.why["step_time_ms"] = f"null: {work.why_no_steps or 'no optimizer step'}"
    rate = profile.get("price_per_gpu_hour_usd")
    if rate is None:
        p.why["cost_usd"] = f"null: hardware profile '{profile['name']}' has no price_per_gpu_hour_usd"
    else:
        p.cost_usd = p.train_time_s / 3600 * float(rate) * num_gpus
    if cal.power_w_per_gpu is None:
        p.why["energy_kwh"] = cal.power_basis
    else:
        p.power_w_per_gpu = cal.power_w_per_gpu
        p.energy_kwh = cal.power_w_per_gpu * num_gpus * p.train_time_s / 3.6e6
    return p


def unpredicted(name: str, config_hash: str, hardware: str, precision: str, num_gpus: int, why: str) -> Prediction:
    """A configuration nothing can be predicted for (invalid, data or model unavailable)."""
    p = Prediction(name, hardware, precision, num_gpus, config_hash, basis=f"null: {why}")
    for col in PREDICTED + ("mfu",):
        p.why[col] = p.basis
    return p
