"""The one module that reaches into Hydra's private and internal APIs (hydra._internal, hydra.core.utils).

They are not Hydra's public API and move between its releases; kept here, a Hydra upgrade that
moves one is a change of this file (tests/test_typed_door.py counts 0 uses anywhere else, in
bertaccel/ and hydra_plugins/ alike). Each name is imported when first asked (PEP 562's module
__getattr__), not at this module's import: the base layers (store/, train/) ask for env_override
only, Hydra's plugins import this module for any app of the environment, and hydra._internal
costs its import only where a sweep is listed or a command composed.

What each is for:
- env_override: environment variables set for a block and put back (the store's server check,
  the compile caches, preload's CUDA-free imports);
- BasicSweeper: the basic sweeper's own grid (split_arguments), the base of BertaccelSweeper;
- Hydra, create_config_search_path, get_args_parser: Hydra set up, and a command line read, as
  run.py's hydra.main does (runs/command_config.py);
- JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals: a launcher's
  job bookkeeping, as Hydra's own launchers do it (hydra_plugins/bertaccel_launcher).
"""
from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "env_override": "hydra.core.utils",
    "JobReturn": "hydra.core.utils",
    "JobStatus": "hydra.core.utils",
    "configure_log": "hydra.core.utils",
    "filter_overrides": "hydra.core.utils",
    "run_job": "hydra.core.utils",
    "setup_globals": "hydra.core.utils",
    "BasicSweeper": "hydra._internal.core_plugins.basic_sweeper",
    "Hydra": "hydra._internal.hydra",
    "create_config_search_path": "hydra._internal.utils",
    "get_args_parser": "hydra._internal.utils",
}

__all__ = sorted(_WHERE) + ["basic_sweeper_name"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)


def basic_sweeper_name() -> str:
    """The dotted name Hydra's config gives its basic sweeper (hydra.sweeper._target_)."""
    return f"{_WHERE['BasicSweeper']}.BasicSweeper"
