"""Calibration: the achieved FLOP/s and average power of the finished runs most like a configuration.

The rules, all here:
- A run can calibrate when it finished, logged model_flops and train_time_s, and ran on the
  hardware its profile names (what-if runs, priced as other hardware, are left out).
- Similar = equal in every key of MUST_MATCH and RELAX_ORDER. When no run is, the keys of
  RELAX_ORDER are let go one at a time, first to last, until some run matches; the last one let
  go is the hardware: then each run's time is moved to this hardware through the roofline of the
  configuration's parts (plan/roofline.py: its GEMM share by the peak ratio, its memory-bound share
  by the bandwidth ratio, its launch share unchanged), or, where a profile lacks a ceiling the
  roofline needs or the parts cannot be counted, by the ratio of the two profiles' peak TFLOP/s
  for the configuration's precision (the same MFU assumed), said so in the basis. Where two or more
  runs on one source hardware differ in FLOPs per step, fit.py's per-step overhead over them is
  their launch part instead of the roofline's estimate. MUST_MATCH is never let go: another model
  shape, precision, attention kernel or compile mode is another speed.
- The matching runs are pooled: achieved FLOP/s per GPU = sum(model_flops) / sum(train_time_s x
  num_gpus) (a time-weighted mean), power per GPU = sum(energy) / sum(train_time_s x num_gpus)
  over those that measured energy; num_gpus other than the configuration's (only once num_gpus
  is let go) scale linearly.
- No such run: the hardware profile, at DEFAULT_MFU of its peak and POWER_UTILISATION x its TDP.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from bertaccel.measure.flops import peak_tflops
from bertaccel.record.readings import run_waits
from bertaccel.record.run_record import run_settings

from .fit import fit_overhead
from .roofline import Parts, Uncounted, transfer

# Keys (run settings, as record.open_tracker logs them: record.run_settings) that must be equal.
MUST_MATCH = ("model.hidden_size", "model.num_hidden_layers", "model.num_attention_heads", "model.intermediate_size",
              "precision", "attention", "compile.mode", "compile.step_graph")
# Keys that should be equal, let go in this order when no run matches them all.
RELAX_ORDER = ("optimizer", "accumulation", "train.batch_size", "freezing", "dataset.max_length",
               "train.gradient_checkpointing", "num_gpus", "hardware")
# The fallback without a similar run. A guess, and said to be one wherever it is used: BERT
# fine-tuning with dynamic padding at batch 16-64 reaches roughly this share of the dense peak.
DEFAULT_MFU = 0.30
# Average board power while training, as a share of the TDP, for a GPU no run has measured.
POWER_UTILISATION = 0.75


def _norm(key: str, value: Any) -> str:
    text = "null" if value is None else str(value)
    if key == "compile.mode" and text.lower() in ("false", "off"):
        return "off"  # YAML 1.1 reads a bare off as false
    return text


def similarity_key(params: Mapping[str, Any], hardware: str) -> Dict[str, str]:
    """The comparable part of a configuration (or of a run's params) and its hardware profile."""
    key = {k: _norm(k, params.get(k)) for k in MUST_MATCH + RELAX_ORDER if k != "hardware"}
    key["hardware"] = hardware
    return key


@dataclass
class Reference:
    """A finished run that can calibrate."""
    run_id: str
    name: str
    key: Dict[str, str]
    model_flops: float
    train_time_s: float
    num_gpus: int
    energy_kwh: Optional[float]
    optimizer_steps: Optional[float] = None  # (fit.py: a per-step overhead needs the steps)
    waits: Dict[str, Any] = field(default_factory=dict)  # what the user waited for (wall.py: WAIT_METRICS, tags)


def references(runs: Sequence[Any]) -> List[Reference]:
    """The runs (MLflow Run objects) that can calibrate, oldest first."""
    out = []
    for r in runs:
        tags, m, p = r.data.tags, r.data.metrics, run_settings(r)
        hardware = tags.get("hardware_profile", "")
        if (tags.get("status") != "finished" or tags.get("bertaccel.role") == "sweep" or not hardware
                or "hardware_what_if" in tags or hardware.endswith("(what-if)")):
            continue
        flops, seconds = m.get("model_flops"), m.get("train_time_s")
        if not flops or not seconds or flops <= 0 or seconds <= 0:
            continue
        try:
            gpus = int(p.get("num_gpus", "1"))
        except ValueError:
            continue
        out.append(Reference(r.info.run_id, r.info.run_name or r.info.run_id, similarity_key(p, hardware),
                             float(flops), float(seconds), gpus, m.get("energy_kwh"), m.get("optimizer_steps"),
                             run_waits(r)))
    return out


def most_similar(refs: Sequence[Reference], key: Mapping[str, str]) -> Tuple[List[Reference], List[str]]:
    """(the matching runs, the keys let go to find them); ([], ...) when none shares MUST_MATCH."""
    for i in range(len(RELAX_ORDER) + 1):
        kept = MUST_MATCH + RELAX_ORDER[i:]
        hits = [r for r in refs if all(r.key[k] == key[k] for k in kept)]
        if hits:
            return hits, list(RELAX_ORDER[:i])
    return [], list(RELAX_ORDER)


@dataclass
class Calibration:
    tflops_per_gpu: Optional[float]   # achieved, on the target hardware
    power_w_per_gpu: Optional[float]
    basis: str                        # where tflops_per_gpu came from (run names, or "profile: ...")
    power_basis: str                  # where power came from, or why it is null
    run_ids: List[str] = field(default_factory=list)
    # fit.py: per optimizer step, apart from the FLOPs (0: not told apart, all in tflops_per_gpu)
    overhead_ms_per_step: float = 0.0


def _names(refs: Sequence[Reference], limit: int = 4) -> str:
    shown = ", ".join(f"{r.name} ({r.run_id[:8]})" for r in refs[:limit])
    return shown + (f" and {len(refs) - limit} more" if len(refs) > limit else "")


def _profile_power(profile: Mapping[str, Any]) -> Tuple[Optional[float], str]:
    tdp = profile.get("tdp_w")
    if tdp is None:
        return None, f"null: no run measured energy and profile '{profile['name']}' has no tdp_w"
    return (POWER_UTILISATION * float(tdp),
            f"profile '{profile['name']}': {POWER_UTILISATION:g} x tdp_w {tdp:g} W (assumed utilisation)")


def calibrate(refs: Sequence[Reference], key: Mapping[str, str], profile: Mapping[str, Any],
              profiles: Mapping[str, Mapping[str, Any]], precision: str,
              parts: Optional[Callable[[], Parts]] = None) -> Calibration:
    """key: the configuration's similarity_key (its hardware = profile['name']); profiles: every
    hardware profile by name (the ceilings of runs on other hardware); precision: its mfu_peak;
    parts: the configuration's roofline parts (roofline.parts_of), asked only when runs on other
    hardware are all there is; it may raise roofline.Uncounted. None: the peak ratio only."""
    hits, relaxed = most_similar(refs, key)
    peak, peak_source = peak_tflops(profile, precision)
    same_hw = [r for r in hits if r.key["hardware"] == key["hardware"]]
    if hits and same_hw:
        rate = sum(r.model_flops for r in hits) / sum(r.train_time_s * r.num_gpus for r in hits) / 1e12
        let_go = f"; let go: {', '.join(relaxed)}" if relaxed else ""
        basis = f"runs: {_names(hits)}{let_go}"
    elif hits:
        moved = _other_hardware(hits, profile, profiles, precision, peak, parts)
        if moved is None:
            return _from_profile(profile, precision, peak, peak_source,
                                 f"similar runs only on other hardware ({_names(hits, 2)}) whose peak_tflops_"
                                 f"{precision} ratio to '{profile['name']}' is unknown")
        rate, how = moved
        basis = f"runs: {_names(hits)} on other hardware, {how}{'; let go: ' + ', '.join(relaxed)}"
    else:
        return _from_profile(profile, precision, peak, peak_source, "no similar finished run")
    # Power only from runs on this hardware that measured energy; else the profile's TDP.
    metered = [(r, r.energy_kwh) for r in same_hw if r.energy_kwh is not None and r.energy_kwh > 0]
    power: Optional[float]
    if metered:
        power = sum(kwh * 3.6e6 for _, kwh in metered) / sum(r.train_time_s * r.num_gpus for r, _ in metered)
        power_basis = f"runs: {_names([r for r, _ in metered])}"
    else:
        power, power_basis = _profile_power(profile)
    return Calibration(rate, power, basis, power_basis, [r.run_id for r in hits])


def _other_hardware(hits: Sequence[Reference], profile: Mapping[str, Any], profiles: Mapping[str, Mapping[str, Any]],
                    precision: str, peak: Optional[float], parts: Optional[Callable[[], Parts]]
                    ) -> Optional[Tuple[float, str]]:
    """(achieved TFLOP/s per GPU here, how the runs' times were moved) or None when no run's can be:
    each run's time through the roofline, else x (its peak / this peak), the same MFU assumed."""
    counted, why_not = None, "the configuration's parts were not given"
    if parts is not None:
        try:
            counted = parts()
        except Uncounted as e:
            why_not = str(e)
    overhead_ms = _overhead_per_step(hits)
    flops, seconds, hows = 0.0, 0.0, []
    for r in hits:
        there = profiles.get(r.key["hardware"], {"name": r.key["hardware"]})
        moved = None
        overhead_s = (overhead_ms[r.key["hardware"]] / 1e3 * r.optimizer_steps
                      if r.key["hardware"] in overhead_ms and r.optimizer_steps else None)
        if counted is not None:
            try:
                moved, how = transfer(r.train_time_s, counted, there, profile, precision, overhead_s)
            except Uncounted as e:
                why_not = str(e)
        if moved is None:
            theirs, _ = peak_tflops(there, precision)
            if peak is None or theirs is None:
                continue
            moved = r.train_time_s * theirs / peak
            how = (f"FLOP/s x peak_tflops_{precision} ratio {peak:g}/{theirs:g} ({profile['name']}/{there['name']}) "
                   f"(assumes the same MFU there; no roofline: {why_not})")
        flops += r.model_flops
        seconds += moved * r.num_gpus
        hows.append(how)
    if not seconds:
        return None
    shown = sorted(set(hows))  # (a measured overhead gives each run its own shares)
    return flops / seconds / 1e12, " | ".join(shown[:2]) + (f" | and {len(shown) - 2} more" if len(shown) > 2 else "")


def _overhead_per_step(hits: Sequence[Reference]) -> Dict[str, float]:
    """Source hardware -> the per-step overhead (ms) fit.py tells apart over its runs (two or more that
    differ in FLOPs per step); the roofline keeps it as their launch part, the host's, not the GPU's."""
    out = {}
    for hardware in {r.key["hardware"] for r in hits}:
        points = [(r, r.optimizer_steps) for r in hits if r.key["hardware"] == hardware and r.optimizer_steps]
        if len(points) >= 2:
            fit = fit_overhead([r.model_flops / r.num_gpus for r, _ in points], [r.train_time_s for r, _ in points],
                               [steps for _, steps in points])
            if fit.overhead_ms > 0:
                out[hardware] = fit.overhead_ms
    return out


def _from_profile(profile: Mapping[str, Any], precision: str, peak: Optional[float], peak_source: str,
                  why: str) -> Calibration:
    power, power_basis = _profile_power(profile)
    if peak is None:
        return Calibration(None, power, f"null: {why}, and {peak_source} for a default MFU", power_basis)
    return Calibration(DEFAULT_MFU * peak, power, f"profile '{profile['name']}': {why}; default MFU "
                       f"{DEFAULT_MFU:g} x peak_tflops_{precision} {peak:g}", power_basis)
