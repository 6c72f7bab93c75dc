"""plan/roofline.py: the parts of a run and their roofline time (hand-computed), the transfer of a
measured time between GPUs, the profiles' bandwidth and launch fields, the counts' directions,
and the plan CLI choosing hardware from a run recorded on another GPU."""
from __future__ import annotations

import csv
import os
import sys

import pytest
from conftest import TINY

from bertaccel.config import CONF_DIR, ConfigError
from bertaccel.options.checks import validate
from bertaccel.options.hardware import load_profiles
from bertaccel.plan.calibrate import Reference, calibrate, similarity_key
from bertaccel.plan.roofline import (DEFAULT_KERNEL_LAUNCH_US, ESTIMATE, LAYER_COSTS, Parts, Shape,
                                     Trained, Uncounted, count, options, roofline_time, transfer)
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

PROFILES = {p["name"]: p for p in load_profiles()}
H100, H200, A100 = PROFILES["h100"], PROFILES["h200"], PROFILES["a100"]
BASE = Shape(hidden=768, layers=12, heads=12, intermediate=3072)
ALL_TRAIN = Trained(params=109_483_778, tensors=201, backward_layers=12, embedding_params=23_440_896,
                    linear_params=84_934_656)  # BERT-base, freezing=none (trained() on the meta model)
# The params a run logs that options() reads (BERT-base, bf16, sdpa, Hugging Face's layer, eager).
PARAMS = {"precision.autocast_dtype": "bfloat16", "precision.loss_scaling": "False",
          "attention.hf_implementation": "sdpa", "attention.swap": "null", "encoder.layer": "hf",
          "encoder.fused_kernels": "True", "encoder.half_params": "True", "compile.mode": "off",
          "compile.step_graph": "False", "optimizer": "adamw", "optimizer.max_grad_norm": "1.0",
          "train.gradient_checkpointing": "none"}


def test_parts_and_roofline_time_by_hand():
    # H=4, I=8, 2 layers, fp32 (4 bytes, no autocast casts), sdpa (no score matrix), no clipping,
    # adamw_fused (7 passes, 2 launches a step), 10 micro-steps of 100 tokens, one step each.
    o = options({**PARAMS, "precision.autocast_dtype": "null", "optimizer": "adamw_fused",
                 "optimizer.max_grad_norm": "null"})
    assert (o.layer, o.attention, o.element_bytes, o.graphs) == ("hf", "fused", 4.0, "none")
    shape = Shape(hidden=4, layers=2, heads=2, intermediate=8)
    t = Trained(params=100, tensors=4, backward_layers=2, embedding_params=0, linear_params=0)
    p = count(shape, o, gemm_flops=3e9, tokens=1000, pairs=5000, micro_steps=10, optimizer_steps=10, epochs=[t])
    # Per micro-step of 100 tokens: per layer forward (16H + 2I) = 80 elements x 4 B x 100 = 32000
    # + masks 2H B x 100 = 800; backward (29H + 4I) = 148 x 4 x 100 = 59200 + 800; two layers:
    # 185600. Embeddings (not training): 16H x 4 x 100 = 25600. Ten micro-steps: 2,112,000; the
    # optimizer 7 x 4 B x 100 params x 10 steps = 28,000.
    assert p.memory_bytes == 2_112_000 + 28_000
    # Launches: (15 + 30) x 2 layers + the rest 15 + 10 = 115 a micro-step, x 10, + 2 x 10.
    assert p.kernel_launches == 115 * 10 + 2 * 10
    assert p.gemm_flops == 3e9
    profile = {"name": "x", "peak_tflops_fp32": 100.0, "memory_bandwidth_tbps": 2.0, "kernel_launch_us": 4.0}
    r = roofline_time(p, profile, "fp32")
    assert r.gemm_s == pytest.approx(3e9 / 100e12)
    assert r.memory_s == pytest.approx(2_140_000 / 2e12)
    assert r.launch_s == pytest.approx(1170 * 4e-6)
    assert r.total_s == pytest.approx(3e-5 + 1.07e-6 + 4.68e-3)
    # Without a kernel_launch_us of its own the profile gets the host default.
    assert roofline_time(p, {**profile, "kernel_launch_us": None}, "fp32").launch_s == pytest.approx(
        1170 * DEFAULT_KERNEL_LAUNCH_US * 1e-6)
    with pytest.raises(Uncounted, match="has no memory_bandwidth_tbps"):
        roofline_time(p, {"name": "y", "peak_tflops_fp32": 1.0}, "fp32")


