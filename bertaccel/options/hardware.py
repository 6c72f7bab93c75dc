"""The machine a run lands on: its device, its hardware profile, and what it can run.

Two kinds of "cannot": a request the machine can never satisfy (a GPU that is not there, more
GPUs than visible) is a ConfigError before any work; a combination this machine cannot run
(fp16 on a CPU, compile without a compiler) makes the run "skipped" with the reason, so a sweep
records it and goes on.
"""
from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Union

import torch

from bertaccel.config import CONF_DIR, ConfigError, HardwareConfig, first_line
from bertaccel.option import Option, problems

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from bertaccel.config import RunConfig

PROFILES_DIR = CONF_DIR / "hardware"


def resolve_device(requested: str) -> torch.device:
    if requested == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", 0)
    if requested == "cuda":
        raise ConfigError("train.device=cuda but no CUDA GPU is visible (torch.cuda.is_available() "
                          "is False); use train.device=cpu or train.device=auto")
    return torch.device("cpu")


def check_gpu_count(num_gpus: int, device: torch.device) -> None:
    """num_gpus counts accelerators, one rank each. On the CPU, num_gpus=N runs N gloo processes
    sharing the cores: it checks the data-parallel logic, it does not speed anything up."""
    visible = torch.cuda.device_count() if device.type == "cuda" else 0
    if device.type == "cuda" and num_gpus > visible:
        raise ConfigError(f"num_gpus={num_gpus} but only {visible} GPU(s) are visible; "
                          f"use num_gpus={visible} or fewer")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu: {model or 'unknown'} ({torch.get_num_threads()} threads)"


def _name_tokens(name: str) -> List[str]:
    return [t.lower() for t in re.split(r"[\s\-_/]+", name) if t]


