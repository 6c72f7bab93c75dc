"""Config schema: one dataclass per config group, registered in Hydra's ConfigStore.

OmegaConf enforces the types when the YAML options in conf/ are merged onto these
schemas; `validate()` checks the values that types cannot express. Both happen before any
work, so a bad value costs one line and no half-written run.
"""
from __future__ import annotations

import threading
from dataclasses import Field, dataclass, field, fields, is_dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple, get_type_hints

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

# How a value is refused has its own module; imported here too, where the schema's users look.
from bertaccel.option import ConfigError, Range, bounded, first_line, not_count_or, not_one_of  # noqa: F401

# Inside the package, so a plain `pip install` (a wheel) carries them: the config groups Hydra
# composes (run.py's config_path) and the studies, primary configs found by name
# (hydra_plugins/bertaccel_searchpath adds SWEEPS_DIR to Hydra's search path).
CONF_DIR = Path(__file__).resolve().parent / "conf"
SWEEPS_DIR = Path(__file__).resolve().parent / "sweeps"

COMPILE_MODES = ("off", "default", "max-autotune", "reduce-overhead")
COMPILE_CACHES = ("persistent", "fresh")
FREEZINGS = ("none", "layerwise")
SCALE_LR = ("none", "linear")
LR_SCHEDULES = ("constant", "linear", "cosine")
MODEL_SOURCES = ("package", "hub", "random_init")
DATASET_SOURCES = ("bundled", "hub", "csv")
DEVICES = ("auto", "cpu", "cuda")
LAUNCHERS = ("inline", "process")
START_METHODS = ("forkserver", "spawn")
GRADIENT_CHECKPOINTING = ("none", "every", "sqrt")  # train.gradient_checkpointing (train/checkpointing.py)


