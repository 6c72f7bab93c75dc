"""Which options this machine runs: each option of every config group whose registered Option has a
machine check (options/registry.py), and each preset, composed as `python -m bertaccel.run
GROUP=OPTION` composes it, then asked the run's own question, options/hardware.py skip_reason: the
reason a run of it is recorded skipped here, or None."""
from __future__ import annotations

from typing import List, Tuple

from bertaccel.doctor.lines import Line

PRESETS = "preset"  # a group with no Option of its own: its picks are asked through the others'


def machine_checked_groups() -> List[str]:
    """The sections whose Option says why a machine cannot run a choice (unusable overridden)."""
    from bertaccel.option import Option
    from bertaccel.options.registry import options

    return [o.section for o in options() if type(o).unusable is not Option.unusable]


def verdicts() -> List[Tuple[str, str]]:
    """(GROUP=OPTION, why it is skipped here or '') for every option of those groups, then presets."""
    from bertaccel.config import CONF_DIR
    from bertaccel.options.hardware import probe, resolve_device, skip_reason
    from bertaccel.options.reference import Composer

    device, caps = resolve_device("auto"), probe()  # the device a run with train.device=auto gets
    out = []
    with Composer(CONF_DIR, None) as composer:
        for group in machine_checked_groups() + [PRESETS]:
            for choice in composer.options(group):
                cfg, _ = composer.compose([f"{group}={choice}"])
                out.append((f"{group}={choice}", skip_reason(cfg, device, caps) or ""))
    return out


def option_lines() -> List[Line]:
    found = verdicts()
    width = max(len(name) for name, _ in found)
    runs = sum(1 for _, why in found if not why)
    head = Line("options", f"{runs} of {len(found)} run here (python -m bertaccel.run GROUP=OPTION)")
    # One line each, the name padded so the verdicts line up (nvidia-smi style).
    return [head] + [Line("", f"{name:<{width}}  {'skipped: ' + why if why else 'runs'}") for name, why in found]
