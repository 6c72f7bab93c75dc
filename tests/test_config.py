"""Config composition for every group option, and the schema's errors."""
from __future__ import annotations

import pytest
from conftest import CONF_DIR
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from bertaccel.config import CONF_DIR, GROUPS, ConfigError
from bertaccel.options.checks import validate


def _options(group):
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


@pytest.mark.parametrize("group", GROUPS)
def test_every_option_of_every_group_composes_and_validates(compose_cfg, group):
    options = _options(group)
    assert options, f"conf/{group} has no options"
    for option in options:
        cfg = compose_cfg([f"{group}={option}"])
        if group == "dataset" and option == "csv":
            with pytest.raises(ConfigError, match="dataset=csv needs dataset.train_path"):
                validate(cfg)
            continue
        if group == "precision" and option.startswith("fp8"):  # torchao's FP8 pays only compiled (fp8_compile_off)
            with pytest.raises(ConfigError, match=rf"precision={option} needs torch.compile \(compile=default\)"):
                validate(cfg)
            validate(compose_cfg([f"{group}={option}", "compile=default"]))
            continue
        validate(cfg)


def test_group_options_land_in_the_config(compose_cfg):
    cfg = compose_cfg(["precision=bf16", "attention=sdpa", "compile=max-autotune", "accumulation=4",
                       "freezing=layerwise", "optimizer=adamw_fused", "hardware=h200", "model=tiny"])
    assert cfg.precision.name == "bf16"
    assert cfg.attention.name == "sdpa"
    assert cfg.compile.mode == "max-autotune"
    assert cfg.accumulation == 4 and compose_cfg(["accumulation=12"]).accumulation == 12
    assert cfg.freezing.name == "layerwise"
    assert cfg.optimizer.name == "adamw_fused"
    assert cfg.hardware.peak_tflops_bf16 == pytest.approx(989.4)
    assert cfg.model.source == "random_init"
    # `off` must stay the string "off", not YAML 1.1's boolean.
    assert compose_cfg(["compile=off"]).compile.mode == "off"


@pytest.mark.slow  # several seconds on one core: the full suite runs it, the inner loop does not
def test_hardware_profiles_have_prices_and_datasheet_peaks(compose_cfg):
    for name in ("t4", "a10", "v100", "a100", "h100", "h200"):
        hw = compose_cfg([f"hardware={name}"]).hardware
        assert hw.price_per_gpu_hour_usd > 0 and hw.price_source
        assert hw.tdp_w > 0 and hw.peak_tflops_fp16 > hw.peak_tflops_fp32 > 0
    # Volta and Turing have no bf16: null, not 0
    assert compose_cfg(["hardware=v100"]).hardware.peak_tflops_bf16 is None


@pytest.mark.parametrize("override, message", [
    ("accumulation=0", "accumulation=0 must be an integer >= 1 or adaptive"),
    ("precision.autocast_dtype=float8", "precision fp32: autocast_dtype='float8' is not one of float16, bfloat16"),
    ("precision.loss_scaling=true", "precision fp32: loss_scaling=true needs autocast_dtype float16"),
    ("optimizer.lr=-1", "optimizer.lr=-1.0 must be > 0"),
    ("optimizer.warmup_ratio=1.5", "optimizer.warmup_ratio=1.5 must be in [0, 1)"),
    ("dataset.max_length=1024", "dataset.max_length=1024 must be in [8, 512]"),
    ("launcher.name=slurm", "launcher.name='slurm' is not one of inline, process"),
    ("train.prefetch_factor=4", "train.prefetch_factor=4 needs loader workers"),
    ("train.device=tpu", "train.device='tpu' is not one of auto, cpu, cuda"),
])
def test_bad_values_raise_one_clear_line(compose_cfg, override, message):
    with pytest.raises(ConfigError) as info:
        validate(compose_cfg([override]))
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("overrides, message", [
    (["num_gpus=2", "freezing=layerwise"], "DDP registers its gradient hooks once"),
    (["num_gpus=2", "launcher.name=inline"], "needs a process per rank"),
])
def test_impossible_data_parallel_combinations_raise_one_line(compose_cfg, overrides, message):
    with pytest.raises(ConfigError) as info:
        validate(compose_cfg(overrides))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_types_are_enforced_on_composition(compose_cfg):
    with pytest.raises((ConfigCompositionException, ValidationError)):
        compose_cfg(["num_gpus=four"])  # (accumulation also takes "adaptive": validate checks it)
    with pytest.raises(ConfigCompositionException):
        compose_cfg(["precision=fp4"])  # not an option of the group


@pytest.mark.slow
def test_cli_bad_value_is_one_line_and_nonzero(cli):
    proc = cli(["accumulation=0"])
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: accumulation=0 must be an integer >= 1 or adaptive"
    assert not (cli.dir / "mlflow.db").exists(), "a bad value must not write anything to the store"