def test_transfer_scales_each_part_by_its_own_ceiling():
    seconds = 100.0
    # All memory-bound: H200 -> H100 takes the bandwidth ratio, 4.8 / 3.35.
    moved, basis = transfer(seconds, Parts(0.0, 1e12, 0.0), H200, H100, "bf16")
    assert moved == pytest.approx(seconds * 4.8 / 3.35)
    assert basis == ("roofline from h200 runs: GEMM 0% x 1 (peak_tflops_bf16 989.4/989.4), memory 100% x 1.43 "
                     "(memory_bandwidth_tbps 4.8/3.35), launch 0% x 1 (host-bound; kernel_launch_us 5, "
                     f"plan/roofline.py's default); {ESTIMATE}")
    # All GEMM: the two Hoppers have one peak, so no difference; A100 -> H100 by the peak ratio.
    assert transfer(seconds, Parts(1e15, 0.0, 0.0), H200, H100, "bf16")[0] == pytest.approx(seconds)
    assert transfer(seconds, Parts(1e15, 0.0, 0.0), A100, H100, "bf16")[0] == pytest.approx(seconds * 312 / 989.4)
    # All launches: the host's, whatever the GPU.
    assert transfer(seconds, Parts(0.0, 0.0, 1e6), A100, H100, "bf16")[0] == pytest.approx(seconds)
    # Mixed, in the proportions of the roofline times on the source (GEMM 1 s, memory 2 s, launch
    # 1 s on the H200): 25 % x 1 + 50 % x 4.8/3.35 + 25 % x 1.
    mixed = Parts(989.4e12, 2 * 4.8e12, 1 / (DEFAULT_KERNEL_LAUNCH_US * 1e-6))
    moved, basis = transfer(seconds, mixed, H200, H100, "bf16")
    assert moved == pytest.approx(25 + 50 * 4.8 / 3.35 + 25)
    assert "GEMM 25% x 1" in basis and "memory 50% x 1.43" in basis and "launch 25% x 1" in basis
    # A measured overhead is the launch part; the rest splits 1 : 2 over GEMM and memory.
    moved, basis = transfer(seconds, mixed, H200, H100, "bf16", overhead_s=40.0)
    assert moved == pytest.approx(40 + 20 + 40 * 4.8 / 3.35)
    assert "launch 40% x 1 (measured overhead, host-bound)" in basis
    with pytest.raises(Uncounted, match="'cpu' has no peak_tflops_bf16"):
        transfer(seconds, mixed, H200, PROFILES["cpu"], "bf16")


def _ref(hardware, seconds, flops=1e15, optimizer_steps=None):
    key = similarity_key({}, hardware)
    return Reference(f"id-{hardware}-{seconds}", f"run on {hardware}", key, flops, seconds, 1, None, optimizer_steps)


