"""validate(): every setting of a run checked before any work, the first bad one raised as a
ConfigError in one line that names it and says how to fix it. The schema it checks, and the
option lists, are config.py's; an option with settings of its own checks them in its own module
(precision, attention, optimizer, carbon, search), called from here."""
from __future__ import annotations

from typing import Any, Optional

from .config import (COMPILE_CACHES, COMPILE_MODES, DATASET_SOURCES, DEVICES, FREEZINGS, LAUNCHERS, LR_SCHEDULES,
                     MODEL_SHAPE_FIELDS, MODEL_SOURCES, SCALE_LR, START_METHODS, ConfigError)


def _refuse(why: Optional[str]) -> None:
    """An option's own check says why it cannot run (or None): that is the run's one line."""
    if why:
        raise ConfigError(why)


def _one_of(where: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ConfigError(f"{where}={value!r} is not one of {', '.join(allowed)}")


def _positive(where: str, value: Optional[float], allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if value is None or value <= 0:
        raise ConfigError(f"{where}={value!r} must be > 0")


def validate(cfg: Any) -> None:
    """Raise ConfigError with one line naming the first bad value and how to fix it."""
    from .precision import check_precision  # the option's own settings, checked where they are used

    _refuse(check_precision(cfg.precision))
    from .attention.option import check_attention

    _refuse(check_attention(cfg.attention))
    _one_of("compile.mode", cfg.compile.mode, COMPILE_MODES)
    _one_of("compile.cache", cfg.compile.cache, COMPILE_CACHES)
    if cfg.compile.step_graph:
        from .step_graph import unsupported

        _refuse(unsupported(cfg))
    if cfg.accumulation != "adaptive" and (isinstance(cfg.accumulation, bool) or not isinstance(cfg.accumulation, int)
                                           or cfg.accumulation < 1):
        raise ConfigError(f"accumulation={cfg.accumulation!r} must be an integer >= 1 or adaptive")
    if cfg.accumulation == "adaptive":
        if cfg.accumulation_max < 2:
            raise ConfigError(f"accumulation_max={cfg.accumulation_max} must be >= 2 (adaptive k is at least 2)")
        _positive("accumulation_target_variance", cfg.accumulation_target_variance)
        if cfg.num_gpus > 1:
            raise ConfigError("accumulation=adaptive needs num_gpus=1: the ranks would measure different "
                              "variances, and DDP's all-reduce inside the last backward hides each micro-batch's gradient")
        if cfg.compile.step_graph:
            raise ConfigError("accumulation=adaptive with compile.step_graph=true: the captured step cannot "
                              "read each micro-batch's gradient; use compile.step_graph=false")
    _one_of("freezing.name", cfg.freezing.name, FREEZINGS)
    opt = cfg.optimizer
    _positive("optimizer.lr", opt.lr)
    _one_of("optimizer.schedule", opt.schedule, LR_SCHEDULES)
    _one_of("optimizer.scale_lr", opt.scale_lr, SCALE_LR)
    _positive("optimizer.base_batch_size", opt.base_batch_size)
    if not 0.0 <= opt.min_lr_ratio < 1.0:
        raise ConfigError(f"optimizer.min_lr_ratio={opt.min_lr_ratio} must be in [0, 1)")
    if not 0.0 <= opt.warmup_ratio < 1.0:
        raise ConfigError(f"optimizer.warmup_ratio={opt.warmup_ratio} must be in [0, 1)")
    if opt.weight_decay < 0:
        raise ConfigError(f"optimizer.weight_decay={opt.weight_decay} must be >= 0")
    _positive("optimizer.max_grad_norm", opt.max_grad_norm, allow_none=True)
    from .optim import check_optimizer  # the option's own class checks its settings

    _refuse(check_optimizer(opt, capturable=False) or (check_optimizer(opt, capturable=True)
                                                       if cfg.compile.step_graph else None))
    _positive("hardware.price_per_gpu_hour_usd", cfg.hardware.price_per_gpu_hour_usd, allow_none=True)
    from .carbon import check_carbon

    _refuse(check_carbon(cfg.carbon, cfg.hardware.pue))
    _positive("num_gpus", cfg.num_gpus)
    if cfg.num_gpus > 1 and cfg.freezing.name != "none":
        raise ConfigError(f"num_gpus={cfg.num_gpus} with freezing={cfg.freezing.name}: DDP registers its gradient "
                          "hooks once, for the parameters trainable at the start; use num_gpus=1 or freezing=none")
    _one_of("launcher.name", cfg.launcher.name, LAUNCHERS)
    _positive("launcher.timeout_s", cfg.launcher.timeout_s)
    _positive("launcher.collective_timeout_s", cfg.launcher.collective_timeout_s)
    _one_of("launcher.start_method", cfg.launcher.start_method, START_METHODS)
    if int(cfg.launcher.runs_at_once) < 1:
        raise ConfigError(f"launcher.runs_at_once={cfg.launcher.runs_at_once}: give 1 (one run at a time) or more")
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
    if cfg.model.source == "random_init":
        for k in MODEL_SHAPE_FIELDS:
            if cfg.model[k] is None:
                raise ConfigError(f"model={cfg.model.name} (random_init) needs model.{k}: a random-init model's "
                                  "shape comes from the config")
            _positive(f"model.{k}", cfg.model[k])
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
    if not 8 <= ds.max_length <= 512:
        raise ConfigError(f"dataset.max_length={ds.max_length} must be in [8, 512] (BERT positions)")
    _positive("dataset.train_subset", ds.train_subset, allow_none=True)
    _positive("dataset.test_subset", ds.test_subset, allow_none=True)
    tr = cfg.train
    _positive("train.epochs", tr.epochs)
    if tr.batch_size != "auto" and (isinstance(tr.batch_size, bool) or not isinstance(tr.batch_size, int)
                                    or tr.batch_size < 1):
        raise ConfigError(f"train.batch_size={tr.batch_size!r} must be an integer >= 1 or auto")
    if tr.batch_size == "auto" and cfg.num_gpus > 1:
        raise ConfigError(f"train.batch_size=auto with num_gpus={cfg.num_gpus}: the search runs in one process; "
                          "use num_gpus=1, or give the batch found by a num_gpus=1 run (metric batch_size_used)")
    _positive("train.eval_batch_size", tr.eval_batch_size)
    _one_of("train.device", tr.device, DEVICES)
    if tr.num_workers < 0:
        raise ConfigError(f"train.num_workers={tr.num_workers} must be >= 0")
    _positive("train.prefetch_factor", tr.prefetch_factor, allow_none=True)
    if tr.prefetch_factor is not None and tr.num_workers == 0:
        raise ConfigError(f"train.prefetch_factor={tr.prefetch_factor} needs loader workers: set train.num_workers > 0 "
                          "(without workers batches are made in the training loop, nothing is prefetched)")
    _positive("train.max_steps_per_epoch", tr.max_steps_per_epoch, allow_none=True)
    _positive("train.log_every_steps", tr.log_every_steps)
    _positive("train.pad_to_multiple_of", tr.pad_to_multiple_of)
    from .checkpointing import MODES as CHECKPOINTING

    _one_of("train.gradient_checkpointing", tr.gradient_checkpointing, CHECKPOINTING)
    _positive("telemetry.interval_s", cfg.telemetry.interval_s)
    from .search import check_search

    _refuse(check_search(cfg.search))
    if cfg.profile_window.warmup_steps < 0:
        raise ConfigError(f"profile_window.warmup_steps={cfg.profile_window.warmup_steps} must be >= 0")
    _positive("profile_window.active_steps", cfg.profile_window.active_steps)
    _positive("profile_window.top_k", cfg.profile_window.top_k)
    if not cfg.tracking.uri:
        raise ConfigError("tracking.uri is empty: give an MLflow tracking URI, e.g. sqlite:///mlflow.db")
    # Last, as it may wait on the network (a few seconds at most): a tracking server that cannot be
    # reached is bad input too, said before any work instead of after minutes of MLflow's retries.
    from .store import check_store

    check_store(cfg.tracking.uri)
