"""bertaccel.plan: grid expansion, the work count, calibration arithmetic on synthetic MLflow stores,
the profile fallback, hardware re-pricing, pruning, the CLI."""
from __future__ import annotations

import os
import random
import sys

import pytest
import torch

from bertaccel.measure.flops import TokenCounts
from bertaccel.plan.calibrate import DEFAULT_MFU, POWER_UTILISATION, RELAX_ORDER, similarity_key
from bertaccel.plan.output import dominated, score
from bertaccel.plan.predict import predict_one, store_references
from bertaccel.plan.pricing import Prediction
from bertaccel.plan.work import Work, epoch_batches
from bertaccel.report.scoring import STRATEGIES
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

A100 = {"name": "a100", "price_per_gpu_hour_usd": 1.79, "tdp_w": 400.0, "peak_tflops_bf16": 312.0,
        "peak_tflops_fp16": 312.0, "peak_tflops_fp32": 19.5}
H100 = {"name": "h100", "price_per_gpu_hour_usd": 2.99, "tdp_w": 700.0, "peak_tflops_bf16": 989.4,
        "peak_tflops_fp16": 989.4, "peak_tflops_fp32": 66.9}
CPU = {"name": "cpu", "price_per_gpu_hour_usd": 0.0893, "tdp_w": None, "peak_tflops_bf16": None,
       "peak_tflops_fp16": None, "peak_tflops_fp32": None}
PROFILES = {p["name"]: p for p in (A100, H100, CPU)}
# The params a run logs that the similarity key reads (record.open_tracker: choices + flattened config).
PARAMS = {"model.hidden_size": "32", "model.num_hidden_layers": "2", "model.num_attention_heads": "2",
          "model.intermediate_size": "64", "precision": "bf16", "attention": "sdpa", "compile.mode": "off",
          "compile.step_graph": "False", "optimizer": "adamw", "accumulation": "1", "train.batch_size": "16",
          "freezing": "none", "dataset.max_length": "128", "train.gradient_checkpointing": "none", "num_gpus": "1"}
WORK = Work(train_rows=512, epochs=2, micro_batches=64, optimizer_steps=64, tokens=TokenCounts(1024, 60000, 50000, 0),
            model_flops=3.0e15, samples=1024)


