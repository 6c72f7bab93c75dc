"""The registry of options: the one `Option` object (bertaccel/option.py) each config group or
block registers in the module that is its home, and the cross-section rules (options/rules.py).

validate() (options/checks.py), skip_reason (options/hardware.py) and the config reference
(options/reference.py) are loops over `options()` and `rules.RULES`; nothing else lists them.
A new config group is its schema in config.py, its folder in conf/, its module with an `OPTION`
and one line in OPTION_MODULES below. A new option of a group (a precision, an optimizer, an
attention kernel) is a YAML file, and at most one module the YAML names.
"""
from __future__ import annotations

import importlib
from typing import Tuple

from bertaccel.option import Option

# The modules holding an OPTION, in the order their problems are said (and their machine checks
# asked: the first that finds one is the run's skip reason).
OPTION_MODULES = ("bertaccel.options.precision", "bertaccel.options.compile", "bertaccel.attention.option",
                  "bertaccel.encoder.option", "bertaccel.options.accumulation", "bertaccel.options.freezing",
                  "bertaccel.options.optimizer", "bertaccel.measure.carbon", "bertaccel.options.hardware",
                  "bertaccel.options.launcher",
                  "bertaccel.options.model", "bertaccel.options.dataset", "bertaccel.options.train",
                  "bertaccel.options.search", "bertaccel.options.cache_dir", "bertaccel.options.tracking")


def options() -> Tuple[Option, ...]:
    """Every registered option, in OPTION_MODULES' order. Imported when asked, not at the top:
    several option modules import torch, and the sweep process imports the checks first."""
    return tuple(importlib.import_module(name).OPTION for name in OPTION_MODULES)


def option(section: str) -> Option:
    """The option of one section (KeyError when none is registered)."""
    found = {o.section: o for o in options()}
    return found[section]
