"""torch.compile on the CPU: every shape compiled before the training window, and the count
of compiles inside the window is 0 (and would not be without the warm-up); compile caches."""
from __future__ import annotations

import os

import pytest
import torch
from conftest import tiny_training
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from bertaccel.config import CONF_DIR, CompileConfig, register_configs
from bertaccel.measure.step_clock import steady_median_ms
from bertaccel.options.hardware import probe
from bertaccel.train.compile_cache import cache_key, cache_key_parts, compile_caches
from bertaccel.train.loop import train
from bertaccel.train.warmup import WarmupPlan, data_lengths

# Every test here starts a real process (the CLI, a script, a server) or trains: slow (docs/contributing.md).
pytestmark = pytest.mark.slow

CPU = torch.device("cpu")


def _setup(compose_cfg, tmp_path, overrides):
    cfg = compose_cfg(["model=tiny", "train.device=cpu", "dataset.train_subset=96", "dataset.test_subset=48",
                       "train.batch_size=16", "train.eval_batch_size=32", "train.pad_to_multiple_of=16",
                       "dataset.max_length=64", f"cache_dir={tmp_path}", *overrides])
    model, loaders, data = tiny_training(cfg)
    plan = WarmupPlan(16, 32, data_lengths(data.train.lengths, 16), data_lengths(data.test.lengths, 16))
    return cfg, model, loaders, plan


needs_cxx = pytest.mark.skipif(probe().cxx_compiler is None, reason="torch.compile on the CPU needs a C++ compiler")


@pytest.fixture(scope="module")
def persistent_twice(tmp_path_factory):
    """The same compiled configuration trained twice against one persistent cache, in a directory
    of its own: (the first run's result and warm-up plan, the cache's state after each run). One
    Inductor compile from cold (40-60 s on CI's box) for the two tests that read it: the first run
    compiles everything cold, as a fresh cache would (compile_caches clears the in-memory caches),
    so it is the run whose window is checked; the second is the warm one. (test_without_the_warmup
    still trains through a fresh cache.)"""
    register_configs()
    GlobalHydra.instance().clear()
    cache = tmp_path_factory.mktemp("persistent_twice")
    runs = []
    try:
        for _ in range(2):
            with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
                cfg, model, (tr, te), plan = _setup(
                    lambda o: compose(config_name="config", overrides=list(o)), cache, ["compile=default"])
            torch.compiler.reset()
            with compile_caches(cfg.cache_dir, cfg.compile, CPU) as c:
                result = train(model, tr, te, cfg, CPU, log=lambda m: None, warmup_plan=plan)
                c.mark_warmed_up()
                runs.append((result, plan, c.state(result.compiled_anything)))
    finally:
        GlobalHydra.instance().clear()
    return runs[0][0], runs[0][1], [state for _, _, state in runs]


@needs_cxx
def test_compiled_run_compiles_nothing_inside_its_window(persistent_twice):
    result, plan, states = persistent_twice
    assert states[0] == "cold"  # compiled from nothing, as through a fresh cache
    assert len(plan.train_lengths) >= 3  # ragged real text: several padded lengths
    assert result.compiled_anything and result.compile_time_s > 0
    assert result.compile_graphs >= 2  # at least a training graph and an evaluation graph
    assert result.recompiles_in_window == 0
    # The warm-up covered the evaluation's shapes too: nothing compiled inside eval_time_s.
    assert f"eval 32 rows x {len(plan.eval_lengths)} lengths" in result.compile_time_source
    # ... and the optimizer's first step (tests/test_first_update_warmup.py: it leaves no trace)
    assert result.compile_time_source.endswith("then the optimizer's first update on zero gradients, undone "
                                               "(its kernels compiled or loaded, its buffers allocated)")
    assert result.compiles_in_eval == 0
    assert result.step_time_ms is not None and result.step_time_ms > 0
    assert result.samples == 96  # filler rows of the short last batch are not samples


@needs_cxx
def test_without_the_warmup_the_window_counts_its_compiles(compose_cfg, tmp_path):
    """The counter is not a check that cannot fail: with nothing warmed up, the graphs compile
    inside the window and are counted there."""
    cfg, model, (tr, te), plan = _setup(compose_cfg, tmp_path, ["compile=default", "train.max_steps_per_epoch=2"])
    torch.compiler.reset()
    with compile_caches(cfg.cache_dir, CompileConfig(cache="fresh"), CPU):
        lines = []
        result = train(model, tr, te, cfg, CPU, log=lines.append, warmup_plan=WarmupPlan(16, 32, [], []))
    assert result.recompiles_in_window >= 1
    # The warning says which kind compiled (here dynamo's graphs), so a report from a GPU run
    # tells a missed shape apart from a CUDA-graph re-recording.
    warning = next(m for m in lines if "inside the training window" in m)
    assert f"{result.recompiles_in_window} dynamo graphs" in warning
    # Nor were the evaluation's shapes: its compiles are counted and said apart from the window's.
    assert result.compiles_in_eval >= 1
    warning = next(m for m in lines if "inside the evaluation" in m)
    assert f"{result.compiles_in_eval} dynamo graphs" in warning and "eval_time_s includes compilation" in warning


