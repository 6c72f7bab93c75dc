"""A run's MLflow record apart from training: what names and identifies a configuration (its run
name, option choices, config hashes), opening its run with params and tags, and the outcomes
recorded without training (bad input, skipped here, resumed from an earlier run of a sweep).
job.py trains and fills the record; the launchers record what never reaches training."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Collection, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from mlflow.entities import DatasetInput, Run
from omegaconf import DictConfig, OmegaConf

from bertaccel.config import CONF_DIR, GROUP_SCHEMAS, MODEL_SHAPE_FIELDS, RunConfig
from bertaccel.options.dataset import data_name
from bertaccel.context import current as run_context
from bertaccel.record.sweep import (RUNNING_ELSEWHERE, UNTRAINED_TAG, adopt, previous_outcome, process_tags,
                                   scheduler_tags, untrained_before)
from bertaccel.record.tracking import (IDENTITY_VERSION, IDENTITY_VERSION_TAG, RunTracker, config_hash, flatten, git_sha,
                                     legacy_config_hashes)

if TYPE_CHECKING:  # (bertaccel.data imports torch: not at a sweep's start-up)
    from bertaccel.data import RawData


@dataclass
class Outcome:
    # finished | skipped | failed; in a resumed sweep also already_finished | not_retried, and
    # running_elsewhere (another live sweep runs it: the launcher waits, it is never a sweep's last word)
    status: str
    run_name: str
    reason: Optional[str] = None
    run_id: Optional[str] = None
    metrics: Dict[str, float] = field(default_factory=dict)


def logged_config(run: RunConfig) -> DictConfig:
    """The run's config as MLflow is to see it (params, config_hash, config.yaml: open_tracker;
    the readings), derived from the typed one, never edited beside it: for a config validate()
    accepted, the same keys, order and values as Hydra composed (tests/test_typed_once.py)."""
    logged: DictConfig = OmegaConf.structured(run)
    return logged


def resolved_values(cfg: DictConfig) -> Dict[str, Any]:
    """The config as plain values, interpolations resolved: what config_hash and the params read."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(resolved, dict)  # (a DictConfig's container is a dict)
    return {str(k): v for k, v in resolved.items()}


def cfg_hash(cfg: DictConfig) -> str:
    return config_hash(resolved_values(cfg))


def config_key_noseed(resolved: Mapping[str, Any]) -> str:
    """config_hash of the configuration without train.seed: runs that differ only in their seed
    (repeats, thesis section 5.5) share it, and the report groups them (report/repeats.py)."""
    train = {k: v for k, v in (resolved.get("train") or {}).items() if k != "seed"}
    return config_hash({**resolved, "train": train})


# A run's params are what tells it apart in MLflow's compare view: each config group's choice as
# ONE param (`encoder=fused`), and every setting that is not a group's or that differs from what the
# chosen option's own file says (`optimizer.lr=2e-4`), or that the sweep varies. The settings the
# choice only restates (`encoder.name`, `encoder.layer`, a pretrained model's built shape) are tags
# `config.<key>` instead: as params they would be axes of their own beside the group's (issue 44).
# run_settings puts both back together; config.yaml (an artifact) has the whole config.
CONFIG_TAG_PREFIX = "config."


def option_settings(group: str, option: str) -> Optional[Dict[str, str]]:
    """One option's settings as its file gives them (conf/<group>/<option>.yaml through the group's
    schema, as Hydra merges it), flattened: {"encoder.layer": "fused", ...}. None for an option that
    is not a file of conf/ (one from a search path of the user's): its settings all stay params."""
    schema = dict(GROUP_SCHEMAS).get(group)
    path = CONF_DIR / group / f"{option}.yaml"
    if schema is None or not path.is_file():
        return None
    try:
        node = OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.load(path))
        return flatten({group: OmegaConf.to_container(node, resolve=True)})
    except Exception:  # noqa: BLE001 - a file Hydra would refuse never reaches a run; as params is the safe side
        return None


def _key(override: str) -> str:
    """`+optimizer.lr` -> `optimizer.lr` (how a swept key is written)."""
    return override.lstrip("+~").split("@", 1)[0]


