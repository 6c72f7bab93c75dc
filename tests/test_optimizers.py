"""Optimizer options: each YAML builds its class with its own settings; schedules; one-home check."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from bertaccel.config import CONF_DIR, ConfigError
from bertaccel.options.checks import validate
from bertaccel.options.optimizer import build_optimizer, lr_factor, scaled_lr

OPTIONS = sorted(p.stem for p in (CONF_DIR / "optimizer").glob("*.yaml"))


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))


@pytest.mark.parametrize("option", OPTIONS)
def test_every_optimizer_option_builds_and_steps_from_its_yaml(compose_cfg, option):
    cfg = compose_cfg([f"optimizer={option}"])
    validate(cfg)
    model = _model()
    opt = build_optimizer(model, cfg.optimizer)
    assert opt.param_groups[0]["lr"] == cfg.optimizer.lr
    assert [g["weight_decay"] for g in opt.param_groups] == [cfg.optimizer.weight_decay, 0.0]  # no decay on biases/LN
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.randn(16, 4)).pow(2).mean().backward()
    opt.step()
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_adamw_single_and_foreach_are_torchs_and_adamw_fused_is_the_flat_kernel(compose_cfg):
    from bertaccel.optimizers.adamw_flat import AdamWFused

    opts = {o: build_optimizer(_model(), compose_cfg([f"optimizer={o}"]).optimizer)
            for o in ("adamw_single", "adamw", "adamw_fused")}
    assert (opts["adamw_single"].defaults["foreach"], opts["adamw_single"].defaults["fused"]) == (False, False)
    assert opts["adamw"].defaults["foreach"] is True
    fused = opts["adamw_fused"]  # one Triton launch per group, fp32 masters for half parameters
    assert isinstance(fused, AdamWFused) and fused.master_weights
    assert (fused.defaults["betas"], fused.defaults["eps"]) == ((0.9, 0.999), 1e-8)


def test_an_options_own_class_rejects_its_bad_settings_in_one_line(compose_cfg):
    with pytest.raises(ConfigError, match=r"^optimizer=adamw: Invalid beta parameter at index 0: 1.5$"):
        validate(compose_cfg(["optimizer.impl.betas=[1.5,0.999]"]))
    with pytest.raises(ConfigError, match="optimizer.impl cannot be instantiated"):
        validate(compose_cfg(["optimizer.impl._target_=torch.optim.NoSuchOptimizer"]))


def test_adding_an_optimizer_is_one_yaml_and_one_class(compose_cfg, tmp_path):
    # The class: here torch's SGD with its own setting (momentum); the YAML: its one home.
    (tmp_path / "optimizer").mkdir()
    (tmp_path / "optimizer" / "toy_sgd.yaml").write_text(textwrap.dedent("""\
        name: toy_sgd
        lr: 0.5
        weight_decay: 0.0
        schedule: constant
        impl:
          _target_: torch.optim.SGD
          _partial_: true
          momentum: 0.9
        """))
    cfg = compose_cfg(["optimizer=toy_sgd"], searchpath=tmp_path)
    validate(cfg)
    opt = build_optimizer(_model(), cfg.optimizer)
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["momentum"] == 0.9 and opt.defaults["lr"] == 0.5


def test_cosine_decays_to_its_floor_and_linear_scaling_counts_the_global_batch(compose_cfg):
    total, warm = 100, 0.1
    assert lr_factor("cosine", 10, total, warm, 0.1) == pytest.approx(1.0)
    assert lr_factor("cosine", 55, total, warm, 0.1) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_factor("cosine", 100, total, warm, 0.1) == pytest.approx(0.1)  # eta_min = 0.1 x base (seed 001 eq. 10)
    assert min(lr_factor("cosine", s, total, warm, 0.1) for s in range(10, 100)) >= 0.1
    cfg = compose_cfg(["optimizer.scale_lr=linear", "optimizer.base_batch_size=32", "optimizer.lr=1e-4"]).optimizer
    assert scaled_lr(cfg, 256) == pytest.approx(8e-4)  # seed 001 eq. 11: lr x B / B_base
    assert scaled_lr(compose_cfg([]).optimizer, 256) == compose_cfg([]).optimizer.lr
    with pytest.raises(ConfigError, match="min_lr_ratio"):
        validate(compose_cfg(["optimizer.min_lr_ratio=1.5"]))


@pytest.mark.slow
@pytest.mark.parametrize("option, cls", [("adan_fused", "AdanFused"), ("adamw_fused", "AdamWFused")])
def test_a_gpu_only_optimizer_is_a_skip_on_the_cpu_not_bad_input(option, cls):
    # Without the Triton interpreter, the flat-buffer Triton optimizers cannot run on a CPU: the
    # run is skipped with its class's reason (skip_reason), while validate() accepts the settings.
    import os
    import subprocess
    import sys

    code = textwrap.dedent(f"""
        from hydra import compose, initialize_config_dir
        import torch
        from bertaccel.options.checks import validate
        from bertaccel.config import register_configs
        from bertaccel.options.hardware import probe, skip_reason
        register_configs()
        with initialize_config_dir(config_dir={str(CONF_DIR)!r}, version_base="1.3"):
            cfg = compose(config_name="config", overrides=["optimizer={option}", "model=tiny"])
        validate(cfg)
        print(skip_reason(cfg, torch.device("cpu"), probe()))
        """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().startswith(f"optimizer={option} cannot run on cpu: {cls}"), out.stdout


@pytest.mark.slow
def test_optimizer_benchmark_prints_every_option_side_by_side():
    import os
    import subprocess
    import sys

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "optimizers.py"
    out = subprocess.run([sys.executable, str(script), "--device", "cpu", "--tiny", "--steps", "2", "--warmup", "1",
                          "--options", "adamw_single,adamw_fused,adan,lamb", "--capturable"],
                         env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {line.split("|")[1].strip(): line.split("|")[2:4] for line in out.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| option")}
    plain = {"adamw_single", "adamw_fused", "adan", "lamb"}
    assert set(rows) == plain | {f"{o} (capturable)" for o in plain}
    # --capturable: torch's optimizers cannot step capturable on a CPU (a row with the reason, no
    # figure); the flat-buffer one runs (interpreted) and its step count advances in its own launch.
    assert rows["adamw_single (capturable)"][0].strip().startswith("null: not capturable here")
    assert float(rows["adamw_fused (capturable)"][0]) > 0
    rows = {k: v for k, v in rows.items() if k in plain}
    ops = {k: int(v[1]) for k, v in rows.items()}
    assert all(float(v[0]) > 0 for v in rows.values())
    # single-tensor: ops per tensor; foreach: a fixed set. adamw_fused is one Triton kernel per
    # group, here run by Triton's interpreter, whose argument copies are aten ops: on a CPU its count
    # measures the interpreter, and the table says its time is no speed.
    assert ops["adamw_single"] > ops["adan"]
    assert "adamw_fused, adamw_fused (capturable) ran in Triton's interpreter (TRITON_INTERPRET=1)" in out.stdout
