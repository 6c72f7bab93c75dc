"""vs_hf.py's bertaccel rows: each --bertaccel spec (space-separated Hydra overrides) run through
the real core, bertaccel.runs.job.execute, in this process beside the other rows, its Outcome's
metrics in the table's columns. bertaccel is imported where it is used: vs_hf_common, which vs_hf.py
imports first, puts the repository on sys.path."""
from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Callable, List

import torch

from vs_hf_table import Row

BERTACCEL_KEYS = ("train_time_s", "step_time_ms", "compile_time_s", "throughput_samples_s", "mfu", "energy_kwh",
                  "peak_memory_gib", "train_loss", "test_accuracy", "optimizer_steps")


def compose(overrides: List[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from bertaccel.config import CONF_DIR

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return hydra_compose(config_name="config", overrides=overrides)
    finally:
        GlobalHydra.instance().clear()


def bertaccel_part(index: int, spec: str, store_uri: Callable[[], str], device: torch.device) -> Row:
    from bertaccel.config import GROUPS, register_configs
    from bertaccel.runs.job import execute
    from bertaccel.record.run_record import run_label

    overrides = shlex.split(spec)
    keys = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    if "tracking.uri" not in keys:
        overrides.append(f"tracking.uri={store_uri()}")
    if "train.device" not in keys:  # the same device as the other rows unless the spec says otherwise
        overrides.append(f"train.device={device.type}")
    # The row runs in this process (execute, below), beside the rungs and the other rows: inline,
    # so the run resets dynamo and the allocator around itself as an inline sweep run does.
    if "launcher.name" not in keys:
        overrides.append("launcher.name=inline")
    name = f"vs_hf {run_label(overrides)}"
    # Paths shortened to file names in the table; the MLflow run keeps them whole.
    shown = [f"{o.split('=', 1)[0]}={Path(o.split('=', 1)[1]).name}" if o.split("=", 1)[0].endswith("_path") else o
             for o in overrides]
    row = Row(f"bertaccel {index}", "bertaccel: " + run_label(shown).replace(",", " "))
    register_configs()
    from bertaccel.options.checks import validate

    cfg = validate(compose(overrides))  # (job.execute takes the typed RunConfig: runs/checked.py)
    choices = {k: v for k, v in (o.split("=", 1) for o in overrides if "=" in o) if k in GROUPS}
    outcome = execute(cfg, choices, name, started_at=time.time(), started_source="vs_hf.py row start")
    if outcome.status != "finished":
        row.notes.append(f"{outcome.status}: {outcome.reason}")
        return row
    m = {k: outcome.metrics.get(k) for k in BERTACCEL_KEYS}
    if m["step_time_ms"] is not None:
        row.cells["ms/step"] = m["step_time_ms"]
    if m["train_time_s"] is not None:
        row.cells["s/epoch"] = m["train_time_s"] / cfg.train.epochs
    row.cells["samples/s"] = m["throughput_samples_s"]
    row.cells["MFU"] = m["mfu"]
    row.cells["kJ"] = None if m["energy_kwh"] is None else m["energy_kwh"] * 3600
    row.cells["peak GiB"] = m["peak_memory_gib"]
    row.cells["warm-up s"] = m["compile_time_s"]
    row.cells["final loss"] = m["train_loss"]
    row.cells["accuracy"] = m["test_accuracy"]
    if m["mfu"] is None:
        row.notes.append("MFU/kJ missing: see the run's *_source tags")
    if cfg.train.epochs != 1:
        row.notes.append(f"s/epoch = train_time_s / {cfg.train.epochs} epochs")
    if m["optimizer_steps"] is not None:
        row.notes.append(f"{int(m['optimizer_steps'])} steps")
    row.notes.append(f"mlflow run {outcome.run_id}")
    return row
