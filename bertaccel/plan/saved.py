"""The plan of a sweep, saved where its runs find it: cache_dir/plan/<sweep id>.json.

`python -m bertaccel.plan` writes it (the sweep id is the one `bertaccel.run -m` gives the same
command line: grid.py); each run of that sweep logs the plan's prediction of its configuration
as its own (hook.py), so the report compares what was predicted before the sweep with what the
sweep measured. A later plan of the same sweep replaces the file; a sweep never planned has none.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from ..option import user_path
from .pricing import PREDICTED, PREDICTED_WAIT


def plan_path(cache_dir: str, sweep_id: str) -> Path:
    return user_path(cache_dir) / "plan" / f"{sweep_id}.json"  # (from any working directory)


def save_plan(cache_dir: str, sweep_id: str, preds: Sequence[Any], sweep_wall_s: Optional[float]) -> Path:
    """preds: the plan's predictions on the sweep's own hardware (one per configuration)."""
    made_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    runs: Dict[str, Dict[str, Any]] = {}
    for p in preds:
        if not p.config_hash:
            continue
        runs[p.config_hash] = {
            "name": p.name, "made_at": made_at, "basis": p.basis, "power_basis": p.power_basis,
            **{k: p.get(k) for k in PREDICTED + PREDICTED_WAIT},
            "sources": dict(p.wait_basis), "why": dict(p.why)}
    path = plan_path(cache_dir, sweep_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"sweep_id": sweep_id, "made_at": made_at, "sweep_wall_s": sweep_wall_s,
                               "runs": runs}, indent=1))
    os.replace(tmp, path)  # (a run never reads half a file)
    return path


def read_plan(cache_dir: str, sweep_id: str) -> Dict[str, Dict[str, Any]]:
    """config_hash -> the saved prediction ({} without a readable plan)."""
    try:
        runs: Dict[str, Dict[str, Any]] = json.loads(plan_path(cache_dir, sweep_id).read_text()).get("runs", {})
        return runs
    except (OSError, ValueError, AttributeError):
        return {}