def schema_fields(cls: type = None, prefix: str = "") -> Iterator[Tuple[str, Field]]:
    """Every leaf field of the schema (RunConfig by default) as (dotted key, dataclass Field)."""
    cls = cls or RunConfig
    hints = get_type_hints(cls)
    for f in fields(cls):
        if is_dataclass(hints[f.name]):
            yield from schema_fields(hints[f.name], f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f


@dataclass
class PrecisionConfig:
    """The number format training computes in: float32, autocast to bfloat16 or float16, or fp8 GEMMs.
    Options in conf/precision/; checks and machine check in bertaccel/options/precision.py."""
    name: str = "fp32"                     # the option that set this group (precision=<name>)
    autocast_dtype: Optional[str] = None   # The dtype autocast runs in: float16 | bfloat16 | null (no autocast)
    loss_scaling: bool = False             # Scale the loss with a GradScaler, so small float16 gradients do not underflow
    mfu_peak: str = "fp32"                 # The peak MFU divides by: the hardware profile's peak_tflops_<this>
    fp8_recipe: Optional[str] = None       # torchao float8 training of the Linear layers: tensorwise | rowwise | null (none)


@dataclass
class AttentionConfig:
    """The self-attention kernel: Hugging Face's eager code or torch SDPA, or every self-attention
    swapped for xFormers' or our Triton kernel over packed tokens. Options in conf/attention/;
    checks in bertaccel/attention/option.py."""
    name: str = "eager"                # the option that set this group (attention=<name>)
    hf_implementation: str = "eager"   # The attention Hugging Face builds: eager | sdpa
    swap: Optional[str] = None         # The kernel every BertSelfAttention is then swapped for (attention/swap.py BACKENDS)
    # The torch SDPA backends allowed, in torch's names (empty = torch's own choice); sdpa only.
    sdpa_backends: List[str] = field(default_factory=list)


@dataclass
class EncoderConfig:
    """The BERT layer the encoder runs: Hugging Face's BertLayer (hf), or ours (fused,
    bertaccel/encoder/) with LightSeq's techniques, each a switch here so that each one can be
    measured on and off. Options in conf/encoder/; checks and machine check in bertaccel/encoder/option.py."""
    name: str = "hf"                   # the option that set this group (encoder=<name>)
    layer: str = "hf"                  # Which layer the encoder runs: hf | fused
    # Run the layers on the batch's real tokens only (no work on padding); false: on every padded
    # token (each row's padding a sequence of its own, so results are the same). Fused layer only.
    packed: bool = True
    # Run bias+GELU and bias+dropout+residual+LayerNorm as our Triton kernels; false: the same
    # arithmetic as PyTorch ops (a kernel each), for the on/off measurement. Fused layer only.
    fused_kernels: bool = True
    # Keep the model's parameters in the half dtype and their fp32 copies inside the optimizer's
    # flat buffers, so no weight is cast per step. Fused layer only, with precision fp16/bf16 and an
    # optimizer that keeps fp32 master weights (`master_weights` on its class).
    half_params: bool = True


@dataclass
class CompileConfig:
    """Compiles the model with torch.compile, and can replay the whole step from CUDA graphs.
    Options in conf/compile/<mode>.yaml; checks in bertaccel/options/compile.py."""
    mode: str = "off"  # torch.compile's mode; off: the model runs eagerly
    # One graph for every padded length (the sequence dimension marked dynamic) instead of a
    # graph per length: one compile instead of one per length (train.pad_to_multiple_of).
    dynamic_length: bool = True
    # Where compiled kernels are kept. persistent: under cache_dir/compile/<torch, triton, GPU key>,
    # paid once per machine; fresh: an empty cache per run, for measuring cold compilation.
    cache: str = "persistent"
    # The whole optimizer step (forward, backward, clipping, update) replayed from CUDA graphs,
    # one per padded length: no host work per step (bertaccel/train/step_graph.py). GPU only.
    step_graph: bool = False


@dataclass
class FreezingConfig:
    """Which parameters train in which epoch. Options in conf/freezing/; bertaccel/options/freezing.py."""
    name: str = "none"  # The strategy: none (every parameter trains) | layerwise (one encoder layer + head per epoch)


@dataclass
class OptimizerConfig:
    """The optimizer class and the learning-rate schedule. Options in conf/optimizer/; meaning and
    checks in bertaccel/options/optimizer.py."""
    name: str = "adamw"  # the option that set this group (optimizer=<name>)
    lr: float = bounded(1e-4, gt=0)  # Peak learning rate (after warm-up)
    weight_decay: float = bounded(0.01, ge=0)  # Decoupled weight decay; not applied to biases and LayerNorm weights
    schedule: str = "linear"  # The lr after warm-up: constant, linear decay to 0, or cosine to min_lr_ratio x lr
    warmup_ratio: float = bounded(0.1, ge=0, lt=1)  # The fraction of the optimizer steps lr warms up over
    # The floor cosine decays lr to, as a fraction of lr (Systematic Training Compute Optimization, eq. 10: 0.1)
    min_lr_ratio: float = bounded(0.0, ge=0, lt=1)
    # How lr follows the effective batch. linear: lr x effective batch (batch_size x accumulation x
    # num_gpus) / base_batch_size (the linear scaling rule, Systematic Training Compute Optimization, eq. 11)
    scale_lr: str = "none"
    base_batch_size: int = bounded(32, gt=0)  # The batch lr was tuned for (scale_lr=linear)
    max_grad_norm: Optional[float] = bounded(1.0, gt=0, note="null: no clipping")  # The gradients' global norm is clipped to this
    # The optimizer itself (bertaccel/options/optimizer.py): `_target_` a torch.optim.Optimizer class,
    # `_partial_: true`, and that class's own settings. lr and weight decay come from above.
    impl: Dict[str, Any] = field(default_factory=lambda: {"_target_": "torch.optim.AdamW", "_partial_": True})


@dataclass
class HardwareConfig:
    """A GPU's (or CPU's) price, power, peak FLOP/s and memory bandwidth, for a run's cost, energy
    and MFU and the plan's roofline; auto picks the profile that matches the device. Options in
    conf/hardware/; bertaccel/options/hardware.py."""
    name: str = "auto"  # the option that set this group (hardware=<name>)
    # Substrings of torch.cuda.get_device_name() that select this profile under hardware=auto.
    match: List[str] = field(default_factory=list)
    # One GPU's price per hour, for cost_usd
    price_per_gpu_hour_usd: Optional[float] = bounded(None, gt=0, note="null: no cost_usd")
    price_source: str = ""  # Where the price comes from (said with cost_usd)
    # Board power, watts: the plan's energy estimate where no run measured energy
    tdp_w: Optional[float] = bounded(None, gt=0, note="watts; null: unknown")
    # Peak bfloat16 TFLOP/s (dense, datasheet): MFU's denominator (precision.mfu_peak picks which), the roofline
    peak_tflops_bf16: Optional[float] = bounded(None, gt=0, note="null: none, no MFU")
    peak_tflops_fp16: Optional[float] = bounded(None, gt=0, note="null: none, no MFU")  # Peak float16 TFLOP/s
    peak_tflops_fp32: Optional[float] = bounded(None, gt=0, note="null: none, no MFU")  # Peak float32 TFLOP/s
    # Peak memory bandwidth (datasheet, TB/s): the memory-bound kernels' ceiling in the plan's
    # roofline (bertaccel/plan/roofline.py), which moves a time measured on one GPU to another.
    memory_bandwidth_tbps: Optional[float] = bounded(None, gt=0, note="TB/s; null: unknown, no roofline")
    # The host's floor per kernel launch, microseconds: a property of the host and driver more than
    # of the GPU, so no profile sets it; give a measured one here (hardware.kernel_launch_us=3.5).
    kernel_launch_us: Optional[float] = bounded(None, gt=0, note="null: plan/roofline.py's default, 5 us")
    # Use this profile on a device it does not match (hardware.py profile_mismatch), on purpose:
    # "what would this run cost there". The record says so (tag hardware_what_if, and
    # hardware_profile "<name> (what-if)", which the report shows). Not for hardware=auto.
    what_if: bool = False
    # Power usage effectiveness of the data centre (total facility energy / IT energy, >= 1):
    # co2e_kg counts energy_kwh x pue (bertaccel/measure/carbon.py). null: IT energy only, said in the tag.
    pue: Optional[float] = None  # (its range, >= 1, is checked by the hardware option: options/hardware.py)
    pue_source: str = ""  # Where the PUE comes from


@dataclass
class CarbonConfig:
    """How a run's energy becomes emissions: co2e_kg = energy_kwh x hardware.pue x grid intensity /
    1000. Table of regions and checks in bertaccel/measure/carbon.py."""
    # The grid whose carbon intensity counts: a row of carbon.REGIONS (published annual averages)
    region: str = "world"
    # A grid intensity, g CO2e per kWh, used instead of the region's (>= 0: check_carbon)
    intensity_g_per_kwh: Optional[float] = None


@dataclass
class ModelConfig:
    """The BERT model to fine-tune and where its weights come from. Options in conf/model/; checks
    in bertaccel/options/model.py."""
    name: str = MISSING  # the option that set this group (model=<name>)
    # Where the weights come from. package: a pip package; hub: the Hugging Face hub; random_init:
    # new weights, of the shape below
    source: str = MISSING
    # The weights. package: an importable package holding them in <package>/model; hub: a hub id.
    pretrained: Optional[str] = None
    # The package a random_init model takes its tokenizer from. The shape below is random_init's
    # too: null for a pretrained model, whose weights bring their own shape (a run logs the built
    # model's shape as params model.<field>, job.py, never a default that was not used).
    tokenizer_package: Optional[str] = None
    hidden_size: Optional[int] = bounded(None, gt=0)  # Hidden size of a random_init model
    num_hidden_layers: Optional[int] = bounded(None, gt=0)  # Encoder layers of a random_init model
    num_attention_heads: Optional[int] = bounded(None, gt=0)  # Attention heads of a random_init model
    intermediate_size: Optional[int] = bounded(None, gt=0)  # Feed-forward width of a random_init model


# The ModelConfig fields that give a random-init model its shape (also its Hugging Face config's names).
MODEL_SHAPE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


@dataclass
class DatasetConfig:
    """The text-classification data and how it is tokenized. Options in conf/dataset/; checks in
    bertaccel/options/dataset.py, reading in bertaccel/data/read.py."""
    name: str = MISSING  # the option that set this group (dataset=<name>)
    source: str = MISSING  # Where the data comes from. bundled: bertaccel/samples; hub: the Hugging Face hub; csv: local files
    hub_id: Optional[str] = None  # The dataset's hub id (source=hub)
    train_path: Optional[str] = None  # The training file. bundled: under bertaccel/samples; csv: relative to where you run
    test_path: Optional[str] = None  # The test file, as train_path
    # The columns holding the text; several are joined with a space
    text_columns: List[str] = field(default_factory=lambda: ["text"])
    label_column: str = "label"  # The column holding the class label
    max_length: int = bounded(128, ge=8, le=512, note="BERT positions")  # Longest tokenized text; longer ones are truncated
    train_subset: Optional[int] = bounded(None, gt=0, note="null: all rows")  # Train on the first N rows after a seeded shuffle
    test_subset: Optional[int] = bounded(None, gt=0, note="null: all rows")  # Test on the first N rows after a seeded shuffle
    # The subsets' shuffle seed. Not train.seed: runs that differ only in train.seed are repeats
    # (the report groups them) and must train and test on the same rows; a different sample of
    # the data is a different experiment, asked for by changing this.
    # Any integer: Python's random.Random takes any (negative, or past 64 bits) as its seed.
    subset_seed: int = 0


@dataclass
class TrainConfig:
    """The training loop: batches, seed, device and data loading (checks: bertaccel/options/train.py)."""
    epochs: int = bounded(1, gt=0)  # Passes over the training data
    # Rows per micro-batch and device: an integer, or "auto" (the largest power of two that fits the
    # GPU at the dataset's longest padded length, found by trying: bertaccel/train/batch_fit.py).
    # Any-typed so both spellings compose (as accumulation); validate() checks.
    batch_size: Any = 32
    eval_batch_size: int = bounded(128, gt=0)  # Rows per batch when testing
    # The seed of the model's new weights, dropout and the batches' order
    seed: int = bounded(42, ge=0, le=2**32 - 1, note="numpy's seed range; isolation.seed_everything seeds it")
    device: str = "auto"  # Where training runs. auto: a CUDA GPU when one is visible, else the CPU
    num_workers: int = bounded(0, ge=0, note="0: batches made in the training process")  # Loader worker processes making batches
    # Workers kept alive between epochs (num_workers > 0), so each epoch does not pay their start.
    persistent_workers: bool = True
    # Batches each worker prepares ahead (null = torch's default of 2; needs num_workers > 0).
    prefetch_factor: Optional[int] = bounded(None, gt=0, note="null: torch's default")
    # Page-locked host batches (null = on a GPU only): a copy from pageable memory makes the host
    # wait for the GPU stream first, so the loop could never run ahead of the GPU.
    pin_memory: Optional[bool] = None
    # Batches of similar length (shuffled), so dynamic padding pads little; false = plain shuffle.
    group_by_length: bool = True
    # Round each batch's padded length up to this multiple (1 = exact longest sequence): it bounds
    # the distinct shapes that per-shape kernels and torch.compile see.
    pad_to_multiple_of: int = bounded(8, gt=0, note="1: exact longest sequence")
    # Stop an epoch after this many optimizer steps (null = whole epoch); for smoke runs.
    max_steps_per_epoch: Optional[int] = bounded(None, gt=0, note="null: whole epoch")
    # The loss is read back (a host sync) every this many optimizer steps: NaN check + progress bar.
    log_every_steps: int = bounded(10, gt=0)
    # Recompute activations in backward instead of keeping them: none | every (each encoder layer) |
    # sqrt (segments of sqrt(L) layers, as Systematic Training Compute Optimization, section III-E);
    # bertaccel/train/checkpointing.py.
    gradient_checkpointing: str = "none"


@dataclass
class TelemetryConfig:
    """Energy and activity measured while a run trains (bertaccel/measure/)."""
    # Measure energy and activity while training; false: no collectors (their sampler threads share
    # the GIL with the loop), and the measurements are null with that reason.
    enabled: bool = True
    # Background sampling period of NVML power, GPM and utilization (RAPL polls at >= 1 s).
    # At most threading.TIMEOUT_MAX: the samplers wait on a threading.Event for this long.
    interval_s: float = bounded(0.2, gt=0, le=threading.TIMEOUT_MAX)
    # Where Linux exposes RAPL energy counters (CPU runs: package energy).
    rapl_root: str = "/sys/class/powercap"


@dataclass
class ProfileWindowConfig:
    """The torch.profiler window of profile=true (bertaccel/measure/)."""
    warmup_steps: int = bounded(3, ge=0)  # Steps run before recording (allocator, autotuning, caches settle)
    active_steps: int = bounded(5, gt=0)  # Steps recorded
    top_k: int = bounded(10, gt=0)  # Kernels listed in the artifact, the longest first


@dataclass
class SearchConfig:
    """What a trial of the Pareto search (hydra/sweeper=optuna_pareto) returns, and which way each
    objective is better (bertaccel/options/search.py)."""
    # MLflow metric names a trial returns, with one direction (minimize | maximize) each.
    objectives: List[str] = field(default_factory=lambda: ["train_time_s", "cost_usd", "energy_kwh", "test_accuracy"])
    # minimize | maximize, one per objective.
    directions: List[str] = field(default_factory=lambda: ["minimize", "minimize", "minimize", "maximize"])


@dataclass
class SweepConfig:
    """What a multirun (-m) does with configurations that already ran."""
    # Skip a configuration whose config_hash already has a finished run (multirun only).
    resume: bool = True
    # Also re-run configurations whose earlier run was failed or skipped.
    retry_failed: bool = False
    # Each configuration this many times, seeds train.seed, +1, ..., interleaved (A B A B, never
    # A A B B) so host drift falls on all alike; the report's intervals and ties come from them.
    repeats: int = bounded(1, ge=1)
    max_runs: int = bounded(10000, ge=1)  # The most runs (configurations x repeats) a sweep may have; more: refused
    # Add the config groups' defaults run (per model and dataset) when no configuration is it: the
    # report's speed-ups are then against what the user runs today (bertaccel/runs/sweep_jobs.py).
    baseline: bool = True


@dataclass
class TrackingConfig:
    """The MLflow store every run is recorded in (checks: bertaccel/options/tracking.py)."""
    uri: str = "sqlite:///mlflow.db"  # The MLflow store: any tracking URI; a relative path is from where you run
    experiment: str = "bertaccel"  # The MLflow experiment the runs go to


@dataclass
class LauncherConfig:
    """Where and how each run's processes start (checks: bertaccel/options/launcher.py)."""
    # Where a run executes (bertaccel/runs/launch.py): inline = in the sweep's own process;
    # process = a fresh Python process per run (one per rank for num_gpus > 1).
    name: str = "process"
    # A run (all its ranks) still going after this many seconds is stopped and recorded failed.
    # No "infinite" (the finite check refuses inf): give a long time instead, e.g. 864000 (ten days).
    timeout_s: float = bounded(86400.0, gt=0)
    # Seconds a collective may wait on a peer before it fails, so a dead or hung rank ends the job
    # (num_gpus > 1). At most what a datetime.timedelta holds: torch.distributed takes it as one.
    collective_timeout_s: float = bounded(300.0, gt=0, le=timedelta.max.total_seconds())
    # A sweep (-m) runs this many configurations at a time, each in processes of its own and, on
    # a GPU host, on num_gpus GPUs of its own (hydra_plugins/bertaccel_launcher). 1: one by one.
    runs_at_once: int = bounded(1, ge=1, note="1: one run at a time")
    # How run processes start. forkserver: forked from a server process that imported torch,
    # transformers, mlflow and bertaccel once, so a later run of a sweep starts in well under a
    # second instead of re-importing them (seconds to tens of seconds); the server never touches
    # CUDA, so each run still gets a fresh CUDA context, allocator and dynamo. spawn: a fresh
    # interpreter per run, for a library that misbehaves after fork.
    start_method: str = "forkserver"


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
