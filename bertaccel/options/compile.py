"""The `compile` option's checks: torch.compile's mode and kernel cache by name, and what
compile.step_graph=true (the whole step replayed from CUDA graphs, bertaccel/train/step_graph.py)
cannot be combined with."""
from __future__ import annotations

from typing import Any, Optional

from bertaccel.config import COMPILE_CACHES, COMPILE_MODES, not_one_of


def check(cfg: Any) -> Optional[str]:
    """validate()'s question to this option (options/checks.py asks every option so)."""
    why = (not_one_of("compile.mode", cfg.compile.mode, COMPILE_MODES)
           or not_one_of("compile.cache", cfg.compile.cache, COMPILE_CACHES))
    if why or not cfg.compile.step_graph:
        return why
    # Imported here: step_graph.py imports torch, and only a step-graph run needs its refusals.
    from bertaccel.train.step_graph import unsupported

    why = unsupported(cfg)
    if why is None and cfg.accumulation == "adaptive":
        # (asked after unsupported, whose num_gpus=1 leaves accumulation's own refusal of
        # adaptive, num_gpus>1 nothing to say first: the first refusal is what it always was)
        return ("accumulation=adaptive with compile.step_graph=true: the captured step cannot "
                "read each micro-batch's gradient; use compile.step_graph=false")
    return why
