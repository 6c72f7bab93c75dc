"""Issue 62, item 4: a sweep whose other configurations are all skipped here trains no baseline
(runs/untrained_baseline.py): the plan knows it before any run, says why in one line, and the
baseline is recorded skipped with that reason; with one configuration that runs, the baseline trains
as before, also after an untrained record of it (record/sweep.py UNTRAINED_TAG). Real CLI
sweeps into real SQLite stores on the CPU; the report's own command on the store."""
from __future__ import annotations

import os
import sys

import pytest
import torch
from conftest import TINY

from bertaccel.record.sweep import UNTRAINED_TAG, previous_outcome
from bertaccel.record.tracking import runs_by_status, search_runs
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

CARD_SWEEP = ["-m", "precision=fp16,fp32", "attention=xformers,triton"]  # README's "A sweep on a GPU"
UNTRAINED_LINE = ("baseline not trained: every other configuration (4) of this sweep is skipped on this machine "
                  "(no GPU), so there is nothing to compare it with")
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="the design card's sweep is all skipped only off a GPU")


def _cli(args, d, **kw):
    """`python -m bertaccel.run ARGS` in d, its own store and cache, as a user's CPU shell has it:
    without the TRITON_INTERPRET=1 the test session sets (conftest), which makes Triton run here."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    cmd = [sys.executable, "-m", "bertaccel.run", *args, f"tracking.uri=sqlite:///{d / 'mlflow.db'}",
           f"cache_dir={d / 'cache'}"]
    return warm_cli.run(cmd, cwd=d, capture_output=True, text=True, timeout=600, env=env, **kw)


def _store(d):
    return f"sqlite:///{d / 'mlflow.db'}"


def _trained_anything(uri):
    """Whether any run of the store has a training metric (a training step was taken)."""
    return [r.info.run_name for r in search_runs(uri, "bertaccel") if "train_loss" in r.data.metrics]


@pytest.mark.slow
@cpu_only
def test_the_card_sweep_on_a_cpu_records_four_skips_and_trains_no_baseline(tmp_path):
    proc = _cli(CARD_SWEEP, tmp_path)
    out = proc.stdout
    # None of the requested configurations ran: exit 1, as documented (README, run.py), and the
    # added baseline says in its one line why it did not train either.
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Traceback" not in out
    said = [line for line in out.splitlines() if line.startswith("[sweep] baseline not trained")]
    assert said == [f"[sweep] {UNTRAINED_LINE} (it trains when one of them can run)"], out[-3000:]
    assert "[sweep] run 5 of 5 skipped (defaults)" in out
    assert "5 runs: finished=0 skipped=5 failed=0" in out
    summary = out.split("== sweep summary ==")[1]
    assert f"4  defaults                           skipped  -              -             {UNTRAINED_LINE}" in summary

    uri = _store(tmp_path)
    runs = runs_by_status(uri, "bertaccel")
    assert set(runs) == {"skipped"} and len(runs["skipped"]) == 5
    by_name = {r.info.run_name: r for r in runs["skipped"]}
    baseline = by_name.pop("defaults")
    assert baseline.data.tags["reason"].startswith(UNTRAINED_LINE) and baseline.data.tags[UNTRAINED_TAG] == "true"
    # The four requested ones: skipped for this machine's own reasons, by their runs as before.
    assert len(by_name) == 4 and all(UNTRAINED_TAG not in r.data.tags for r in by_name.values())
    assert all("GPU" in r.data.tags["reason"] or "xformers" in r.data.tags["reason"] for r in by_name.values())
    assert _trained_anything(uri) == []

    # The report of that store: one line, nothing to rank, no traceback.
    rep = warm_cli.run([sys.executable, "-m", "bertaccel.report", "--uri", uri, "--out", str(tmp_path / "rep")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    lines = [line for line in rep.stderr.splitlines() if line.strip()]
    assert rep.returncode == 2 and len(lines) == 1, rep.stderr
    assert lines[0].startswith("error: no finished runs in experiment bertaccel") and "5 skipped" in lines[0]


@pytest.mark.slow
def test_a_resumed_all_skipped_sweep_keeps_one_record_and_a_runnable_one_trains_the_baseline(tmp_path):
    # All skipped on the CPU (fp16): the tiny baseline is not trained, twice, and recorded once.
    skipped = ["-m", "precision=fp16", "attention=eager,sdpa", *TINY]
    for _ in range(2):
        proc = _cli(skipped, tmp_path)
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert ("[sweep] baseline not trained: every other configuration (2) of this sweep is skipped on this "
                "machine (no GPU)") in proc.stdout, proc.stdout[-3000:]
        assert "[sweep] run 3 of 3 skipped (defaults)" in proc.stdout
    runs = runs_by_status(_store(tmp_path), "bertaccel")
    assert set(runs) == {"skipped"} and len(runs["skipped"]) == 3, {k: len(v) for k, v in runs.items()}
    assert _trained_anything(_store(tmp_path)) == []

    # One configuration that runs here (fp32 + sdpa) among skipped ones: the baseline trains, as
    # before this change, although the store has it recorded untrained (not "skipped before").
    proc = _cli(["-m", "precision=fp16,fp32", "attention=sdpa", *TINY, "train.max_steps_per_epoch=2"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "baseline not trained" not in proc.stdout
    assert "[sweep] baseline added: the config groups' defaults" in proc.stdout
    assert "3 runs: finished=2 skipped=1 failed=0" in proc.stdout, proc.stdout[-3000:]
    finished = {r.info.run_name: r for r in runs_by_status(_store(tmp_path), "bertaccel")["finished"]}
    assert "train_loss" in finished["defaults"].data.metrics
    assert sorted(finished) == ["defaults", "precision=fp32,attention=sdpa"]


def test_an_untrained_baseline_is_not_taken_as_skipped_before(tmp_path):
    """previous_outcome (resume): a skip is this machine's verdict on a configuration and is not
    tried again; an untrained baseline's is not, so a later sweep runs it."""
    from mlflow.tracking import MlflowClient

    uri = _store(tmp_path)
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("bertaccel")
    for config, extra in (("aaa", {}), ("bbb", {UNTRAINED_TAG: "true"})):
        run = client.create_run(exp, tags={"config_hash": config, "status": "skipped", "reason": "why", **extra})
        client.set_terminated(run.info.run_id, "FINISHED")
    machine = previous_outcome(uri, "bertaccel", ["aaa"], retry_failed=False)
    assert machine is not None and machine.status == "not_retried"
    assert previous_outcome(uri, "bertaccel", ["bbb"], retry_failed=False) is None


@pytest.mark.slow
@cpu_only
def test_the_card_sweep_resumed_on_a_gpus_store_is_compared_as_before(tmp_path):
    """On a CPU, in a folder holding the H200's store of the same sweep (the README's figure): its
    four configurations are already finished there, so the baseline has them to be compared with:
    no untrained line, and it is found finished too."""
    import gzip
    import shutil
    from pathlib import Path

    with gzip.open(Path(__file__).parent / "data" / "h200_card_sweep.db.gz") as src, \
            open(tmp_path / "mlflow.db", "wb") as dst:
        shutil.copyfileobj(src, dst)
    proc = _cli(CARD_SWEEP, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "baseline not trained" not in proc.stdout
    assert "[sweep] run 5 of 5 already_finished (defaults)" in proc.stdout, proc.stdout[-3000:]
    assert "5 runs: finished=0 skipped=0 failed=0 | resumed: already finished=5" in proc.stdout
