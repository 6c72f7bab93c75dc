"""Config schema: one dataclass per config group or block, each in a module of its own named after
its section (config/precision.py: PrecisionConfig, ...; its option, the section's checks, points
at it as `Option.schema`), assembled here into RunConfig, registered in Hydra's ConfigStore.
The schema sits at the base layer, below every option, so that each layer can type its config.

OmegaConf enforces the types when the YAML options in conf/ are merged onto these
schemas; `validate()` checks the values that types cannot express. Both happen before any
work, so a bad value costs one line and no half-written run.
"""
from __future__ import annotations

from dataclasses import Field, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Tuple, get_type_hints

from hydra.core.config_store import ConfigStore

# How a value is refused has its own module; imported here too, where the schema's users look.
from bertaccel.option import ConfigError, Range, bounded, first_line, not_count_or, not_one_of  # noqa: F401
# Each section's schema (and the names its checks allow), importable from here as before.
from bertaccel.config.attention import AttentionConfig
from bertaccel.config.carbon import CarbonConfig
from bertaccel.config.compile import COMPILE_CACHES, COMPILE_MODES, CompileConfig  # noqa: F401
from bertaccel.config.dataset import DATASET_SOURCES, DatasetConfig  # noqa: F401
from bertaccel.config.encoder import EncoderConfig
from bertaccel.config.freezing import FREEZINGS, FreezingConfig  # noqa: F401
from bertaccel.config.hardware import HardwareConfig
from bertaccel.config.launcher import START_METHODS, LauncherConfig  # noqa: F401
from bertaccel.config.measure import ProfileWindowConfig, TelemetryConfig
from bertaccel.config.model import MODEL_SHAPE_FIELDS, MODEL_SOURCES, ModelConfig  # noqa: F401
from bertaccel.config.optimizer import LR_SCHEDULES, SCALE_LR, OptimizerConfig  # noqa: F401
from bertaccel.config.precision import PrecisionConfig
from bertaccel.config.search import SearchConfig
from bertaccel.config.sweep import SweepConfig
from bertaccel.config.tracking import TrackingConfig
from bertaccel.config.train import DEVICES, GRADIENT_CHECKPOINTING, TrainConfig  # noqa: F401

# Inside the package, so a plain `pip install` (a wheel) carries them: the config groups Hydra
# composes (run.py's config_path) and the studies, primary configs found by name
# (hydra_plugins/bertaccel_searchpath adds SWEEPS_DIR to Hydra's search path).
CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
SWEEPS_DIR = Path(__file__).resolve().parent.parent / "sweeps"


def schema_fields(cls: Optional[type] = None, prefix: str = "") -> Iterator[Tuple[str, Field]]:
    """Every leaf field of the schema (RunConfig by default) as (dotted key, dataclass Field)."""
    cls = cls or RunConfig
    hints = get_type_hints(cls)
    for f in fields(cls):
        if is_dataclass(hints[f.name]):
            yield from schema_fields(hints[f.name], f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f


@dataclass
class RunConfig:
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    compile: CompileConfig = field(default_factory=CompileConfig)
    # Micro-batches per optimizer step: an integer, or "adaptive" (k from the variance of the last
    # window's micro-batch gradients, in [2, accumulation_max]: Systematic Training Compute
    # Optimization, section III-B, eq. 6-7; bertaccel/options/accumulation.py). Like num_gpus, a
    # value rather than a folder of options: Hydra rejects a group option whose name parses as an
    # int (`accumulation=4` -> "Config group override must be a string"), and a value takes any
    # count (accumulation=1,4 or 12). Any-typed so both spellings compose; validate() checks.
    accumulation: Any = 1
    # The most micro-batches accumulation=adaptive takes per step (its k_max). Its range holds
    # whatever accumulation is: a range belongs to the setting, not to one combination.
    accumulation_max: int = bounded(8, ge=2, note="adaptive k is at least 2")
    # The gradient variance accumulation=adaptive aims for (sigma_target^2 of eq. 6, a squared
    # gradient norm): a lower target, more micro-batches per step.
    accumulation_target_variance: float = bounded(1.0, gt=0)
    freezing: FreezingConfig = field(default_factory=FreezingConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    num_gpus: int = bounded(1, gt=0)  # Data-parallel ranks, one process and one GPU each (on a CPU host: gloo processes)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    cache_dir: str = "~/.cache/bertaccel"  # Where tokenized datasets and compiled kernels are kept, shared by runs
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    carbon: CarbonConfig = field(default_factory=CarbonConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    # Profile a few steps after training with torch.profiler: kernel table, category shares, trace.
    profile: bool = False
    profile_window: ProfileWindowConfig = field(default_factory=ProfileWindowConfig)
    # Time each layer's backward and all-reduce after training, against the backprop-time estimate
    # of Hardware Acceleration of Machine Learning, section 3.5.2 (bertaccel/measure/layer_timing.py):
    # backward_predicted_ms vs backward_measured_ms.
    layer_timing: bool = False


# The config groups, one folder of options each in conf/, and the schema every option of the
# group is checked against. GROUPS (what a run's choices are read from) and register_configs
# both read this one list; conf/config.yaml's defaults name the same groups (a test holds them
# equal). accumulation and num_gpus, also chosen on the command line, are integers: RunConfig.
GROUP_SCHEMAS = (("precision", PrecisionConfig), ("attention", AttentionConfig), ("encoder", EncoderConfig),
                 ("compile", CompileConfig),
                 ("freezing", FreezingConfig), ("optimizer", OptimizerConfig), ("hardware", HardwareConfig),
                 ("model", ModelConfig), ("dataset", DatasetConfig))
# preset: a bundle of the other groups' choices for a study (conf/preset/); it has no schema of its own.
GROUPS = tuple(group for group, _ in GROUP_SCHEMAS) + ("preset",)
# What is trained and where; the other groups are the techniques a sweep compares. The user's
# baseline (runs/sweep_jobs.py, report/baseline.py) is the techniques' defaults on each context.
CONTEXT_GROUPS = ("model", "dataset", "hardware")
TECHNIQUE_GROUPS = tuple(group for group in GROUPS if group not in CONTEXT_GROUPS)


def register_configs() -> None:
    """Make the schema known to Hydra; conf/config.yaml lists `run_schema` first. RunConfig types
    every group's node (precision: PrecisionConfig, ...), so each option is checked against its
    group's schema on merge. The group schemas are not stored under their groups: there they
    would be options a user could pick (`precision=precision_schema` trained on the defaults)."""
    ConfigStore.instance().store(name="run_schema", node=RunConfig)


def section_schema(section: str) -> Optional[type]:
    """The dataclass that types a top-level key of RunConfig (precision: PrecisionConfig), None for
    a plain setting (accumulation, num_gpus, cache_dir): what an option's `schema` must be."""
    hint = get_type_hints(RunConfig).get(section)
    return hint if isinstance(hint, type) and is_dataclass(hint) else None
