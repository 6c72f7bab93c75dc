"""precision=fp8 (torchao float8 training, options/fp8.py and options/precision.py) on a CPU: the
composed option, each refusal's one line (its own checks, the machine checks, the rules), the
doctor's verdict, and the swap itself (torchao's float8 runs on a CPU too, torch._scaled_mm)."""
from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from bertaccel.config import CONF_DIR
from bertaccel.options.checks import typed
from bertaccel.options.precision import Precision, check_precision, fp8_unusable, load_option
from bertaccel.options.reference import Composer
from bertaccel.options.rules import rules_at

CPU = torch.device("cpu")
GPU = torch.device("cuda")  # a device object only: the checks are given the capability
NO_TORCHAO = ("precision=fp8 needs torchao's float8 training (ModuleNotFoundError: No module named 'torchao'): "
              "pip install 'bertaccel[fp8]'")


def composed(*overrides: str):
    with Composer(CONF_DIR, None) as composer:
        cfg, _ = composer.compose(["model=tiny", *overrides])
    return typed(cfg)


def refusals(run) -> list:
    return [line for rule in rules_at("check") for line in [rule.refusal(run)] if line]


def test_fp8_composes_as_bf16_autocast_with_the_tensorwise_recipe():
    p = composed("precision=fp8", "compile=default").precision
    assert (p.name, p.autocast_dtype, p.loss_scaling, p.mfu_peak, p.fp8_recipe) == (
        "fp8", "bfloat16", False, "bf16", "tensorwise")
    assert composed("precision=fp8", "precision.fp8_recipe=rowwise").precision.fp8_recipe == "rowwise"
    assert composed("precision=bf16").precision.fp8_recipe is None
    assert check_precision(p) == []


def test_an_unknown_recipe_and_fp8_without_bf16_are_one_line_each():
    p = load_option("fp8")
    p.fp8_recipe = "blockwise"
    assert check_precision(p) == ["precision fp8: fp8_recipe='blockwise' is not one of tensorwise, rowwise "
                                  "(or null for no FP8)"]
    p = load_option("fp8")
    p.autocast_dtype, p.loss_scaling = "float16", True
    [line] = check_precision(p)
    assert "fp8_recipe=tensorwise needs autocast_dtype bfloat16" in line


