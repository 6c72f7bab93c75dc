"""validate(): every setting of a run checked before any work, the first bad one raised as a
ConfigError in one line that names it and says how to fix it. The schema it checks, and the
option lists, are config.py's; an option with settings of its own checks them in its own module
(precision, attention, optimizer, carbon, search), called from here."""
from __future__ import annotations

import math
import os
from dataclasses import MISSING
from pathlib import Path
from typing import Any, Iterator, Optional, Tuple

from omegaconf import DictConfig, ListConfig, OmegaConf

from bertaccel.config import (COMPILE_CACHES, COMPILE_MODES, DATASET_SOURCES, DEVICES, FREEZINGS, LAUNCHERS, LR_SCHEDULES,
                     MODEL_SHAPE_FIELDS, MODEL_SOURCES, SCALE_LR, START_METHODS, ConfigError, schema_fields)


def _refuse(why: Optional[str]) -> None:
    """An option's own check says why it cannot run (or None): that is the run's one line."""
    if why:
        raise ConfigError(why)


def _one_of(where: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ConfigError(f"{where}={value!r} is not one of {', '.join(allowed)}")


def _leaves(node: Any, key: str = "") -> Iterator[Tuple[str, Any]]:
    """Every value of a composed config with its dotted key (list items as key[i])."""
    if isinstance(node, DictConfig):
        for k in node.keys():
            if not OmegaConf.is_missing(node, k):  # (??? : a required value, refused by its own check)
                yield from _leaves(node[k], f"{key}.{k}" if key else str(k))
    elif isinstance(node, ListConfig):
        for i in range(len(node)):
            yield from _leaves(node[i], f"{key}[{i}]")
    else:
        yield key, node


def _finite_everywhere(cfg: Any) -> None:
    """No NaN or infinity anywhere, schema field or an option's own setting (optimizer.impl's betas,
    eps ...): a range check cannot catch NaN (every comparison with it is false), and no setting
    here means anything by one: a timeout or a limit of inf would read as "none" by accident."""
    defaults = {key: f.default for key, f in schema_fields()}
    for key, value in _leaves(cfg):
        if isinstance(value, float) and not math.isfinite(value):
            example = defaults.get(key, MISSING)
            hint = (f", e.g. {key}={example:g}" if isinstance(example, (int, float)) and not isinstance(example, bool)
                    else f", or null ({key}=null)" if example is None else "")
            raise ConfigError(f"{key}={value!r} is not a finite number; give a finite value{hint}")


def _declared_ranges(cfg: Any) -> None:
    """Every numeric field's range, declared on the field in config.py (`bounded`)."""
    for key, f in schema_fields():
        declared = f.metadata.get("range")
        if declared is not None:
            _refuse(declared.refusal(key, OmegaConf.select(cfg, key)))


def _writable_dir(key: str, value: str) -> None:
    """A directory the run may create and write into (cache_dir), checked without creating
    anything: its nearest existing part must be a directory this user can write. Otherwise the
    first cache write fails inside the run's process, after its MLflow run was opened."""
    path = Path(os.path.expanduser(value)).absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    where = "" if existing == path else f" ({existing} exists)"
    if not existing.is_dir():
        raise ConfigError(f"{key}={value}: {existing} is not a directory; give a directory (created if missing)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{key}={value}: cannot be written by this user{where}; give a directory you can write")


def validate(cfg: Any) -> None:
    """Raise ConfigError with one line naming the first bad value and how to fix it."""
    # Every number first: finite, then in its field's declared range; the checks below can then
    # compare, divide and combine values knowing each one is sane on its own.
    _finite_everywhere(cfg)
    _declared_ranges(cfg)
    from bertaccel.options.precision import check_precision  # the option's own settings, checked where they are used

    _refuse(check_precision(cfg.precision))
    from bertaccel.attention.option import check_attention

    _refuse(check_attention(cfg.attention))
    _one_of("compile.mode", cfg.compile.mode, COMPILE_MODES)
    _one_of("compile.cache", cfg.compile.cache, COMPILE_CACHES)
    if cfg.compile.step_graph:
        from bertaccel.train.step_graph import unsupported

        _refuse(unsupported(cfg))
    if cfg.accumulation != "adaptive" and (isinstance(cfg.accumulation, bool) or not isinstance(cfg.accumulation, int)
                                           or cfg.accumulation < 1):
        raise ConfigError(f"accumulation={cfg.accumulation!r} must be an integer >= 1 or adaptive")
    if cfg.accumulation == "adaptive":
        if cfg.num_gpus > 1:
            raise ConfigError("accumulation=adaptive needs num_gpus=1: the ranks would measure different "
                              "variances, and DDP's all-reduce inside the last backward hides each micro-batch's gradient")
        if cfg.compile.step_graph:
            raise ConfigError("accumulation=adaptive with compile.step_graph=true: the captured step cannot "
                              "read each micro-batch's gradient; use compile.step_graph=false")
    _one_of("freezing.name", cfg.freezing.name, FREEZINGS)
    opt = cfg.optimizer
    _one_of("optimizer.schedule", opt.schedule, LR_SCHEDULES)
    _one_of("optimizer.scale_lr", opt.scale_lr, SCALE_LR)
    from bertaccel.options.optimizer import check_optimizer  # the option's own class checks its settings

    _refuse(check_optimizer(opt, capturable=False) or (check_optimizer(opt, capturable=True)
                                                       if cfg.compile.step_graph else None))
    from bertaccel.measure.carbon import check_carbon

    _refuse(check_carbon(cfg.carbon, cfg.hardware.pue))
    if cfg.num_gpus > 1 and cfg.freezing.name != "none":
        raise ConfigError(f"num_gpus={cfg.num_gpus} with freezing={cfg.freezing.name}: DDP registers its gradient "
                          "hooks once, for the parameters trainable at the start; use num_gpus=1 or freezing=none")
    _one_of("launcher.name", cfg.launcher.name, LAUNCHERS)
    _one_of("launcher.start_method", cfg.launcher.start_method, START_METHODS)
    if cfg.launcher.runs_at_once > 1 and cfg.launcher.name == "inline":
        raise ConfigError(f"launcher.runs_at_once={cfg.launcher.runs_at_once} runs configurations side by side, each "
                          "in processes of its own: launcher=inline would run them in one process; use "
                          "launcher=process (the default)")
    if cfg.num_gpus > 1 and cfg.launcher.name == "inline":
        raise ConfigError(f"num_gpus={cfg.num_gpus} needs a process per rank: launcher=inline runs in the sweep's "
                          "own process; use launcher=process (the default)")
    _one_of("model.source", cfg.model.source, MODEL_SOURCES)
    if cfg.model.source in ("package", "hub") and not cfg.model.pretrained:
        raise ConfigError(f"model={cfg.model.name} (source={cfg.model.source}) needs model.pretrained")
    if cfg.model.source == "random_init" and not cfg.model.tokenizer_package:
        raise ConfigError(f"model={cfg.model.name} (random_init) needs model.tokenizer_package")
    from bertaccel.model import check_model

    _refuse(check_model(cfg.model))
    if cfg.model.source == "random_init":
        for k in MODEL_SHAPE_FIELDS:
            if cfg.model[k] is None:
                raise ConfigError(f"model={cfg.model.name} (random_init) needs model.{k}: a random-init model's "
                                  "shape comes from the config")
        if cfg.model.hidden_size % cfg.model.num_attention_heads:
            raise ConfigError(f"model.hidden_size={cfg.model.hidden_size} must be divisible by "
                              f"model.num_attention_heads={cfg.model.num_attention_heads}")
    else:
        for k in MODEL_SHAPE_FIELDS:
            if cfg.model[k] is not None:
                raise ConfigError(f"model.{k}={cfg.model[k]}: model={cfg.model.name} is pretrained and its weights "
                                  f"fix the shape; drop model.{k}, or use a random_init model (model=tiny, "
                                  "model=bert_base_random)")
    ds = cfg.dataset
    _one_of("dataset.source", ds.source, DATASET_SOURCES)
    if ds.source == "hub" and not ds.hub_id:
        raise ConfigError(f"dataset={ds.name} (source=hub) needs dataset.hub_id")
    if ds.source == "csv" and not (ds.train_path and ds.test_path):
        missing = " and ".join(f"dataset.{k}=..." for k in ("train_path", "test_path") if not ds[k])
        raise ConfigError(f"dataset=csv needs {missing} (CSV files with a header row, plain or .gz; "
                          "relative paths are from the directory you run from)")
    if not ds.text_columns:
        raise ConfigError("dataset.text_columns is empty: name at least one text column")
    tr = cfg.train
    if tr.batch_size != "auto" and (isinstance(tr.batch_size, bool) or not isinstance(tr.batch_size, int)
                                    or tr.batch_size < 1):
        raise ConfigError(f"train.batch_size={tr.batch_size!r} must be an integer >= 1 or auto")
    if tr.batch_size == "auto" and cfg.num_gpus > 1:
        raise ConfigError(f"train.batch_size=auto with num_gpus={cfg.num_gpus}: the search runs in one process; "
                          "use num_gpus=1, or give the batch found by a num_gpus=1 run (metric batch_size_used)")
    _one_of("train.device", tr.device, DEVICES)
    if tr.prefetch_factor is not None and tr.num_workers == 0:
        raise ConfigError(f"train.prefetch_factor={tr.prefetch_factor} needs loader workers: set train.num_workers > 0 "
                          "(without workers batches are made in the training loop, nothing is prefetched)")
    from bertaccel.train.checkpointing import MODES as CHECKPOINTING

    _one_of("train.gradient_checkpointing", tr.gradient_checkpointing, CHECKPOINTING)
    from bertaccel.options.search import check_search

    _refuse(check_search(cfg.search))
    _writable_dir("cache_dir", cfg.cache_dir)
    if not cfg.tracking.uri:
        raise ConfigError("tracking.uri is empty: give an MLflow tracking URI, e.g. sqlite:///mlflow.db")
    # Last, as it may wait on the network (a few seconds at most): a tracking server that cannot be
    # reached is bad input too, said before any work instead of after minutes of MLflow's retries.
    from bertaccel.store import check_store

    check_store(cfg.tracking.uri)
