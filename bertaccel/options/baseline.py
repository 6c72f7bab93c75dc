"""The user's baseline: what `python -m bertaccel.run` trains with no override, as the techniques a
sweep compares (conf/config.yaml's defaults of the technique groups; accumulation, num_gpus and
the batch size). A sweep adds a run with them where none has them (runs/sweep_jobs.py), and the
report measures its speed-ups against that run (report/baseline.py): against what the user runs
today, not against the slowest run of the grid.
"""
from __future__ import annotations

from typing import Dict, Optional

import yaml

from bertaccel.config import CONF_DIR, TECHNIQUE_GROUPS


def _config_yaml() -> dict:
    return yaml.safe_load((CONF_DIR / "config.yaml").read_text())


def default_choices() -> Dict[str, str]:
    """conf/config.yaml's defaults of the technique groups as {group: option}, e.g.
    {'precision': 'fp32', ...}: not model, dataset or hardware, which say what is trained and
    where (a baseline keeps them); the schema entry and Hydra's own overrides are not choices a
    run logs."""
    out = {}
    for item in _config_yaml()["defaults"]:
        if isinstance(item, dict):
            (group, option), = item.items()
            if group in TECHNIQUE_GROUPS:
                out[group] = str(option)
    return out


def top_level_defaults() -> Dict[str, int]:
    """accumulation, num_gpus and the batch size a run composes with no override (the schema's
    defaults, config.py, unless config.yaml sets one): among runs with the default group choices
    the one that also kept these is the defaults run (a thesis grid's batch 8 run is not what the
    user runs today)."""
    from bertaccel.config import RunConfig, TrainConfig

    conf = _config_yaml()
    return {"accumulation": int(conf.get("accumulation", RunConfig.accumulation)),
            "num_gpus": int(conf.get("num_gpus", RunConfig.num_gpus)),
            "batch_size": int((conf.get("train") or {}).get("batch_size", TrainConfig.batch_size))}


def defaults_wanted() -> Dict[str, str]:
    """What on_defaults compares a job with: the technique groups' defaults, accumulation, num_gpus."""
    return {**default_choices(), **{k: str(v) for k, v in top_level_defaults().items() if k != "batch_size"}}


def on_defaults(given: Dict[str, str], wanted: Optional[Dict[str, str]] = None) -> bool:
    """Whether a job whose overrides set these keys ({'precision': 'fp16', ...}) trains on the
    technique groups' defaults (a key it leaves alone keeps its default). wanted: defaults_wanted(),
    read once by a caller that asks for many jobs (it parses conf/config.yaml)."""
    wanted = defaults_wanted() if wanted is None else wanted
    return all(str(given.get(k, v)) == v for k, v in wanted.items())