def _store(tmp_path, runs):
    """A real MLflow SQLite store with finished runs: (name, params, metrics, hardware_profile)."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("bertaccel", artifact_location=(tmp_path / "art").as_uri())
    ids = {}
    for name, params, metrics, hw in runs:
        run = client.create_run(exp, run_name=name, tags={"status": "finished", "hardware_profile": hw})
        for k, v in {**PARAMS, **params}.items():
            client.log_param(run.info.run_id, k, v)
        for k, v in metrics.items():
            client.log_metric(run.info.run_id, k, v)
        client.set_terminated(run.info.run_id)
        ids[name] = run.info.run_id
    return uri, ids


def _predict(uri, params=None, profile=A100, gpus=1, precision="bf16"):
    refs, _ = store_references(uri, "bertaccel")
    return predict_one("cfg", "h", WORK, {**PARAMS, **(params or {})}, profile, PROFILES, refs, precision, gpus)


@pytest.mark.slow  # several seconds on one core: the full suite runs it, the inner loop does not
def test_two_similar_runs_give_exact_predictions(tmp_path):
    # Pooled: (2e15 + 1e15) FLOPs over (10 + 6) s = 187.5 TFLOP/s; power (0.001 + 0.0004) kWh over 16 s = 315 W.
    uri, ids = _store(tmp_path, [
        ("a", {}, {"model_flops": 2e15, "train_time_s": 10.0, "energy_kwh": 0.001}, "a100"),
        ("b", {"optimizer": "adamw"}, {"model_flops": 1e15, "train_time_s": 6.0, "energy_kwh": 0.0004}, "a100"),
        ("other shape", {"model.hidden_size": "64"}, {"model_flops": 9e15, "train_time_s": 1.0}, "a100")])
    p = _predict(uri)
    rate = 3e15 / 16.0 / 1e12
    assert p.achieved_tflops_per_gpu == pytest.approx(rate)
    assert p.train_time_s == pytest.approx(3.0e15 / (rate * 1e12))  # 16.0 s
    assert p.train_time_s == pytest.approx(16.0)
    assert p.step_time_ms == pytest.approx(16.0 / 64 * 1000)
    assert p.cost_usd == pytest.approx(16.0 / 3600 * 1.79)
    power = (0.001 + 0.0004) * 3.6e6 / 16.0
    assert p.power_w_per_gpu == pytest.approx(power) and p.energy_kwh == pytest.approx(power * 16.0 / 3.6e6)
    assert p.mfu == pytest.approx(rate / 312.0)
    assert p.basis.startswith("runs: a (") and "b (" in p.basis and "other shape" not in p.basis
    assert set(p.run_ids) == {ids["a"], ids["b"]}
    # Two GPUs: the per-GPU rate and power scale with them; cost counts both GPUs.
    p2 = _predict(uri, {"num_gpus": "2"}, gpus=2)
    assert "let go" in p2.basis and "num_gpus" in p2.basis  # no 2-GPU run: num_gpus let go
    assert p2.train_time_s == pytest.approx(8.0) and p2.cost_usd == pytest.approx(8.0 / 3600 * 1.79 * 2)
    assert p2.energy_kwh == pytest.approx(p.energy_kwh)


@pytest.mark.slow  # several seconds on one core: the full suite runs it, the inner loop does not
def test_keys_are_let_go_in_the_stated_order(tmp_path):
    uri, ids = _store(tmp_path, [
        ("other freezing", {"freezing": "layerwise"}, {"model_flops": 1e15, "train_time_s": 1.0}, "a100"),
        ("other optimizer", {"optimizer": "lamb"}, {"model_flops": 1e15, "train_time_s": 4.0}, "a100"),
        ("not finished", {}, {"model_flops": 1e15, "train_time_s": 100.0}, "a100")])
    from mlflow import MlflowClient

    MlflowClient(tracking_uri=uri).set_tag(ids["not finished"], "status", "failed")
    p = _predict(uri)
    # optimizer is let go before freezing: the lamb run calibrates, alone.
    assert RELAX_ORDER.index("optimizer") < RELAX_ORDER.index("freezing")
    assert p.basis.startswith("runs: other optimizer") and p.basis.endswith("let go: optimizer")
    assert p.train_time_s == pytest.approx(3.0e15 / (1e15 / 4.0))
    # No run on a100 measured energy: the profile's TDP, at the stated utilisation.
    assert p.power_w_per_gpu == pytest.approx(POWER_UTILISATION * 400) and "assumed utilisation" in p.power_basis


def test_no_similar_run_falls_back_to_the_profile_and_says_so(tmp_path):
    uri, _ = _store(tmp_path, [("fp32 run", {"precision": "fp32"}, {"model_flops": 1e15, "train_time_s": 1.0}, "a100")])
    p = _predict(uri)  # bf16: the fp32 run is another precision, never let go
    assert p.achieved_tflops_per_gpu == pytest.approx(DEFAULT_MFU * 312.0)
    assert p.train_time_s == pytest.approx(3.0e15 / (DEFAULT_MFU * 312e12))
    assert p.basis == f"profile 'a100': no similar finished run; default MFU {DEFAULT_MFU:g} x peak_tflops_bf16 312"
    assert p.mfu == pytest.approx(DEFAULT_MFU)
    # A CPU has no peak in its profile: nothing to predict from, null with the reason, never 0.
    c = _predict(uri, profile=CPU)
    assert c.train_time_s is None and c.cost_usd is None and c.energy_kwh is None
    assert "no peak_tflops_bf16" in c.why["train_time_s"] and c.why["train_time_s"].startswith("null: ")
    # A store that does not exist is not created by reading it.
    missing = f"sqlite:///{tmp_path / 'none.db'}"
    refs, note = store_references(missing, "bertaccel")
    assert refs == [] and "does not exist" in note and not (tmp_path / "none.db").exists()


@pytest.mark.slow  # several seconds on one core: the full suite runs it, the inner loop does not
def test_hardware_repricing_scales_by_the_peak_ratio(tmp_path):
    uri, _ = _store(tmp_path, [("on a100", {"precision": "fp32"},
                                {"model_flops": 1.95e15, "train_time_s": 200.0, "energy_kwh": 0.02}, "a100")])
    on_a100 = _predict(uri, {"precision": "fp32"}, A100, precision="fp32")
    on_h100 = _predict(uri, {"precision": "fp32"}, H100, precision="fp32")
    assert on_a100.achieved_tflops_per_gpu == pytest.approx(1.95e15 / 200 / 1e12)  # 9.75: MFU 0.5
    assert on_h100.achieved_tflops_per_gpu == pytest.approx(9.75 * 66.9 / 19.5)    # the same MFU on the h100
    assert on_h100.mfu == pytest.approx(on_a100.mfu) == pytest.approx(0.5)
    assert on_h100.train_time_s == pytest.approx(on_a100.train_time_s * 19.5 / 66.9)
    assert on_h100.cost_usd == pytest.approx(on_h100.train_time_s / 3600 * 2.99)
    # Power: the a100 run's own on the a100; the h100 profile's TDP x utilisation there.
    assert on_a100.power_w_per_gpu == pytest.approx(0.02 * 3.6e6 / 200)
    assert on_h100.power_w_per_gpu == pytest.approx(POWER_UTILISATION * 700)
    assert "peak_tflops_fp32 ratio 66.9/19.5 (h100/a100)" in on_h100.basis and "same MFU" in on_h100.basis


def _pred(name, t, c, e):
    return Prediction(name, "a100", "bf16", 1, train_time_s=t, cost_usd=c, energy_kwh=e)


def test_prune_hand_worked_and_never_best_under_any_weights():
    preds = [_pred("A", 10, 1.0, 1.0), _pred("B", 5, 0.5, 0.5), _pred("C", 4, 2.0, 0.2), _pred("D", 5, 0.5, 0.5),
             _pred("E", 6, 0.5, 0.6), _pred("F", None, None, None)]
    dom = dominated(preds)
    # A by B (better in all), E by B (equal cost, worse time and energy); B and D tie: neither prunes
    # the other; C is the fastest and most frugal; F has no time: neither pruned nor pruning.
    assert set(dom) == {0, 4} and dom[0][0] == 1 and dom[4][0] == 1
    assert dom[0][1] == ["train_time_s", "cost_usd", "energy_kwh"]
    rng = random.Random(0)
    from bertaccel.plan.output import score_rows_of
    from bertaccel.report.scoring import score_rows

    rows = score_rows_of(preds, False)
    strategies = dict(STRATEGIES, **{f"r{k}": tuple(rng.random() for _ in range(4)) for k in range(200)})
    best = score_rows(rows, strategies).best
    assert not {0, 4} & set(best.values())
    # Energy unknown for one row: compared over time and cost only for all rows.
    preds[2].energy_kwh = None
    assert dominated(preds)[0][1] == ["train_time_s", "cost_usd"]


def test_predicted_scores_leave_out_occupancy_for_every_row():
    preds = [_pred("A", 10, 1.0, 1.0), _pred("B", 5, 0.5, 0.25)]
    s = score(preds, False)
    # balance (0.3, 0.3, 0.3, 0.1) without O: x 1.0 / 0.9; B: 0.3 x (0.5 + 0.5 + 0.25) / 0.9
    assert s.scores["balance"][1] == pytest.approx(0.3 * 1.25 / 0.9)
    assert s.scores["balance"][0] == pytest.approx(1.0)
    assert s.affected == {0: ["occupancy_pct"], 1: ["occupancy_pct"]}


def test_similarity_key_reads_compile_off_either_way():
    a = similarity_key({**PARAMS, "compile.mode": "False"}, "cpu")
    b = similarity_key({**PARAMS, "compile.mode": "off"}, "cpu")
    assert a == b and a["hardware"] == "cpu"


@pytest.mark.parametrize("overrides", [
    ["train.pad_to_multiple_of=8"],
    ["train.pad_to_multiple_of=1", "accumulation=3", "train.max_steps_per_epoch=4"],
    ["compile=default", "train.group_by_length=false"],   # fixed rows, plain shuffle
    ["num_gpus=2"],                                      # two ranks' shares
])
def test_work_replays_the_runs_own_batches(compose_cfg, overrides):
    """epoch_batches against the real DataLoader of bertaccel.data on the same lengths, every epoch."""
    from bertaccel.data import Batching, TokenizedSplit, make_loader
    from bertaccel.train.step import uses_fixed_shapes

    cfg = compose_cfg(["model=tiny", "train.batch_size=8", "train.epochs=2", *overrides])
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(3, 60, (101,), generator=g)
    offsets = torch.zeros(102, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)
    split = TokenizedSplit(torch.ones(int(offsets[-1]), dtype=torch.int32), offsets, torch.zeros(101, dtype=torch.int64))
    tokens, micro, steps, samples, rank0_lengths = epoch_batches(lengths, cfg)
    world, k = int(cfg.num_gpus), int(cfg.accumulation)
    batching = Batching(cfg.train.batch_size, cfg.train.pad_to_multiple_of, cfg.train.group_by_length,
                        uses_fixed_shapes(cfg))
    loaders = [make_loader(split, batching, 0, True, cfg.train.seed, r, world) for r in range(world)]
    want_samples, want_rank0 = 0, []
    for epoch in range(cfg.train.epochs):
        counts, n = TokenCounts(), 0
        for r, loader in enumerate(loaders):
            for i, batch in enumerate(loader):
                if cfg.train.max_steps_per_epoch and i == cfg.train.max_steps_per_epoch * k:
                    break
                counts.add(batch)
                want_samples += int((batch["labels"] >= 0).sum())
                n += 1
                if r == 0:
                    want_rank0.append(batch["input_ids"].shape[1])
        assert counts == tokens[epoch] and n == micro[epoch], epoch
    assert samples == want_samples and steps[0] == (4 if cfg.train.max_steps_per_epoch else -(-len(loaders[0]) // k))
    assert rank0_lengths == want_rank0  # the shapes the probe times (plan/probe.py)
    # The evaluation's batches, as the run's test loader cuts them (rank 0's share).
    from bertaccel.plan.work import eval_batches

    test = make_loader(split, batching.sized(cfg.train.eval_batch_size), 0, False, cfg.train.seed, 0, world)
    assert eval_batches(lengths, cfg) == [tuple(b["input_ids"].shape) for b in test]


def test_an_auto_batch_is_not_counted_before_the_run_and_says_what_to_plan_instead(compose_cfg):
    from bertaccel.plan.work import work_of

    with pytest.raises(ValueError, match="train.batch_size=auto: the batch is found by trying sizes on the GPU .* "
                                         "\\(metric batch_size_used\\)"):
        work_of(compose_cfg(["train.batch_size=auto"]), None, None)


def _plan(args, cwd, timeout=300):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return warm_cli.run([sys.executable, "-m", "bertaccel.plan", *args], cwd=cwd, capture_output=True, text=True,
                        timeout=timeout, env=env)


@pytest.mark.slow
@pytest.mark.parametrize("args,expected", [
    (["optimizer=adamw,nope"], "optimizer=nope is not an option of optimizer; choose one of:"),
    (["accumulation=[1,"], "cannot read the override 'accumulation=[1,'"),
    (["train.epochs=many"], "train.epochs"),
    (["--hardware", "a100,b200"], "--hardware a100,b200: b200 is not a hardware profile; choose from"),
    (["--config-name", "nosuchstudy"], "--config-name nosuchstudy: no such study or config"),
])
def test_cli_bad_input_is_one_line_exit_2_nothing_written(tmp_path, args, expected):
    r = _plan([*args, "--out", "planout", f"tracking.uri=sqlite:///{tmp_path / 'm.db'}"], tmp_path)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.slow
def test_cli_plans_a_tiny_grid_and_lists_an_invalid_one(tmp_path):
    from bertaccel.report import rows_from_csv

    r = _plan(["--config-name", "quick", "accumulation=1", "freezing=none,layerwise", "optimizer=adamw",
               "train.epochs=1", "optimizer.lr=1e-3,-1", "--hardware", "a100", "--prune", "--out", "planout",
               f"tracking.uri=sqlite:///{tmp_path / 'm.db'}", f"cache_dir={tmp_path / 'cache'}"], tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "== Predicted time, cost and energy (before running) ==" in out and "Table 5.4 form" in out
    assert "optimizer.lr=-1.0 must be > 0" in out  # the invalid half of the grid, listed with its reason
    assert "default MFU 0.3 x peak_tflops_fp32 19.5" in out and "does not exist yet" in out
    rows = rows_from_csv(str(tmp_path / "planout" / "plan.csv"))
    assert len(rows) == 8  # 4 configurations x (own hardware, a100)
    a100 = [x for x in rows if x.hardware == "a100" and x.time_s is not None]
    assert len(a100) == 2 and all(x.occupancy_pct is None and x.accuracy is None for x in a100)
    # freezing=layerwise trains less: fewer FLOPs, so less predicted time at one rate.
    none, layer = sorted(a100, key=lambda x: "layerwise" in x.name)
    assert layer.time_s < none.time_s and layer.epochs == none.epochs == 1.0
    md = (tmp_path / "planout" / "plan.md").read_text()
    assert "## Pruned" in md and "plots/predicted_time_vs_cost.png" in md
    assert (tmp_path / "planout" / "plots" / "predicted_time_vs_cost.png").stat().st_size > 1000