@pytest.mark.slow
def test_cli_missing_gpu_is_one_line_and_nonzero(cli):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = cli(["train.device=cuda"])
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: train.device=cuda but no CUDA GPU is visible")


@pytest.mark.slow
def test_cli_unknown_option_is_one_line_naming_the_options(cli):
    proc = cli(["attention=flashy"])
    assert proc.returncode == 2
    options = ", ".join(sorted(f.stem for f in (CONF_DIR / "attention").glob("*.yaml")))  # (a new one adds itself)
    assert proc.stderr.strip() == f"error: attention=flashy is not an option of attention; choose one of: {options}"


def test_sdpa_backends_are_validated(compose_cfg):
    cfg = compose_cfg(["attention=sdpa"])
    assert list(cfg.attention.sdpa_backends) == ["EFFICIENT_ATTENTION", "MATH"]
    validate(cfg)
    with pytest.raises(ConfigError, match="attention.sdpa_backends\\[\\]='FAST'"):
        validate(compose_cfg(["attention=sdpa", "attention.sdpa_backends=[FAST]"]))


def test_the_defaults_list_names_exactly_the_groups():
    # conf/config.yaml is the one list Hydra reads; config.GROUP_SCHEMAS the one the code reads.
    import yaml

    defaults = yaml.safe_load((CONF_DIR / "config.yaml").read_text())["defaults"]
    # (Hydra's own groups, "override hydra/launcher: ...", are not ours)
    named = [next(iter(d)) for d in defaults if isinstance(d, dict) and not next(iter(d)).startswith("override hydra/")]
    assert sorted(named) == sorted(GROUPS)
    assert all((CONF_DIR / group).is_dir() for group in GROUPS)


def test_every_problem_is_said_one_line_each(compose_cfg):
    """A config bad in several ways is refused with each problem on its own line (an option's own,
    another option's, and a rule between sections), not only the first one found."""
    with pytest.raises(ConfigError) as info:
        validate(compose_cfg(["precision.loss_scaling=true", "train.device=tpu", "launcher.name=slurm",
                              "num_gpus=2", "freezing=layerwise"]))
    assert str(info.value).splitlines() == [
        "precision fp32: loss_scaling=true needs autocast_dtype float16 (GradScaler guards fp16's 5-bit "
        "exponent; float32 does not underflow so)",
        "launcher.name='slurm' is not one of inline, process",
        "train.device='tpu' is not one of auto, cpu, cuda",
        "num_gpus=2 with freezing=layerwise: DDP registers its gradient hooks once, for the parameters "
        "trainable at the start; use num_gpus=1 or freezing=none"]


def test_a_rule_is_asked_only_when_the_sections_it_reads_passed_their_own_check(compose_cfg):
    """freezing.name=sometimes is refused by the freezing option itself; the rule freezing x num_gpus
    then says nothing about a value its section did not vouch for."""
    with pytest.raises(ConfigError) as info:
        validate(compose_cfg(["freezing.name=sometimes", "num_gpus=2"]))
    assert str(info.value) == "freezing.name='sometimes' is not one of none, layerwise"


def test_every_option_and_rule_names_real_sections():
    """The registry covers what validate() checks: each option's section and each rule's sections
    are settings of the schema, and the sections that have checks of their own are registered once."""
    from dataclasses import fields

    from bertaccel.config import RunConfig
    from bertaccel.options.registry import options
    from bertaccel.options.rules import RULES

    sections = [o.section for o in options()]
    top = {f.name for f in fields(RunConfig)}
    assert len(sections) == len(set(sections)) and set(sections) <= top
    assert all(set(rule.reads) <= top for rule in RULES)
    assert len({rule.name for rule in RULES}) == len(RULES)


def test_defaults_have_one_home():
    """conf/config.yaml picks options and Hydra's settings, no leaf default of the schema; an
    optimizer's YAML names only what differs from OptimizerConfig (lr, schedule, ... are its)."""
    import dataclasses

    import yaml

    from bertaccel.config import OptimizerConfig

    main = yaml.safe_load((CONF_DIR / "config.yaml").read_text())
    assert set(main) == {"defaults", "hydra"}
    schema = {f.name: f.default for f in dataclasses.fields(OptimizerConfig) if f.default is not dataclasses.MISSING}
    for path in sorted((CONF_DIR / "optimizer").glob("*.yaml")):
        option = yaml.safe_load(path.read_text())
        same = [k for k, v in option.items() if k in schema and schema[k] == v and k != "name"]  # (each names itself)
        assert same == [], f"{path.name} repeats the schema's defaults {same}"