def test_eager_run_compiles_nothing(compose_cfg, tmp_path):
    cfg, model, (tr, te), plan = _setup(compose_cfg, tmp_path, ["train.max_steps_per_epoch=3"])
    result = train(model, tr, te, cfg, CPU, log=lambda m: None, warmup_plan=plan)
    assert not result.compiled_anything and result.compile_time_s == 0.0
    assert "nothing compiled" in result.compile_time_source and "first update" not in result.compile_time_source
    assert result.recompiles_in_window == 0 and result.compiles_in_eval == 0


def test_cache_key_changes_with_torch_triton_and_device():
    parts = cache_key_parts(CPU)
    assert {"torch", "triton", "cuda", "python", "device"} <= parts.keys()
    assert parts["torch"] == torch.__version__
    base = cache_key(parts)
    assert cache_key(dict(parts)) == base
    for field, other in (("torch", "2.99.0"), ("triton", "9.9.9"), ("device", "NVIDIA H200 sm_90")):
        assert cache_key({**parts, field: other}) != base, field


def test_fresh_cache_starts_empty_and_persistent_is_reused(tmp_path):
    before = {k: os.environ.get(k) for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    with compile_caches(str(tmp_path), CompileConfig(cache="fresh"), CPU) as c:
        root = c.root
        assert c.files_at_start == 0 and not any(root.iterdir())
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"].startswith(str(root))
        assert os.environ["TRITON_CACHE_DIR"].startswith(str(root))
        c.mark_warmed_up()
        assert c.state(compiled_anything=True) == "fresh"
    assert not root.exists()  # removed with the run
    assert {k: os.environ.get(k) for k in before} == before  # environment restored

    with compile_caches(str(tmp_path), CompileConfig(cache="persistent"), CPU) as c:
        assert c.root.parent == tmp_path / "compile"
        (c.root / "triton").mkdir()
        (c.root / "triton" / "kernel.cubin").write_text("compiled")  # what a Triton compile writes
        c.mark_warmed_up()
        assert c.state(compiled_anything=True) == "cold"
        assert c.state(compiled_anything=False) == "none"
    with compile_caches(str(tmp_path), CompileConfig(cache="persistent"), CPU) as c2:
        assert c2.root == c.root and c2.files_at_start >= 2  # the same keyed directory, kept
        c2.mark_warmed_up()
        assert c2.state(compiled_anything=True) == "warm"


def test_steady_median_leaves_out_each_windows_first_steps():
    assert steady_median_ms([[100.0, 50.0, 40.0, 10.0, 11.0, 12.0]], skip=3) == 11.0
    # two windows: each loses its first 3 steps; a window too short to lose any keeps all
    assert steady_median_ms([[90, 90, 90, 1, 3], [5, 7]], skip=3) == 4.0
    assert steady_median_ms([]) is None


@needs_cxx
def test_second_run_finds_the_compiled_graphs_in_the_persistent_cache(persistent_twice):
    """The same configuration twice against one persistent cache: cold, then warm (Inductor's
    FX-graph cache hits, counted)."""
    _, _, states = persistent_twice
    assert states == ["cold", "warm"]


def test_one_step_breakdown_adds_up_to_the_step_time(compose_cfg, tmp_path):
    # Seed 004's Table 4.10 form: forward, backward and optimizer per step, from the loop's own
    # marks. Their sum leaves out only the loop's work between steps, so it is a little below
    # the step time, never above it.
    cfg, model, (tr, te), plan = _setup(compose_cfg, tmp_path, ["accumulation=2"])
    result = train(model, tr, te, cfg, CPU, log=lambda m: None, warmup_plan=plan)
    phases = result.phase_ms
    assert set(phases) == {"forward_ms", "backward_ms", "optimizer_ms"}
    assert all(v is not None and v > 0 for v in phases.values()), phases
    steps = result.epochs[0].phase_ms
    assert len(steps) == result.optimizer_steps == 3  # 96 rows / (16 x 2)
    # Structure, not speed: the phases lie inside their step (a ratio of CPU times would fail
    # whenever another process takes the cores, as it did once beside a CI run).
    for step, total in zip(steps, result.epochs[0].step_ms):
        assert 0 < sum(step.values()) <= total + 1e-6
