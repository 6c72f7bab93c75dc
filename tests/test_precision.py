"""The precision option's one home: conf/precision/<name>.yaml + bertaccel/options/precision.py."""
import textwrap

import pytest
import torch

from bertaccel.config import ConfigError
from bertaccel.options.checks import validate
from bertaccel.options.hardware import Capabilities, skip_reason
from bertaccel.options.precision import Precision, load_option, precision_unusable

CPU = torch.device("cpu")


def test_the_shipped_options_mean_what_their_yaml_says():
    assert Precision("fp32", CPU).dtype is None and not Precision("fp32", CPU).scaler.is_enabled()
    assert Precision("bf16", CPU).dtype is torch.bfloat16 and not Precision("bf16", CPU).scaler.is_enabled()
    fp16 = load_option("fp16")
    assert (fp16.autocast_dtype, fp16.loss_scaling, fp16.mfu_peak) == ("float16", True, "fp16")
    with pytest.raises(ValueError, match=r"precision='fp4': no conf/precision/fp4.yaml \(known: bf16, fp16, fp32, fp8, fp8_rowwise\)"):
        load_option("fp4")


def test_machine_checks_follow_the_dtype_not_the_name():
    renamed = load_option("fp16")
    renamed.name = "half"
    assert precision_unusable(renamed, CPU, cpu_native_bf16=True).startswith("precision=half needs a CUDA GPU")
    assert precision_unusable(load_option("bf16"), CPU, cpu_native_bf16=False).startswith(
        "precision=bf16 on a CPU without native bf16")
    assert precision_unusable(load_option("bf16"), CPU, cpu_native_bf16=True) is None
    assert precision_unusable(load_option("fp32"), CPU, cpu_native_bf16=False) is None


def test_adding_a_precision_is_one_yaml(compose_cfg, tmp_path):
    # fp16 autocast without loss scaling (say, to measure what the GradScaler costs): nothing but the file.
    (tmp_path / "precision").mkdir()
    (tmp_path / "precision" / "fp16_unscaled.yaml").write_text(textwrap.dedent("""\
        name: fp16_unscaled
        autocast_dtype: float16
        loss_scaling: false
        mfu_peak: fp16
        """))
    cfg = compose_cfg(["precision=fp16_unscaled"], searchpath=tmp_path)
    validate(cfg)
    p = Precision(cfg.precision, CPU)
    assert p.dtype is torch.float16 and not p.scaler.is_enabled()
    caps = Capabilities(cpu_native_bf16=True, cxx_compiler="g++", triton=False)
    assert skip_reason(cfg, CPU, caps).startswith("precision=fp16_unscaled needs a CUDA GPU")
    cfg.precision.autocast_dtype = "float8"
    with pytest.raises(ConfigError, match="autocast_dtype='float8' is not one of float16, bfloat16"):
        validate(cfg)
