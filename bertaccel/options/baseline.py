"""The user's baseline: what `python -m bertaccel.run` trains with no override, as the techniques a
sweep compares (conf/config.yaml's defaults of the technique groups; accumulation and the batch
size; and the default of every other setting a sweep varies, a learning rate say). A sweep adds
a run with them where none has them (runs/sweep_jobs.py), and the report measures its speed-ups
against that run (report/baseline.py): against what the user runs today, not against the slowest
run of the grid.

Like with like: one baseline per context (LIKE_FOR_LIKE: the model, the dataset, the hardware
profile and the GPU count; a run is never measured against another model's baseline). The sweep
adds one per context it trains and the report picks one per context, both from this one list.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Dict, Optional

import yaml

from bertaccel.config import CONF_DIR, CONTEXT_GROUPS, GROUPS, TECHNIQUE_GROUPS

# What is trained, where and on how many GPUs: runs that differ here are never compared as like.
LIKE_FOR_LIKE = CONTEXT_GROUPS + ("num_gpus",)


def _config_yaml() -> Dict[str, Any]:
    loaded: Dict[str, Any] = yaml.safe_load((CONF_DIR / "config.yaml").read_text())
    return loaded


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
    defaults, config/, unless config.yaml sets one): among runs with the default group choices
    the one that also kept these is the defaults run (a thesis grid's batch 8 run is not what the
    user runs today)."""
    from bertaccel.config import RunConfig, TrainConfig

    conf = _config_yaml()
    return {"accumulation": int(conf.get("accumulation", RunConfig.accumulation)),
            "num_gpus": int(conf.get("num_gpus", RunConfig.num_gpus)),
            "batch_size": int((conf.get("train") or {}).get("batch_size", TrainConfig.batch_size))}


def defaults_wanted() -> Dict[str, str]:
    """What on_defaults compares a job with first: the technique groups' defaults and accumulation's."""
    return {**default_choices(), "accumulation": str(top_level_defaults()["accumulation"])}


def on_defaults(given: Dict[str, str], wanted: Optional[Dict[str, str]] = None) -> bool:
    """Whether a job whose overrides set these keys ({'precision': 'fp16', 'optimizer.lr': '1e-4',
    ...}, those a baseline takes off: runs/sweep_jobs.py) trains on the defaults: the technique
    groups' defaults, accumulation's, and the default of every other setting given. A key it
    leaves alone keeps its default; a setting whose default is not known is taken as not the
    default (the sweep then adds its baseline, which the plan runs once if it is that job).
    wanted: defaults_wanted(), read once by a caller that asks for many jobs (it parses
    conf/config.yaml: twice per job was 40 s before a 10,000-job sweep's first line)."""
    wanted = defaults_wanted() if wanted is None else wanted
    if any(str(given.get(k, v)) != v for k, v in wanted.items()):
        return False
    for key, value in given.items():
        if key not in wanted:
            want = default_of(key)
            if want is None or norm(value) != want:
                return False
    return True


def norm(v: Any) -> Optional[str]:
    """A value as settings are compared: 8, '8' and 8.0 alike; 1e-4 as 0.0001; None or '' as None."""
    if v is None or v == "":
        return None
    if isinstance(v, bool):
        return str(v).lower()
    try:
        x = float(v)
    except (TypeError, ValueError):
        return str(v)
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


@lru_cache(maxsize=None)  # (a pure function of the key and the package's own conf files; asked per sweep job)
def default_of(key: str) -> Optional[str]:
    """What `python -m bertaccel.run` trains with for key ('null' where that is null), or None
    when not known."""
    from bertaccel.config import RunConfig

    node: Any = _config_yaml()
    # Every group's default option (model, dataset and hardware too: a sweep may vary them).
    groups = {g: str(o) for item in node["defaults"] if isinstance(item, dict) for g, o in item.items() if g in GROUPS}
    if key in groups:
        return norm(groups[key])
    head, _, rest = key.partition(".")
    if head in groups and rest:  # a group's own setting: in its default option's file
        path = CONF_DIR / head / f"{groups[head]}.yaml"
        node, key = (yaml.safe_load(path.read_text()) if path.is_file() else {}), rest
        node = node if _has(node, key) else getattr(RunConfig(), head)  # (not in the file: the schema's default)
    elif not _has(node, key):
        node = RunConfig()
    if not _has(node, key):
        return None
    for part in key.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    return "null" if node is None else (norm(node) if isinstance(node, (str, int, float, bool)) else None)


def _has(node: Any, dotted: str) -> bool:
    for part in dotted.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif not isinstance(node, dict) and hasattr(node, part):
            node = getattr(node, part)
        else:
            return False
    return True
