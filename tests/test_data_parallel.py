"""Data parallel on the CPU: 2 gloo processes running the real training core's functions."""
from __future__ import annotations

import faulthandler
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from transformers import BertConfig, BertForSequenceClassification

from bertaccel import distributed
from bertaccel.data import LengthGroupedBatches, PadCollator, ShuffledBatches
from bertaccel.options.precision import Precision
from bertaccel.train.forward import Forward
from bertaccel.train.step import accumulate_window, data_parallel, evaluate
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

HANG_S = 240


def _model():
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, num_labels=3)
    return BertForSequenceClassification(cfg).eval()  # dropout off: both sides compute one function


def _samples(n):
    g = torch.Generator().manual_seed(1)
    # equal lengths: a micro-batch's padding does not depend on how the rows are split
    return [(torch.randint(1, 120, (10,), generator=g), torch.randint(0, 3, (1,), generator=g)[0]) for _ in range(n)]


def _step(model, step_model, windows_for_rank, no_sync=None):
    """Two SGD steps (momentum: the second depends on the first's gradients) over this rank's
    window, gradients set to None between them as the loop does; returns the new weights. Under
    DDP each .grad is a view of its all-reduce bucket (gradient_as_bucket_view)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    kwargs = {} if no_sync is None else {"no_sync": no_sync}
    for _ in range(2):
        opt.zero_grad(set_to_none=True)
        accumulate_window(Forward(step_model, Precision("fp32", torch.device("cpu")), torch.device("cpu"), module=model),
                          windows_for_rank, **kwargs)
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


MICROS = [1, 2]


def _rank_main(rank, port, out_dir):
    faulthandler.dump_traceback_later(HANG_S - 20, exit=True)  # a hung rank says where, then ends
    torch.set_num_threads(1)
    r = distributed.Rank(rank, 2, f"tcp://127.0.0.1:{port}", 60)
    with distributed.process_group(r, "cpu"):
        # Every micro-batch count in one pair of rank processes (their start, imports and process
        # group are most of the time), each from a fresh model and a fresh DDP wrapper.
        for micro in MICROS:
            model = _model()
            ddp = data_parallel(model, torch.device("cpu"))
            assert ddp is not None and distributed.world_size() == 2
            collate = PadCollator(0)
            mine = _samples(16)[rank * 8:(rank + 1) * 8]  # batch b=8 per rank, global 16
            window = [collate(mine[i:i + 8 // micro]) for i in range(0, 8, 8 // micro)]
            weights = _step(model, ddp, window, ddp.no_sync)
            # evaluation: 5 test batches split 3 / 2 over the ranks, accuracy over all of them
            accuracy = evaluate(Forward(model, Precision("fp32", torch.device("cpu")), torch.device("cpu")),
                                distributed.shard(_test_batches(), rank, 2, equal=False))
            torch.save({"weights": weights, "accuracy": accuracy},
                       os.path.join(out_dir, f"rank{rank}_micro{micro}.pt"))


def _test_batches():
    g = torch.Generator().manual_seed(7)
    rows = [(torch.randint(1, 120, (int(torch.randint(3, 12, (1,), generator=g)),), generator=g),
             torch.randint(0, 3, (1,), generator=g)[0]) for _ in range(37)]
    return [PadCollator(0)(rows[i:i + 8]) for i in range(0, 37, 8)]


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory):
    """The 2 ranks' weights and accuracy for every micro-batch count, from one spawn shared by the
    tests below, which only read the files (spawning 2 ranks, each importing torch and transformers,
    took ~25 s a test)."""
    out = tmp_path_factory.mktemp("ranks")
    ranks = mp.start_processes(_rank_main, args=(_port(), str(out)), nprocs=2, start_method="spawn", join=False)
    deadline = time.monotonic() + HANG_S
    while not ranks.join(timeout=1):  # raises if a rank failed
        if time.monotonic() > deadline:
            for p in ranks.processes:
                p.kill()
            pytest.fail(f"the 2 ranks did not finish in {HANG_S} s")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("micro", MICROS, ids=["one-micro-batch", "accumulation-no_sync"])
def test_two_ranks_of_batch_b_step_like_one_process_of_batch_2b(two_rank_results, micro):
    model = _model()
    expected = _step(model, model, [PadCollator(0)(_samples(16))])
    expected_accuracy = evaluate(Forward(model, Precision("fp32", torch.device("cpu")), torch.device("cpu")),
                                 _test_batches())
    for rank in (0, 1):
        got = torch.load(two_rank_results / f"rank{rank}_micro{micro}.pt")
        for name, w in expected.items():
            torch.testing.assert_close(got["weights"][name], w, rtol=1e-5, atol=1e-6, msg=f"rank {rank} {name}")
        assert got["accuracy"] == expected_accuracy  # summed over both ranks' shares, 37 rows
    # the step moved the weights (a test that compares two untouched models would pass anyway)
    assert not torch.equal(expected["classifier.weight"], _model().classifier.weight.detach())


def test_ranks_get_disjoint_equal_shares_of_the_same_bucketed_batches():
    lengths = torch.randint(5, 60, (203,), generator=torch.Generator().manual_seed(0))
    whole = list(LengthGroupedBatches(lengths, 8, torch.Generator().manual_seed(4)))
    shares = [list(LengthGroupedBatches(lengths, 8, torch.Generator().manual_seed(4), rank=r, world=2))
              for r in (0, 1)]
    assert len(shares[0]) == len(shares[1]) == len(whole) // 2 == len(
        LengthGroupedBatches(lengths, 8, torch.Generator(), rank=1, world=2))
    seen = [i for share in shares for b in share for i in b]
    assert len(seen) == len(set(seen))  # disjoint
    # the same buckets as one process: every rank's batch is one of the single-process batches
    as_sets = {frozenset(b) for b in whole}
    assert all(frozenset(b) in as_sets for share in shares for b in share)
    # each step's batches are neighbours in one sorted mega-batch: their lengths do not interleave,
    # so no rank waits on a much longer batch of another (several mega-batches; 4 ranks too)
    many = torch.randint(5, 60, (2000,), generator=torch.Generator().manual_seed(1))
    for world in (2, 4):
        per_rank = [list(LengthGroupedBatches(many, 8, torch.Generator().manual_seed(4), rank=r, world=world))
                    for r in range(world)]
        for step in zip(*per_rank):
            spans = sorted((min(many[b].tolist()), max(many[b].tolist())) for b in step)
            assert all(hi_prev <= lo_next for (_, hi_prev), (lo_next, _) in zip(spans, spans[1:])), spans
    plain = [list(ShuffledBatches(50, 8, torch.Generator().manual_seed(2), rank=r, world=2)) for r in (0, 1)]
    assert len(plain[0]) == len(plain[1]) == 3
    assert not set(i for b in plain[0] for i in b) & set(i for b in plain[1] for i in b)


@pytest.mark.slow
def test_num_gpus_2_on_cpu_is_one_mlflow_run_with_the_whole_test_split(tmp_path):
    # Imported here, not at the top: the spawned rank processes above import this module, and
    # mlflow's import (seconds) is of no use to them.
    from mlflow.tracking import MlflowClient

    from bertaccel.plan.predict_dp import PredictError, predict

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = warm_cli.run([sys.executable, "-m", "bertaccel.run", "-m", "num_gpus=1,2", "model=tiny",
                         "train.device=cpu", "dataset.train_subset=64", "dataset.test_subset=40",
                         "train.batch_size=8", "train.eval_batch_size=16", "layer_timing=true", f"cache_dir={tmp_path / 'c'}",
                         f"tracking.uri={uri}"], cwd=tmp_path, env=env, capture_output=True, text=True,
                        timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("bertaccel")
    runs = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("bertaccel.role") != "sweep"]
    assert len(runs) == 2, [r.info.run_name for r in runs]  # one per configuration, none per rank
    by_world = {r.data.tags["world_size"]: r for r in runs}
    assert set(by_world) == {"1", "2"}
    two = by_world["2"]
    assert two.data.tags["status"] == "finished" and two.data.tags["backend"] == "gloo"
    # global batch = 2 x 8: half the optimizer steps of the 1-process run, every train row once
    assert two.data.metrics["optimizer_steps"] == by_world["1"].data.metrics["optimizer_steps"] / 2 == 4
    assert two.data.metrics["throughput_samples_s"] > 0 and 0 <= two.data.metrics["test_accuracy"] <= 1
    # DDP's one-time costs (communicators, bucket rebuild) are paid in a warm-up, named as such
    assert two.data.metrics["compile_time_s"] > 0
    assert "data-parallel warm-up" in two.data.tags["compile_time_s_source"]
    assert by_world["1"].data.tags["compile_time_s_source"].startswith("nothing compiled (compile=off, ")
    # layer_timing: per-layer times in backward order; all-reduce times only where there are peers
    for world, run in by_world.items():
        m = run.data.metrics
        assert m["backward_measured_ms"] > 0 and m["backward_predicted_ms"] > 0, m
        assert run.data.tags["backward_predicted_ms_source"].startswith("backprop_estimator.estimate_backward")
        table = json.loads(Path(client.download_artifacts(run.info.run_id, "layer_timing/layer_timing.json",
                                                          str(tmp_path))).read_text())
        assert [x["name"] for x in table["layers"]] == ["head", "encoder.1", "encoder.0", "embeddings"]
        comm = [x["comm_ms"] for x in table["layers"]]
        assert all(c > 0 for c in comm) if world == "2" else all(c == 0 for c in comm)
        assert m["backward_predicted_thesis_ms"] > 0 and "backward_thesis_error_pct" in m
        assert len(table["predicted_by_pass_ms"]) == len(table["measured_by_pass_ms"]) == table["steps"]
        if world == "2":  # DDP's buckets, each with both ranks' ready marks, the model over them
            assert table["buckets"] and all(len(b["ready_ms_by_rank"]) == 2 and b["comm_ms"] > 0
                                            for b in table["buckets"])
            assert {n for b in table["buckets"] for n in b["layers"]} == {"head", "encoder.1", "encoder.0", "embeddings"}
            assert sum(b["grad_bytes"] for b in table["buckets"]) == sum(x["grad_bytes"] for x in table["layers"])
            assert len(table["forward_ms_by_rank"]) == 2
            assert run.data.tags["backward_predicted_ms_source"].startswith("backprop_estimator.estimate_backward_ranks")
        if world == "1":  # no communication: the estimate is the sum of the layers' compute
            total = sum(x["compute_ms"] for x in table["layers"])
            assert abs(m["backward_predicted_ms"] - total) < 1e-6 and total <= m["backward_measured_ms"] * 1.2  # medians of parts vs of totals
        for name in ("forward_ms", "backward_ms", "optimizer_ms"):
            assert m[name] > 0

    # predict_dp: the 1-rank run's layers predict 2 ranks; the real 2-rank run is the check
    one_id, two_id = by_world["1"].info.run_id, two.info.run_id
    table = predict(uri, one_id, 1.0, [2, 4], 0.0, check_run_id=two_id)
    row2 = next(line for line in table.splitlines() if line.startswith("| 2 |")).split("|")
    assert float(row2[2]) > 0 and float(row2[3]) == pytest.approx(two.data.metrics["step_time_ms"], abs=0.01)
    assert next(line for line in table.splitlines() if line.startswith("| 4 |")).split("|")[3].strip() == "-"
    # anchored on the run's own measured step: one rank adds nothing to it, more ranks add all-reduce time
    rows = {int(line.split("|")[1]): float(line.split("|")[2])
            for line in predict(uri, one_id, 1.0, [1, 2, 4], 0.0).splitlines() if line[:3] in ("| 1", "| 2", "| 4")}
    assert rows[1] == pytest.approx(by_world["1"].data.metrics["step_time_ms"], abs=0.01)
    assert rows[1] < rows[2] < rows[4]
    slow = float(next(line for line in predict(uri, one_id, 0.001, [2], 0.0).splitlines()
                      if line.startswith("| 2 |")).split("|")[2])
    assert slow > float(row2[2])  # less bandwidth, longer step
    with pytest.raises(PredictError, match="predict from a num_gpus=1 run"):
        predict(uri, two_id, 1.0, [2], 0.0)

    # benchmarks/dp_table.py reads the same store: one row per rank count of the configuration,
    # the 2-rank run's scaling and estimate as logged, and its buckets with both ranks' marks
    table = subprocess.run([sys.executable, str(Path(__file__).resolve().parent.parent / "benchmarks" / "dp_table.py"),
                            "--uri", uri, "--buckets"], capture_output=True, text=True, timeout=300)
    assert table.returncode == 0, table.stderr[-2000:]
    rows = {r[2].strip(): r for r in (line.split("|") for line in table.stdout.splitlines())
            if len(r) > 12 and r[2].strip() in ("1", "2")}
    assert set(rows) == {"1", "2"} and rows["1"][4].strip() == "1.000x"
    m2 = two.data.metrics
    assert rows["2"][4].strip() == f"{m2['throughput_samples_s'] / by_world['1'].data.metrics['throughput_samples_s']:.3f}x"
    assert float(rows["2"][8]) == pytest.approx(m2["backward_estimate_error_pct"], abs=0.05)
    assert float(rows["2"][12]) == pytest.approx(m2["step_time_mean_ms"], abs=0.005)
    assert ", 2 GPUs: forward ms by rank [" in table.stdout
    buckets = json.loads(Path(client.download_artifacts(two_id, "layer_timing/layer_timing.json",
                                                         str(tmp_path / "b"))).read_text())["buckets"]
    header = table.stdout.index("| bucket | layers |")
    bucket_rows = [line.split("|") for line in table.stdout[header:].splitlines()[2:] if line.startswith("| ")]
    assert [r[2].strip() for r in bucket_rows] == [" ".join(b["layers"]) for b in buckets]
    assert all(len(r[5].split(" / ")) == 2 for r in bucket_rows)  # both ranks' ready marks