def match_profile(name: str, profiles: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The profile one of whose `match` entries equals a whole token of the device name
    (token match, so that "A10" does not catch an "A100")."""
    tokens = set(_name_tokens(name))
    for prof in profiles:
        if any(m.lower() in tokens for m in prof.get("match", [])):
            return prof
    return None


def load_profiles() -> List[Dict[str, Any]]:
    """Every profile of conf/hardware, read through the same schema (HardwareConfig) that Hydra
    applies to hardware=<name>: hardware=auto cannot accept a profile that hardware=<name> would
    refuse, or read a field the schema does not know."""
    from omegaconf import DictConfig, OmegaConf

    from bertaccel.config import HardwareConfig
    from bertaccel.options.checks import out_of_range

    profiles: List[Dict[str, Any]] = []
    for path in sorted(PROFILES_DIR.glob("*.yaml")):
        try:
            node = OmegaConf.merge(OmegaConf.structured(HardwareConfig), OmegaConf.load(path))
        except Exception as e:  # noqa: BLE001 - OmegaConf's ValidationError and YAML errors alike
            key = getattr(e, "full_key", None)
            raise ConfigError(f"conf/hardware/{path.name}: {f'{key}: ' if key else ''}{first_line(e)}") from None
        if not isinstance(node, DictConfig):  # (a merge onto the structured schema is one; a list would not merge)
            raise ConfigError(f"conf/hardware/{path.name}: not a mapping of HardwareConfig's fields")
        # The ranges declared on the schema's fields, as validate() applies them to hardware=<name>:
        # --hardware in the plan reads every profile here, never through validate().
        for why in out_of_range(node, HardwareConfig)[:1]:
            raise ConfigError(f"conf/hardware/{path.name}: {why}")
        if node.name != "auto":
            profiles.append(_plain(node))
    return profiles


def _plain(node: DictConfig) -> Dict[str, Any]:
    """A profile node as the plain dict a run and the record read (its keys: HardwareConfig's fields)."""
    from omegaconf import OmegaConf

    container = OmegaConf.to_container(node)
    if not isinstance(container, dict):  # (OmegaConf types it as any container; a DictConfig's is a dict)
        raise TypeError(f"a profile is a mapping, not {type(container).__name__}")
    return {str(k): v for k, v in container.items()}


def profile_mismatch(prof: Mapping[str, Any], name: str, device_type: str) -> Optional[str]:
    """Why a profile does not describe the device a run uses (device_name()), or None if it does:
    one of its `match` entries is a token of the device name, or, on a CPU, it is the profile
    hardware=auto takes there ('cpu'). Its price and peaks would misstate cost and MFU otherwise."""
    if match_profile(name, [dict(prof)]) is not None or (device_type == "cpu" and prof["name"] == "cpu"):
        return None
    match = list(prof.get("match") or [])
    meant = "/".join(match) if match else ("a CPU" if prof["name"] == "cpu" else "no device (its match list is empty)")
    if device_type == "cpu":
        fits = "hardware=cpu"
    else:
        found = match_profile(name, load_profiles())
        fits = (f"hardware={found['name']}" if found else
                "a profile in conf/hardware whose match names this GPU")
    return (f"hardware={prof['name']} is a profile for {meant}, but this run uses {name!r}: its price and peak "
            f"FLOP/s would misstate cost_usd and mfu; use hardware=auto or {fits}, or hardware.what_if=true to "
            f"price this run as {prof['name']} on purpose (recorded as a what-if)")


def picks_profile(hw: Any) -> bool:
    """hardware=auto: the profile is the one matching the device the run finds."""
    return bool(hw.name == "auto")


def what_if_on_auto(hw: Any) -> Optional[str]:
    """hardware.what_if=true with hardware=auto: auto always matches the device."""
    if picks_profile(hw) and hw.what_if:
        return ("hardware.what_if=true needs a named profile (hardware=h100 hardware.what_if=true): "
                "hardware=auto always matches the device")
    return None


def check_hardware(hw: Any) -> List[str]:
    """Why these hardware settings cannot work on any device, one line each."""
    pue = None
    if hw.pue is not None and not hw.pue >= 1.0:
        pue = (f"hardware.pue={hw.pue!r} must be >= 1 (total facility energy / IT energy); leave it null "
               "to count the IT energy alone")
    return problems(what_if_on_auto(hw), pue)


class HardwareOption(Option):
    section, schema = "hardware", HardwareConfig

    def check(self, cfg: "RunConfig") -> List[str]:
        """Refuses hardware.what_if=true with hardware=auto (auto always matches the device: a
        what-if needs a named profile) and a pue below 1. A named profile that does not describe
        the device is refused when the run knows its device (resolve_profile)."""
        return check_hardware(cfg.hardware)


OPTION = HardwareOption()


def resolve_profile(hw_cfg: DictConfig, device: torch.device) -> tuple[Dict[str, Any], str]:
    """Returns the profile as a dict and a line saying how it was chosen. A named profile that
    does not match the device is a ConfigError, unless hardware.what_if=true. The dict's
    `what_if` says whether the run is one: true only for a profile used on a device it does not match."""
    name = device_name(device)
    if not picks_profile(hw_cfg):
        prof: Dict[str, Any] = {str(k): hw_cfg[k] for k in hw_cfg}
        why = profile_mismatch(prof, name, device.type)
        if why is None:
            prof["what_if"] = False  # the profile describes this device: what_if=true changed nothing
            return prof, f"hardware={hw_cfg.name} (as configured)"
        if not hw_cfg.what_if:
            raise ConfigError(why)
        return prof, f"hardware={hw_cfg.name} as a what-if (hardware.what_if=true) on {name!r}"
    why = what_if_on_auto(hw_cfg)  # (the plan resolves a profile without validate())
    if why:
        raise ConfigError(why)
    if device.type == "cpu":
        prof = next(p for p in load_profiles() if p["name"] == "cpu")
        return prof, f"hardware=auto: no GPU, using profile 'cpu' for {name}"
    matched = match_profile(name, load_profiles())
    if matched is None:
        raise ConfigError(f"hardware=auto: no profile in conf/hardware matches GPU {name!r}; "
                          "pick one with hardware=<name> or add a profile there")
    return matched, f"hardware=auto: detected {name!r}, using profile '{matched['name']}'"


@dataclass
class Capabilities:
    cpu_native_bf16: bool
    cxx_compiler: Optional[str]
    triton: bool


def cpu_has_native_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return bool(re.search(r"\b(avx512_bf16|amx_bf16)\b", flags))


def probe() -> Capabilities:
    import importlib.util

    return Capabilities(cpu_native_bf16=cpu_has_native_bf16(),
                        cxx_compiler=shutil.which("g++") or shutil.which("c++") or shutil.which("clang++"),
                        triton=importlib.util.find_spec("triton") is not None)


def skip_reason(cfg: Union[DictConfig, RunConfig], device: torch.device, caps: Capabilities) -> Optional[str]:
    """Why this machine cannot run this combination, or None if it can: the first registered
    option's machine check that finds a reason (options/registry.py), else the first machine rule
    between sections that does (options/rules.py: asked once each section it reads runs here)."""
    from bertaccel.options.checks import typed
    from bertaccel.options.registry import options
    from bertaccel.options.rules import rules_at

    run = typed(cfg)
    return next((why for option in options() for why in [option.unusable(run, device, caps)] if why),
                next((why for rule in rules_at("machine") for why in [rule.refusal(run, device, caps)] if why), None))