def test_the_machine_checks_refuse_a_cpu_an_old_gpu_and_a_missing_torchao(monkeypatch):
    p = load_option("fp8")
    assert fp8_unusable(p, CPU) == ("precision=fp8 needs a CUDA GPU with FP8 tensor cores (sm_89 or newer: "
                                    "Ada, Hopper); this run is on the CPU")
    assert fp8_unusable(p, GPU, capability=(8, 0)) == (
        "precision=fp8 needs FP8 tensor cores (sm_89 or newer: Ada, Hopper); this GPU is sm_80; use precision=bf16")
    # An L4 / L40S (sm_89) and a Hopper (sm_90) run it where torchao is installed.
    runs = None if importlib.util.find_spec("torchao") else NO_TORCHAO
    assert fp8_unusable(p, GPU, capability=(8, 9)) == fp8_unusable(p, GPU, capability=(9, 0)) == runs
    for name in [m for m in sys.modules if m == "torchao" or m.startswith("torchao.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torchao", None)  # what `import torchao` meets where it is not installed
    why = fp8_unusable(p, GPU, capability=(9, 0))
    assert why.startswith("precision=fp8 needs torchao's float8 training (ModuleNotFoundError: No module named")
    assert why.endswith("): pip install 'bertaccel[fp8]'") and "\n" not in why


def test_the_skip_reason_of_a_cpu_run_is_the_fp8_line():
    from bertaccel.options.hardware import probe, skip_reason

    why = skip_reason(composed("precision=fp8", "compile=default"), CPU, probe())
    assert why.startswith("precision=fp8 needs a CUDA GPU with FP8 tensor cores")


def test_the_rules_refuse_fp8_uncompiled_and_in_the_fused_encoder():
    assert refusals(composed("precision=fp8", "compile=default")) == []
    assert refusals(composed("precision=fp8")) == [
        "precision=fp8 needs torch.compile (compile=default): torchao fuses its FP8 scaling and casts only "
        "when compiled; eagerly they are separate kernels and FP8 is slower than bf16"]
    assert refusals(composed("precision=bf16", "encoder=fused")) == []


@pytest.mark.slow  # several seconds on one core: the full suite runs it, the inner loop does not
def test_fp8_in_the_fused_encoder_is_its_own_rowwise_path_needing_neither_compile_nor_torchao():
    # The fused layer's own FP8 GEMMs (encoder/fp8_ops.py): row-wise scales, eager is fine.
    assert refusals(composed("precision=fp8", "precision.fp8_recipe=rowwise", "encoder=fused")) == []
    assert refusals(composed("precision=fp8", "encoder=fused", "compile=default")) == [
        "precision=fp8 with encoder=fused: the fused layer's FP8 GEMMs scale row-wise (each token's row from its "
        "LayerNorm or GELU kernel); use precision=fp8_rowwise, or encoder=hf for torchao's tensorwise recipe"]
    assert refusals(composed("precision=fp8_rowwise", "encoder=fused")) == []
    refused = ["precision=fp8_rowwise with encoder=fused runs its FP8 GEMMs outside torch.compile (its FP8 kernels "
               "are not torch.compile ops); use compile=off, with compile.step_graph=true to replay the step from "
               "CUDA graphs"]
    assert refusals(composed("precision=fp8_rowwise", "encoder=fused", "compile=default")) == refused
    assert refusals(composed("precision=fp8_rowwise", "encoder=fused", "compile=default",
                             "compile.step_graph=true")) == refused
    # Captured whole (train/step_graph.py): the casts, Triton kernels and FP8 GEMMs replay as they are.
    assert refusals(composed("precision=fp8_rowwise", "encoder=fused", "compile=off", "compile.step_graph=true",
                             "attention=sdpa")) == []
    assert refusals(composed("precision=fp8", "precision.fp8_recipe=rowwise", "encoder=fused",
                             "encoder.fused_kernels=false")) == [
        "precision=fp8 with encoder.fused_kernels=false: the FP8 rows are written by the fused LayerNorm and GELU "
        "kernels; use encoder.fused_kernels=true"]
    from bertaccel.options.precision import precision_unusable

    p = composed("precision=fp8", "precision.fp8_recipe=rowwise").precision
    # On an sm_90 GPU the fused path needs no torchao, installed or not; on a CPU, or
    # a GPU before sm_89, it is the FP8 line as ever.
    assert fp8_unusable(p, GPU, capability=(9, 0), torchao=False) is None
    assert fp8_unusable(p, GPU, capability=(8, 0), torchao=False).startswith("precision=fp8 needs FP8 tensor cores")
    assert precision_unusable(p, CPU, False, torchao=False).startswith("precision=fp8 needs a CUDA GPU")


def test_prepare_switches_a_fused_models_layers_to_fp8_once():
    from bertaccel.model import build_model

    run = composed("precision=fp8", "precision.fp8_recipe=rowwise", "encoder=fused")
    model, note = build_model(run.model, 4, run.attention, 30522, encoder=run.encoder)
    precision = Precision(run.precision, CPU)
    assert precision.prepare(model) == "2 fused layers run their GEMMs' forward and two input gradients in FP8 " \
                                       "(row-wise scales, encoder/fp8_ops.py)"
    assert all(layer.fp8 for layer in model.bert.encoder.layer)
    assert precision.prepare(model) is None  # once
    assert type(model.bert.pooler.dense) is torch.nn.Linear  # no torchao swap beside it


def test_the_swap_replaces_the_encoders_linear_layers_and_leaves_the_head():
    pytest.importorskip("torchao.float8")
    from torchao.float8.float8_linear import Float8Linear

    from bertaccel.model import build_model

    run = composed("precision=fp8", "compile=default")
    torch.manual_seed(0)
    model, _ = build_model(run.model, 4, run.attention, 30522)
    plain, _ = build_model(run.model, 4, run.attention, 30522)
    plain.load_state_dict(model.state_dict())
    precision = Precision(run.precision, CPU)
    # tiny: 2 layers x (query, key, value, attention output, intermediate, output) + the pooler
    assert precision.prepare(model) == "13 Linear layers swapped for torchao Float8Linear (tensorwise)"
    assert precision.prepare(model) is None  # once: a Float8Linear is an nn.Linear too, not swapped again
    layer = model.bert.encoder.layer[0]
    for linear in (layer.attention.self.query, layer.attention.output.dense, layer.intermediate.dense,
                   layer.output.dense, model.bert.pooler.dense):
        assert isinstance(linear, Float8Linear)
    assert type(model.classifier) is torch.nn.Linear  # 32 -> 4 labels: not a multiple of 16
    # One training step on the CPU: FP8 GEMMs (torch._scaled_mm), close to bf16 but not bf16's.
    ids = torch.randint(1, 30522, (4, 16), generator=torch.Generator().manual_seed(0))
    batch = dict(input_ids=ids, attention_mask=torch.ones_like(ids), labels=torch.tensor([0, 1, 2, 3]))
    model.eval(), plain.eval()
    with precision.autocast():
        fp8, bf16 = model(**batch), plain(**batch)
    assert torch.isfinite(fp8.loss) and not torch.equal(fp8.logits, bf16.logits)
    torch.testing.assert_close(fp8.logits.float(), bf16.logits.float(), atol=0.1, rtol=0.1)
    fp8.loss.backward()
    assert layer.intermediate.dense.weight.grad is not None and layer.intermediate.dense.weight.grad.abs().sum() > 0


@pytest.mark.slow
def test_the_cli_refuses_uncompiled_fp8_with_one_line_exit_2_and_writes_nothing(cli):
    r = cli(["model=tiny", "train.device=cpu", "dataset.train_subset=16", "dataset.test_subset=16",
             "precision=fp8"], timeout=300)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2, r.stderr[-3000:]
    assert lines == ["error: precision=fp8 needs torch.compile (compile=default): torchao fuses its FP8 "
                     "scaling and casts only when compiled; eagerly they are separate kernels and FP8 is "
                     "slower than bf16"], r.stderr[-3000:]
    assert not (cli.dir / "outputs").exists()
    assert not (cli.dir / "mlflow.db").exists()


@pytest.mark.slow
def test_the_doctor_lists_fp8_with_its_reason_on_a_cpu():
    from bertaccel.doctor.options import verdicts

    if torch.cuda.is_available():
        pytest.skip("the doctor's verdict on a CPU-only machine")
    found = dict(verdicts())
    assert found["precision=fp8"].startswith("precision=fp8 needs a CUDA GPU with FP8 tensor cores")


def test_what_importing_torchao_warns_stays_off_the_users_stderr(caplog):
    """transformers imports torchao wherever it is installed: its C++-kernel load failures and torch's
    notice on its Enum registrations are dropped (bertaccel/__init__.py), any other warning is not."""
    import enum
    import logging

    import bertaccel  # noqa: F401

    kernel = enum.Enum("KernelPreference", "AUTO")
    kernel.__module__ = "torchao.quantization.quantize_.common.kernel_preference"
    with caplog.at_level(logging.WARNING):
        logging.getLogger("torchao").warning("Failed to load _C_mxfp8.so: Could not load this library")
        logging.getLogger("torch.utils._pytree").warning("%s is an Enum subclass and is now natively supported", kernel)
        logging.getLogger("torch.utils._pytree").warning("%s is an Enum subclass and is now natively supported", "x")
    assert [r.getMessage() for r in caplog.records] == ["x is an Enum subclass and is now natively supported"]


def test_runs_recorded_before_fp8_existed_keep_their_identity(compose_cfg):
    """precision.fp8_recipe is new in every config: unset (null), it must not change config_hash,
    or every store's earlier runs would be strangers to resume and to a sweep's baseline."""
    from omegaconf import OmegaConf

    from bertaccel.record.tracking import config_hash

    resolved = OmegaConf.to_container(compose_cfg(["precision=bf16"]), resolve=True)
    assert resolved["precision"]["fp8_recipe"] is None
    before = {**resolved, "precision": {k: v for k, v in resolved["precision"].items() if k != "fp8_recipe"}}
    assert config_hash(resolved) == config_hash(before)  # a store written before the key existed
    fp8 = OmegaConf.to_container(compose_cfg(["precision=fp8", "compile=default"]), resolve=True)
    tensorwise, rowwise = fp8, {**fp8, "precision": {**fp8["precision"], "fp8_recipe": "rowwise"}}
    assert len({config_hash(before), config_hash(tensorwise), config_hash(rowwise)}) == 3  # set: identity


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script runs its tables (minutes)")
def test_the_fp8_benchmark_starts_and_says_in_one_line_that_it_needs_a_gpu():
    """benchmarks/fp8_ffn.py measures on a GPU only; on a CPU it must still import (its timer,
    cuda_timing.py, and argparse) and refuse in one line, so CI sees it break when its imports do."""
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "fp8_ffn.py"
    p = subprocess.run([sys.executable, str(script), "--ffn-only"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and p.stdout == "", p.stdout + p.stderr
    assert p.stderr.strip().splitlines() == ["fp8_ffn.py needs a CUDA GPU with FP8 tensor cores (sm_89 or newer)"]


def test_the_fp8_step_table_trains_the_shapes_of_the_model_options():
    """benchmarks/fp8_ffn.py's step table reads each model's shape from its option (the YAML of a
    random-init model, the package's config.json of the pretrained MiniLM), so the table's rows
    are the shapes a run of that option trains."""
    from pathlib import Path

    bench = Path(__file__).resolve().parent.parent / "benchmarks"
    sys.path.insert(0, str(bench))
    try:
        spec = importlib.util.spec_from_file_location("fp8_ffn_under_test", bench / "fp8_ffn.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        shapes = {name: (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.intermediate_size)
                  for name in ("minilm_l6", "bert_base_random", "bert_large_random")
                  for c in [module.model_config(name)]}
    finally:
        sys.path.remove(str(bench))
    assert shapes == {"minilm_l6": (384, 6, 12, 1536), "bert_base_random": (768, 12, 12, 3072),
                      "bert_large_random": (1024, 24, 16, 4096)}


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script measures (minutes)")
def test_the_fp8_gemm_ceiling_times_a_layers_four_linears_and_refuses_a_cpu_in_one_line():
    """benchmarks/fp8_gemm_ceiling.py: the GEMMs it times are a BERT layer's Linear layers (Q/K/V
    as one, attention output, FFN in and out: (K, N) as FusedBertLayer holds them), and without an
    FP8 GPU it stops with one line."""
    from pathlib import Path

    bench = Path(__file__).resolve().parent.parent / "benchmarks"
    sys.path.insert(0, str(bench))
    try:
        import fp8_gemm_ceiling as ceiling
    finally:
        sys.path.remove(str(bench))
    assert ceiling.layer_gemms(768, 3072) == [("qkv", 768, 2304), ("attention out", 768, 768), ("ffn in", 768, 3072),
                                              ("ffn out", 3072, 768)]
    from transformers import BertConfig

    from transformers.models.bert.modeling_bert import BertLayer

    from bertaccel.encoder.layer import FusedBertLayer

    cfg = BertConfig(hidden_size=64, num_attention_heads=4, intermediate_size=256)
    layer = FusedBertLayer(BertLayer(cfg), core=None)
    held = [(m.in_features, m.out_features) for m in (layer.qkv, layer.attention_output, layer.intermediate, layer.output)]
    assert held == [(k, n) for _, k, n in ceiling.layer_gemms(64, 256)]
    with pytest.raises(SystemExit, match="needs a CUDA GPU with FP8 tensor cores"):
        ceiling.main([])