def test_calibrate_moves_runs_on_other_hardware_through_the_roofline():
    key = similarity_key({}, "h100")
    memory_heavy = Parts(989.4e12, 3 * 4.8e12, 0.0)  # on the H200: GEMM 1 s, memory 3 s
    cal = calibrate([_ref("h200", 40.0)], key, H100, PROFILES, "bf16", parts=lambda: memory_heavy)
    seconds = 10 + 30 * 4.8 / 3.35  # slower on the H100, by the bandwidth ratio on the memory share
    assert cal.tflops_per_gpu == pytest.approx(1e15 / seconds / 1e12)
    assert cal.basis.startswith("runs: run on h200 (id-h200-) on other hardware, roofline from h200 runs: GEMM 25%")
    assert cal.basis.endswith("; let go: optimizer, accumulation, train.batch_size, freezing, dataset.max_length, "
                              "train.gradient_checkpointing, num_gpus, hardware")
    # Two runs there that differ in FLOPs per step: fit.py tells their per-step overhead apart
    # (20 s = 100 steps x 0.1 s + 1e15 / 100 TFLOP/s; 30 s = 10 s + 2e15 / 100 TFLOP/s), and each
    # run keeps its 10 s as its launch part; the rest splits 1 : 3 over GEMM and memory.
    runs = [_ref("h200", 20.0, 1e15, optimizer_steps=100), _ref("h200", 30.0, 2e15, optimizer_steps=100)]
    cal = calibrate(runs, key, H100, PROFILES, "bf16", parts=lambda: memory_heavy)
    moved = (10 + 2.5 + 7.5 * 4.8 / 3.35) + (10 + 5 + 15 * 4.8 / 3.35)
    assert cal.tflops_per_gpu == pytest.approx(3e15 / moved / 1e12)
    assert "launch 50% x 1 (measured overhead, host-bound)" in cal.basis
    # A profile without a bandwidth, or parts that cannot be counted: the peak ratio, and why.
    no_bw = {**A100, "memory_bandwidth_tbps": None}
    cal = calibrate([_ref("a100", 40.0)], key, H100, {**PROFILES, "a100": no_bw}, "bf16", parts=lambda: memory_heavy)
    assert cal.tflops_per_gpu == pytest.approx(1e15 / (40.0 * 312 / 989.4) / 1e12)
    assert "peak_tflops_bf16 ratio 989.4/312 (h100/a100) (assumes the same MFU there; no roofline: hardware " \
           "profile 'a100' has no memory_bandwidth_tbps)" in cal.basis

    def uncounted():
        raise Uncounted("optimizer=sgd: plan/roofline.py does not know its passes and launches")
    cal = calibrate([_ref("h200", 40.0)], key, H100, PROFILES, "bf16", parts=uncounted)
    assert cal.tflops_per_gpu == pytest.approx(1e15 / 40.0 / 1e12)
    assert "no roofline: optimizer=sgd: plan/roofline.py does not know" in cal.basis


def _parts(**changes):
    trained = changes.pop("trained", ALL_TRAIN)
    return count(BASE, options({**PARAMS, **changes}), 1e15, tokens=32 * 128 * 100, pairs=32 * 128 * 128 * 100,
                 micro_steps=100, optimizer_steps=100, epochs=[trained])


def test_counts_move_the_obvious_ways():
    sdpa, eager = _parts(), _parts(**{"attention.hf_implementation": "eager"})
    assert eager.memory_bytes > sdpa.memory_bytes and eager.kernel_launches > sdpa.kernel_launches
    fused = _parts(**{"encoder.layer": "fused", "optimizer": "adamw_fused"})
    compiled = _parts(**{"compile.mode": "default"})
    graphs = _parts(**{"compile.mode": "reduce-overhead"})
    for other in (fused, compiled):
        assert other.kernel_launches < eager.kernel_launches and other.memory_bytes < eager.memory_bytes
    assert graphs.kernel_launches < compiled.kernel_launches and graphs.memory_bytes == compiled.memory_bytes
    # Launches per step: single-tensor > foreach > torch's fused > one flat kernel per group.
    steps = [_parts(optimizer=name).kernel_launches for name in ("adamw_single", "adamw", "adamw_torch_fused",
                                                                 "adamw_fused")]
    assert steps == sorted(steps, reverse=True) and len(set(steps)) == 4
    assert _parts(optimizer="adan").memory_bytes > sdpa.memory_bytes  # four states, not two
    # fp32 elements are wider than autocast's; layer-wise freezing stops the backward early.
    assert _parts(**{"precision.autocast_dtype": "null"}).memory_bytes > sdpa.memory_bytes
    one_layer = Trained(params=7_100_000, tensors=18, backward_layers=1, embedding_params=0, linear_params=7_077_888)
    frozen = _parts(trained=one_layer)
    assert frozen.memory_bytes < sdpa.memory_bytes and frozen.kernel_launches < sdpa.kernel_launches
    # Checkpointing recomputes the forward: more of every part.
    again = _parts(**{"train.gradient_checkpointing": "every"})
    assert again.gemm_flops > sdpa.gemm_flops and again.memory_bytes > sdpa.memory_bytes
    # Every optimizer option is counted from its class's declared step cost (no list in the plan).
    names = sorted(p.stem for p in (CONF_DIR / "optimizer").glob("*.yaml"))
    assert {"adamw", "adamw_fused", "adan", "lamb"} <= set(names) and ("hf", "scores") in LAYER_COSTS
    assert all(options({**PARAMS, "optimizer": name}).optimizer.passes > 0 for name in names)
    with pytest.raises(Uncounted, match="optimizer=sgd"):
        options({**PARAMS, "optimizer": "sgd"})


