"""The registry of options: the one `Option` object (bertaccel/option.py) each config group or
block registers in the module that is its home, and the cross-section rules (options/rules.py).

validate() (options/checks.py), skip_reason (options/hardware.py) and the config reference
(options/reference.py) are loops over `options()` and `rules.RULES`; nothing else lists them.
A new config group is its schema in a module of config/ (its field in RunConfig), its folder in
conf/, its module with an `OPTION` (whose `schema` is that dataclass) and one line in
OPTION_MODULES below. A new option of a group (a precision, an optimizer, an
attention kernel) is a YAML file, and at most one module the YAML names.
"""
from __future__ import annotations

import importlib
from typing import Tuple

from bertaccel.config import section_schema
from bertaccel.option import Option

# The modules holding an OPTION, in the order their problems are said (and their machine checks
# asked: the first that finds one is the run's skip reason).
OPTION_MODULES = ("bertaccel.options.precision", "bertaccel.options.compile", "bertaccel.attention.option",
                  "bertaccel.encoder.option", "bertaccel.options.accumulation", "bertaccel.options.freezing",
                  "bertaccel.options.optimizer", "bertaccel.measure.carbon", "bertaccel.options.hardware",
                  "bertaccel.options.launcher", "bertaccel.options.sweep",
                  "bertaccel.options.model", "bertaccel.options.dataset", "bertaccel.options.train",
                  "bertaccel.options.search", "bertaccel.options.cache_dir", "bertaccel.options.tracking")


def options() -> Tuple[Option, ...]:
    """Every registered option, in OPTION_MODULES' order. Imported when asked, not at the top:
    several option modules import torch, and the sweep process imports the checks first."""
    found = tuple(importlib.import_module(name).OPTION for name in OPTION_MODULES)
    _refuse_wrong_schemas(found)
    return found


def _refuse_wrong_schemas(found: Tuple[Option, ...]) -> None:
    """Each option's `schema` is the dataclass RunConfig types its section with (None for a plain
    setting): the link from an option to its section's module in config/, held true here, where
    every check and the reference first ask for the options, rather than trusted."""
    wrong = [f"{type(o).__module__}.{type(o).__name__}.schema is {getattr(o.schema, '__name__', None)}, "
             f"but RunConfig types {o.section!r} as {getattr(section_schema(o.section), '__name__', None)}"
             for o in found if o.schema is not section_schema(o.section)]
    if wrong:
        raise TypeError("; ".join(wrong))


def option(section: str) -> Option:
    """The option of one section (KeyError when none is registered)."""
    found = {o.section: o for o in options()}
    return found[section]