def split_settings(flat: Mapping[str, str], options: Mapping[str, str],
                   swept: Collection[str] = ()) -> Tuple[Dict[str, str], Dict[str, str]]:
    """(params, restated) of a run's flattened settings: restated are those of a config group equal
    to its chosen option's own (options: group -> the option whose file says them), unless the
    sweep varies the key (then a param in every run, whatever its value in one of them)."""
    varied = {_key(k) for k in swept}
    restated: Dict[str, str] = {}
    for group, option in options.items():
        own = option_settings(group, option)
        if own is None:
            continue
        restated.update({k: v for k, v in flat.items()
                         if k.startswith(f"{group}.") and own.get(k) == v and k not in varied})
    return {k: v for k, v in flat.items() if k not in restated}, restated


def restated_tags(settings: Mapping[str, Any]) -> Dict[str, str]:
    """Settings a group's choice restates, as the run's tags (CONFIG_TAG_PREFIX)."""
    return {f"{CONFIG_TAG_PREFIX}{k}": str(v) for k, v in settings.items()}


def run_settings(run: Run) -> Dict[str, str]:
    """A run's settings, flattened, as every reader of a run's configuration wants them: its params
    and the settings its group choices restate (tags config.*). Runs recorded before have them all
    as params, which this returns as they are."""
    out = {k[len(CONFIG_TAG_PREFIX):]: v for k, v in run.data.tags.items() if k.startswith(CONFIG_TAG_PREFIX)}
    out.update(run.data.params)
    return out


def open_tracker(cfg: DictConfig, choices: Mapping[str, str], run_name: str,
                 extra_tags: Mapping[str, str], profile: Optional[Mapping[str, Any]] = None) -> RunTracker:
    """profile: the hardware profile the run resolved (hardware.resolve_profile); params and
    config.yaml then say `hardware.*` as used (hardware=auto: the profile it picked), while the
    `hardware` param keeps the choice as typed and config_hash the configuration as typed."""
    resolved = resolved_values(cfg)
    logged = dict(resolved)
    if profile is not None:
        logged["hardware"] = OmegaConf.to_container(OmegaConf.create(dict(profile)))
    # A pretrained model's shape is null in the config; the built model's is tagged later (_run).
    unset_shape = {f"model.{k}" for k in MODEL_SHAPE_FIELDS if cfg.model[k] is None}
    flat = {k: v for k, v in flatten(logged).items() if k not in unset_shape}
    # hardware.* restates the profile the run used (hardware=auto: the one it picked, tag hardware_profile).
    options = {**{g: str(choices[g]) for g, _ in GROUP_SCHEMAS if g in choices},
               **({"hardware": str(profile["name"])} if profile is not None else {})}
    sweep = run_context().sweep
    params, restated = split_settings(flat, options, sweep.swept if sweep is not None else ())
    params.update(choices)  # `precision=bf16` etc.: the option names as typed on the command line
    # host, pid and its start let a later sweep tell a run whose process died (SIGKILL) from a
    # live one (record/sweep.py previous_outcome): the running run is the claim on its configuration.
    tags = {"config_hash": config_hash(resolved), "config_key_noseed": config_key_noseed(resolved),
            IDENTITY_VERSION_TAG: IDENTITY_VERSION, "git_sha": git_sha(), "status": "running",
            **restated_tags(restated), **process_tags(), **scheduler_tags(), **extra_tags}
    if sweep is not None:
        tags.update({"sweep_id": sweep.sweep_id, "mlflow.parentRunId": sweep.parent_run_id})
    return RunTracker(cfg.tracking.uri, cfg.tracking.experiment, run_name, params, tags,
                      OmegaConf.to_yaml(OmegaConf.create(logged)))


def resumed(cfg: DictConfig, run_name: str, raw: Optional[RawData] = None) -> Optional[Outcome]:
    """In a sweep with sweep.resume: the outcome of an earlier run of this configuration, if
    that means it is not run again (see record/sweep.py previous_outcome). An earlier run is this
    configuration's when its config_hash is this one's (or the one an older version gave it) and
    it read the rows this run would read: raw, the data as read (job.execute), else read here.
    An earlier run taken for the sweep is tagged as the sweep's (its report covers it)."""
    from bertaccel.record.datasets import current_digests, data_digests

    sweep = run_context().sweep
    if sweep is None or not cfg.sweep.resume:
        return None
    resolved = resolved_values(cfg)
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


