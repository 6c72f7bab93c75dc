"""A run's MLflow record apart from training: what names and identifies a configuration (its run
name, option choices, config hashes), opening its run with params and tags, and the outcomes
recorded without training (bad input, skipped here, resumed from an earlier run of a sweep).
job.py trains and fills the record; the launchers record what never reaches training."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional

from omegaconf import DictConfig, OmegaConf

from bertaccel.config import MODEL_SHAPE_FIELDS
from bertaccel.runs.sweep import RUNNING_ELSEWHERE, adopt, context_from_env, previous_outcome, process_tags, scheduler_tags
from bertaccel.runs.tracking import (IDENTITY_VERSION, IDENTITY_VERSION_TAG, RunTracker, config_hash, flatten, git_sha,
                                     legacy_config_hashes)


@dataclass
class Outcome:
    # finished | skipped | failed; in a resumed sweep also already_finished | not_retried, and
    # running_elsewhere (another live sweep runs it: the launcher waits, it is never a sweep's last word)
    status: str
    run_name: str
    reason: Optional[str] = None
    run_id: Optional[str] = None
    metrics: Dict[str, float] = field(default_factory=dict)


def cfg_hash(cfg: DictConfig) -> str:
    return config_hash(OmegaConf.to_container(cfg, resolve=True))


def config_key_noseed(resolved: Mapping[str, Any]) -> str:
    """config_hash of the configuration without train.seed: runs that differ only in their seed
    (repeats, thesis section 5.5) share it, and the report groups them (report/repeats.py)."""
    train = {k: v for k, v in (resolved.get("train") or {}).items() if k != "seed"}
    return config_hash({**resolved, "train": train})


def open_tracker(cfg: DictConfig, choices: Mapping[str, str], run_name: str,
                 extra_tags: Mapping[str, str], profile: Optional[Mapping[str, Any]] = None) -> RunTracker:
    """profile: the hardware profile the run resolved (hardware.resolve_profile); params and
    config.yaml then say `hardware.*` as used (hardware=auto: the profile it picked), while the
    `hardware` param keeps the choice as typed and config_hash the configuration as typed."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    logged = dict(resolved)
    if profile is not None:
        logged["hardware"] = OmegaConf.to_container(OmegaConf.create(dict(profile)))
    # A pretrained model's shape is null in the config; its params are the built model's (_run).
    unset_shape = {f"model.{k}" for k in MODEL_SHAPE_FIELDS if cfg.model[k] is None}
    params = {k: v for k, v in flatten(logged).items() if k not in unset_shape}
    params.update(choices)  # `precision=bf16` etc.: the option names as typed on the command line
    # host, pid and its start let a later sweep tell a run whose process died (SIGKILL) from a
    # live one (runs/sweep.py previous_outcome): the running run is the claim on its configuration.
    tags = {"config_hash": config_hash(resolved), "config_key_noseed": config_key_noseed(resolved),
            IDENTITY_VERSION_TAG: IDENTITY_VERSION, "git_sha": git_sha(), "status": "running",
            **process_tags(), **scheduler_tags(), **extra_tags}
    sweep = context_from_env()
    if sweep is not None:
        tags.update({"sweep_id": sweep.sweep_id, "mlflow.parentRunId": sweep.parent_run_id})
    return RunTracker(cfg.tracking.uri, cfg.tracking.experiment, run_name, params, tags,
                      OmegaConf.to_yaml(OmegaConf.create(logged)))


def resumed(cfg: DictConfig, run_name: str, raw: Any = None) -> Optional[Outcome]:
    """In a sweep with sweep.resume: the outcome of an earlier run of this configuration, if
    that means it is not run again (see runs/sweep.py previous_outcome). An earlier run is this
    configuration's when its config_hash is this one's (or the one an older version gave it) and
    it read the rows this run would read: raw, the data as read (job.execute), else read here.
    An earlier run taken for the sweep is tagged as the sweep's (its report covers it)."""
    from bertaccel.runs.datasets import current_digests, data_digests

    sweep = context_from_env()
    if sweep is None or not cfg.sweep.resume:
        return None
    resolved = OmegaConf.to_container(cfg, resolve=True)
    data = data_digests(raw) if raw is not None else current_digests(cfg.dataset, cfg.cache_dir)
    prev = previous_outcome(cfg.tracking.uri, cfg.tracking.experiment,
                            [config_hash(resolved), *legacy_config_hashes(resolved)], cfg.sweep.retry_failed, data)
    if prev is None:
        return None
    if prev.status != RUNNING_ELSEWHERE:
        adopt(cfg.tracking.uri, prev.run_id, sweep.sweep_id, prev.status)
    return Outcome(prev.status, run_name, prev.reason, prev.run_id, prev.metrics)


def record_bad_input(cfg: DictConfig, choices: Mapping[str, str], run_name: str, reason: str,
                     tags: Optional[Mapping[str, str]] = None) -> Outcome:
    """In a sweep, a configuration with a bad value is kept as a failed run with its reason
    (also used by launch.py for a run whose process died before it opened its record)."""
    earlier = resumed(cfg, run_name)
    if earlier is not None:
        return earlier
    tracker = open_tracker(cfg, choices, run_name, dict(tags or {}))
    tracker.finish("failed", reason)
    return Outcome("failed", run_name, reason, tracker.run_id)


def record_skipped(cfg: DictConfig, choices: Mapping[str, str], run_name: str, reason: str) -> Outcome:
    """A run that cannot run here, known before anything loads (hub.hub_skip_reason): recorded
    skipped with its reason, without starting a process for it (a resumed sweep keeps its earlier
    outcome, as for any run)."""
    earlier = resumed(cfg, run_name)
    if earlier is not None:
        return earlier
    tracker = open_tracker(cfg, choices, run_name, {})
    tracker.finish("skipped", reason)
    return Outcome("skipped", run_name, reason, tracker.run_id)


class RankTracker:
    """What ranks other than 0 of a data-parallel job log: nothing (rank 0 writes the one run)."""
    run_id = None

    def log_metrics(self, metrics: Mapping[str, Optional[float]], step: int = 0) -> None:
        pass

    def log_series(self, key: str, values: Any) -> None:
        pass

    def log_params(self, params: Mapping[str, Any]) -> None:
        pass

    def log_artifacts(self, local_dir: str, artifact_path: str) -> None:
        pass

    def log_inputs(self, datasets: Any) -> None:
        pass

    def set_tags(self, tags: Mapping[str, str]) -> None:
        pass

    def finish(self, status: str, reason: Optional[str] = None) -> None:
        pass


# Overrides that say where results go, not what runs: left out of run names.
_NOT_IN_NAME = ("tracking.", "cache_dir", "hydra.")


def run_label(overrides: Any, swept: Any = ()) -> str:
    """A run name that reads like the command line: `precision=bf16,attention=sdpa`.

    In a sweep, only the swept keys (what tells its runs apart); otherwise every override."""
    items = [str(o) for o in overrides if not str(o).startswith(_NOT_IN_NAME)]
    if swept:
        items = [o for o in items if o.split("=", 1)[0] in swept]
    return ",".join(items) or "defaults"


def group_choices(runtime_choices: Mapping[str, Any], groups: Any) -> Dict[str, str]:
    return {g: str(runtime_choices[g]) for g in groups if g in runtime_choices}