def test_profiles_carry_a_datasheet_bandwidth_and_refuse_a_bad_one(compose_cfg, tmp_path, monkeypatch):
    import bertaccel.options.hardware as hw

    gpus = ("t4", "a10", "v100", "a100", "h100", "h200")
    bandwidth = {name: PROFILES[name]["memory_bandwidth_tbps"] for name in gpus}
    assert bandwidth == {"t4": 0.32, "a10": 0.6, "v100": 0.9, "a100": 2.039, "h100": 3.35, "h200": 4.8}
    assert PROFILES["cpu"]["memory_bandwidth_tbps"] is None
    assert all(p["kernel_launch_us"] is None for p in PROFILES.values())  # the host's: the roofline's default
    for override, message in (("hardware.memory_bandwidth_tbps=-1", "hardware.memory_bandwidth_tbps=-1.0 must be "
                                                                    "> 0 (TB/s; null: unknown, no roofline)"),
                              ("hardware.kernel_launch_us=0", "hardware.kernel_launch_us=0.0 must be > 0")):
        with pytest.raises(ConfigError) as info:
            validate(compose_cfg(["hardware=cpu", override]))
        assert str(info.value).startswith(message) and "\n" not in str(info.value)
    # A profile file is held to the same declared range when --hardware reads it.
    (tmp_path / "fast.yaml").write_text("name: fast\nmatch: [X1]\nmemory_bandwidth_tbps: -3\n")
    monkeypatch.setattr(hw, "PROFILES_DIR", tmp_path)
    with pytest.raises(ConfigError) as info:
        hw.load_profiles()
    assert str(info.value) == ("conf/hardware/fast.yaml: memory_bandwidth_tbps=-3.0 must be > 0 "
                               "(TB/s; null: unknown, no roofline)")


@pytest.mark.slow
def test_plan_cli_prices_h100_from_a_run_recorded_on_h200(tmp_path):
    """A store with one finished run of the planned configuration, recorded on an H200: the plan's
    h100 row is that run's time moved through the roofline, and the hardware table ranks both."""
    from mlflow import MlflowClient

    from bertaccel.plan.grid import expand
    from bertaccel.plan.predict import run_params
    from bertaccel.plan.roofline import parts_of
    from bertaccel.model import hf_config
    from bertaccel.plan.work import data_shape, work_of

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = [*TINY, "train.epochs=1", f"tracking.uri={uri}", f"cache_dir={tmp_path / 'cache'}"]
    planned = expand("config", args).configs[0]
    typed = planned.run  # the config typed once by the plan's validation, as the plan predicts from it
    assert typed is not None, planned.invalid
    data = data_shape(typed)
    config = hf_config(typed.model, data.num_labels, data.vocab_size)
    work = work_of(typed, data, config)
    params = run_params(typed, planned.choices, config)
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("bertaccel", artifact_location=(tmp_path / "art").as_uri())
    run = client.create_run(exp, run_name="on h200", tags={"status": "finished", "hardware_profile": "h200"})
    for k, v in params.items():
        client.log_param(run.info.run_id, k, v)
    client.log_metric(run.info.run_id, "model_flops", work.model_flops)
    client.log_metric(run.info.run_id, "train_time_s", 20.0)
    client.set_terminated(run.info.run_id)

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    r = warm_cli.run([sys.executable, "-m", "bertaccel.plan", *args, "--hardware", "h100,h200", "--out", "plan"],
                     cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {row["hardware"]: row for row in csv.DictReader(open(tmp_path / "plan" / "plan.csv"))}
    expected, basis = transfer(20.0, parts_of(work, params), H200, H100, typed.precision.mfu_peak)
    assert float(rows["h200"]["time_s"]) == pytest.approx(20.0) and rows["h200"]["basis"].startswith("runs: on h200")
    assert float(rows["h100"]["time_s"]) == pytest.approx(expected, rel=1e-6)
    assert 20.0 < expected < 20.0 * 4.8 / 3.35  # the memory-bound share only is slower there
    assert "on other hardware, roofline from h200 runs: GEMM " in rows["h100"]["basis"]
    assert basis in rows["h100"]["basis"]
    assert "== Which hardware to rent (predicted, per configuration) ==" in r.stdout
    cheapest = "h100" if expected * 2.99 < 20.0 * 3.79 else "h200"
    line = next(x for x in r.stdout.splitlines() if x.startswith("0 ") and " < " in x)
    assert line.split()[2:4] == ["h200", cheapest], line  # the fastest, the cheapest