def record_skipped(cfg: DictConfig, choices: Mapping[str, str], run_name: str, reason: str,
                   untrained: bool = False) -> Outcome:
    """A run that cannot run here, known before anything loads (hub.hub_skip_reason): recorded
    skipped with its reason, without starting a process for it (a resumed sweep keeps its earlier
    outcome, as for any run). untrained: a baseline the sweep leaves untrained, with nothing to
    compare it with (runs/untrained_baseline.py): tagged so (record/sweep.py UNTRAINED_TAG), and the
    sweep's own earlier such record taken again rather than a second one made."""
    earlier = resumed(cfg, run_name)
    if earlier is not None:
        return earlier
    sweep = run_context().sweep
    if untrained and sweep is not None and cfg.sweep.resume:
        again = untrained_before(cfg.tracking.uri, cfg.tracking.experiment, sweep.sweep_id,
                                 [cfg_hash(cfg), *legacy_config_hashes(resolved_values(cfg))])
        if again is not None:
            return Outcome("skipped", run_name, reason, again)
    tracker = open_tracker(cfg, choices, run_name, {UNTRAINED_TAG: "true"} if untrained else {})
    tracker.finish("skipped", reason)
    return Outcome("skipped", run_name, reason, tracker.run_id)


class RankTracker:
    """What ranks other than 0 of a data-parallel job log: nothing (rank 0 writes the one run)."""
    run_id = None

    def log_metrics(self, metrics: Mapping[str, Optional[float]], step: int = 0) -> None:
        pass

    def log_series(self, key: str, values: Sequence[float]) -> None:
        pass

    def log_params(self, params: Mapping[str, Any]) -> None:
        pass

    def log_artifacts(self, local_dir: str, artifact_path: str) -> None:
        pass

    def log_inputs(self, datasets: Sequence[DatasetInput]) -> None:
        pass

    def set_tags(self, tags: Mapping[str, str]) -> None:
        pass

    def finish(self, status: str, reason: Optional[str] = None) -> None:
        pass


# Overrides that say where results go, not what runs: left out of run names.
_NOT_IN_NAME = ("tracking.", "cache_dir", "hydra.")
# What dataset=csv reads: in a run's name, the data they hold (`dataset=imdb (csv)`) stands for them.
_DATA_PATHS = ("dataset.train_path", "dataset.test_path")


def _data_named(items: List[str]) -> List[str]:
    """`dataset=csv dataset.train_path=x/imdb/train.csv.gz dataset.test_path=...` as
    `dataset=imdb (csv)`: the data, then its loader (options/dataset.py label), not two paths.
    As typed when the paths do not say which data it is."""
    given = {_key(o.split("=", 1)[0]): o.split("=", 1)[1] for o in items if "=" in o}
    data = data_name(given.get("dataset.train_path", "").strip("'\"")) if given.get("dataset") == "csv" else ""
    if not data:
        return items
    return [f"dataset={data} (csv)" if o == "dataset=csv" else o for o in items
            if _key(o.split("=", 1)[0]) not in _DATA_PATHS]


def run_label(overrides: Iterable[object], swept: Collection[str] = ()) -> str:
    """A run name that reads like the command line: `precision=bf16,attention=sdpa`.

    In a sweep, only the swept keys (what tells its runs apart); otherwise every override. A CSV
    dataset is named by its data: `dataset=imdb (csv)` (for its files, swept or not)."""
    items = _data_named([str(o) for o in overrides if not str(o).startswith(_NOT_IN_NAME)])
    if swept:
        keys = {_key(k) for k in swept}
        if keys & set(_DATA_PATHS):
            keys.add("dataset")
        items = [o for o in items if _key(o.split("=", 1)[0]) in keys]
    return ",".join(items) or "defaults"


def group_choices(runtime_choices: Mapping[str, object], groups: Iterable[str]) -> Dict[str, str]:
    return {g: str(runtime_choices[g]) for g in groups if g in runtime_choices}
