"""Issue 59, like compared with like and a name identifies one thing: a baseline per like-for-like
group (model, dataset, hardware, num_gpus) read by every surface of the report; a sweep's swept
plain setting (a learning rate) gets its default as the baseline too; no two runs of a sweep share
an MLflow name or a report label, and a --baseline that names two configurations, or a run that
did not finish, is refused in one line; a report of a sweep still running says so. Real MLflow
stores (report_store.py), the report's own command, one real tiny sweep."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import TINY
from report_store import Store

from bertaccel.options.baseline import default_choices
from bertaccel.record.sweep import process_tags
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

# Every test here starts a real process (the report's CLI, a sweep): slow (docs/contributing.md).
pytestmark = pytest.mark.slow
DEFAULTS = default_choices()


def _report(args, cwd):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return warm_cli.run([sys.executable, "-m", "bertaccel.report", *args], cwd=cwd, capture_output=True,
                        text=True, env=env, timeout=300)


def _answer(md: str) -> str:
    return md.split("\n## ")[1]


def _run(store, name, choices, time_s, accuracy=0.8, model="tiny", tags=None, params=None):
    """A finished run as job.py logs one: a param per config group, its settings."""
    return store.log(name, {**DEFAULTS, **choices, "model": model, "dataset": "ag_news_sample", "hardware": "cpu",
                            "accumulation": "1", "num_gpus": "1", "train.batch_size": "32", **(params or {})},
                     {"train_time_s": time_s, "cost_usd": time_s / 100, "test_accuracy": accuracy},
                     {"hardware_profile": "cpu", **(tags or {})})


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    """A sweep over model=tiny,minilm_l6 x precision=fp32,bf16 as the store holds it: MiniLM's
    fp32 run (the slowest) and tiny's bf16 run (the fastest, 7.5x MiniLM's fp32) far apart; plus a
    third model, trained only in bf16, that has no baseline of its own."""
    d = tmp_path_factory.mktemp("two_models")
    store = Store(d)
    _run(store, "model=tiny,precision=fp32", {}, 10.0)
    _run(store, "model=tiny,precision=bf16", {"precision": "bf16"}, 8.0)
    _run(store, "model=minilm_l6,precision=fp32", {}, 60.0, model="minilm_l6")
    _run(store, "model=minilm_l6,precision=bf16", {"precision": "bf16"}, 50.0, model="minilm_l6")
    _run(store, "model=bert_base,precision=bf16", {"precision": "bf16"}, 90.0, model="bert_base")
    return store, d


def test_each_model_is_compared_with_its_own_baseline_in_every_surface(two_models):
    store, d = two_models
    r = _report(["--uri", store.uri, "--out", "rep", "--accuracy-floor", "off"], d)
    assert r.returncode == 0, r.stderr
    md = (d / "rep" / "report.md").read_text()
    answer = _answer(md)
    # tiny's bf16 against tiny's fp32: 10 / 8 = 1.25x; never 60 / 8 = 7.50x against MiniLM's.
    assert "Adopt 'tiny / bf16', best under every strategy: 1.25x faster, -20.0 % cost, +0.00 pts accuracy against " \
           "its group's baseline 'tiny / fp32'" in answer, answer[:600]
    assert "7.50x" not in md
    assert "Baselines, one per like-for-like group (model, dataset, hardware, num_gpus" in answer
    assert "model=tiny: 'tiny / fp32', the run with the config groups' defaults" in answer
    assert "model=minilm_l6: 'minilm_l6 / fp32', the run with the config groups' defaults" in answer
    # A group without the defaults run: the answer says so (its slowest stands in, never another's).
    assert "model=bert_base: no baseline of its own (no run has the config groups' defaults)" in answer
    assert "WARNING, unlike runs ranked together: these runs are of 3 like-for-like groups" in answer
    # The table of every run against a baseline: each against its own group's.
    table = md.split("## Against its group's baseline")[1].split("\n## ")[0]
    rows = {c[0]: c for c in ([x.strip() for x in line.strip("|").split("|")] for line in table.splitlines()
                              if line.startswith("| ") and not line.startswith("| run"))}
    assert rows["minilm_l6 / bf16"][4:] == ["1.20x faster", "+0.00 pts", "minilm_l6 / fp32"]
    assert rows["tiny / bf16"][4:] == ["1.25x faster", "+0.00 pts", "tiny / fp32"]
    assert rows["bert_base / bf16"][4:] == ["as fast (1.00x)", "+0.00 pts", "bert_base / bf16"]
    # The effects table pairs runs of one model only and says that model is a context.
    assert "model: a context, not a technique" in md
    # --baseline picks the baseline of its own group only; the others keep theirs.
    r = _report(["--uri", store.uri, "--out", "given", "--accuracy-floor", "off",
                 "--baseline", "model=tiny,precision=bf16"], d)
    assert r.returncode == 0, r.stderr
    answer = _answer((d / "given" / "report.md").read_text())
    assert "model=tiny: 'tiny / bf16', given with --baseline" in answer
    assert "model=minilm_l6: 'minilm_l6 / fp32', the run with the config groups' defaults" in answer


def test_a_swept_learning_rate_is_compared_with_the_run_at_its_default(tmp_path):
    # optimizer.lr=1e-4 (the default, config/optimizer.py OptimizerConfig) and 2e-4, both on the groups'
    # defaults: the baseline is the 1e-4 run, not the slowest of the two.
    store = Store(tmp_path)
    _run(store, "optimizer.lr=0.0001", {}, 10.0, params={"optimizer.lr": "0.0001"})
    _run(store, "optimizer.lr=0.0002", {}, 12.0, params={"optimizer.lr": "0.0002"})
    r = _report(["--uri", store.uri, "--out", "rep"], tmp_path)
    assert r.returncode == 0, r.stderr
    answer = _answer((tmp_path / "rep" / "report.md").read_text())
    assert "Baseline: '0.0001', the run with the config groups' defaults" in answer, answer[:800]
    # Without a run at the default learning rate, the baseline says it has none.
    other = Store(tmp_path / "other")
    for lr, t in (("0.0002", 10.0), ("0.0003", 12.0)):
        _run(other, f"optimizer.lr={lr}", {}, t, params={"optimizer.lr": lr})
    r = _report(["--uri", other.uri, "--out", "rep2"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "no run has the default optimizer.lr=0.0001" in _answer((tmp_path / "rep2" / "report.md").read_text())


def test_the_sweep_plan_adds_a_baseline_for_a_swept_learning_rate_and_names_every_job_apart(tmp_path):
    """The sweep's own job list (plan/grid.py expand: Hydra composes it as `run -m` does; nothing trains)."""
    from bertaccel.plan.grid import expand

    uri = f"tracking.uri=sqlite:///{tmp_path / 'none.db'}"
    grid = expand("config", ["model=tiny", "optimizer.lr=2e-4,3e-4", uri])
    assert [c.name for c in grid.configs] == ["optimizer.lr=0.0002", "optimizer.lr=0.0003", "defaults"]
    assert not any("optimizer.lr" in o for o in grid.configs[2].overrides)
    # 1e-4 is the default learning rate: that job is the baseline, none is added.
    grid = expand("config", ["model=tiny", "optimizer.lr=1e-4,2e-4", uri])
    assert [c.name for c in grid.configs] == ["optimizer.lr=0.0001", "optimizer.lr=0.0002"]
    # A fixed precision=bf16 the added baselines take off names the runs too: four names, all apart.
    grid = expand("config", ["model=tiny", "dataset.subset_seed=0,1", "precision=bf16", uri])
    names = [c.name for c in grid.configs]
    assert names == ["dataset.subset_seed=0,precision=bf16", "dataset.subset_seed=1,precision=bf16",
                     "dataset.subset_seed=0", "dataset.subset_seed=1"]


def test_two_runs_of_one_name_are_labelled_apart_and_a_baseline_naming_both_is_refused(tmp_path):
    # A store an older version wrote: the added fp32 baselines took the bf16 runs' names.
    store = Store(tmp_path)
    ids = {}
    for precision, t in (("bf16", 8.0), ("fp32", 10.0)):
        ids[precision] = _run(store, "dataset.subset_seed=0", {"precision": precision}, t, tags={"sweep_id": "s1"},
                              params={"dataset.subset_seed": "0"})
    _run(store, "dataset.subset_seed=1", {"precision": "bf16"}, 8.5, tags={"sweep_id": "s1"},
         params={"dataset.subset_seed": "1"})
    r = _report(["--uri", store.uri, "--out", "rep"], tmp_path)
    assert r.returncode == 0, r.stderr
    answer = _answer((tmp_path / "rep" / "report.md").read_text())
    assert "Adopt '0 [precision=bf16]'" in answer and "'0 [precision=fp32]', the run with" in answer, answer[:800]
    assert "Adopt '0'" not in answer
    r = _report(["--uri", store.uri, "--out", "given", "--baseline", "dataset.subset_seed=0"], tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "--baseline 'dataset.subset_seed=0' names 2 runs of 2 configurations: give one by its run id" in lines[0]
    assert ids["bf16"] in lines[0] and ids["fp32"] in lines[0]
    assert not (tmp_path / "given").exists()
    # By its run id: taken.
    r = _report(["--uri", store.uri, "--out", "given", "--baseline", ids["bf16"]], tmp_path)
    assert r.returncode == 0, r.stderr


def _running_sweep(tmp_path):
    """A sweep's store as it is mid-sweep: its parent run open, its process (this test) alive, two
    of four configurations finished and one failed."""
    store = Store(tmp_path)
    c = store.client
    parent = c.create_run(store.exp, run_name="precision=fp32,bf16,fp16",
                          tags={"bertaccel.role": "sweep", "sweep_id": "s1", "status": "running",
                                "sweep_processes": "{host}:{pid}:{pid_started_at}".format(**process_tags())})
    c.log_param(parent.info.run_id, "sweep_configurations", "4")
    _run(store, "precision=fp32", {}, 10.0, tags={"sweep_id": "s1"})
    _run(store, "precision=bf16", {"precision": "bf16"}, 8.0, tags={"sweep_id": "s1"})
    failed = c.create_run(store.exp, run_name="precision=fp16", tags={
        "status": "failed", "sweep_id": "s1", "reason": "bad input: fp16 needs a GPU"})
    c.set_terminated(failed.info.run_id, "FAILED")
    return store, parent.info.run_id, failed.info.run_id


def test_a_baseline_naming_a_failed_run_is_refused_with_its_reason(tmp_path):
    store, _, failed = _running_sweep(tmp_path)
    r = _report(["--uri", store.uri, "--sweep", "s1", "--out", "rep", "--baseline", "precision=fp16"], tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert (f"--baseline 'precision=fp16' names a failed run, {failed} (bad input: fp16 needs a GPU): "
            "only a finished run can be a baseline") in lines[0]
    assert not (tmp_path / "rep").exists()


def test_a_report_of_a_sweep_still_running_says_so(tmp_path):
    store, parent, _ = _running_sweep(tmp_path)
    r = _report(["--uri", store.uri, "--sweep", "s1", "--out", "rep"], tmp_path)
    assert r.returncode == 0, r.stderr
    said = "WARNING, this sweep is still running: 2 of 4 runs finished; the answer may change"
    assert said in _answer((tmp_path / "rep" / "report.md").read_text()) and said in r.stdout
    # Its process gone (a sweep killed with -9): nothing is still running, nothing said.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    store.client.set_tag(parent, "sweep_processes", f"{process_tags()['host']}:{dead.stdout.strip()}:1.0")
    r = _report(["--uri", store.uri, "--sweep", "s1", "--out", "rep2"], tmp_path)
    assert r.returncode == 0 and "still running" not in r.stdout, r.stdout
    assert "still running" not in (tmp_path / "rep2" / "report.md").read_text()


def test_a_real_sweep_names_its_added_baselines_apart_and_adds_one_for_a_learning_rate(tmp_path):
    """`run -m dataset.subset_seed=0,1 optimizer.lr=2e-4`: no job has the default learning rate, so
    each subset gets its baseline (the issue's sweep added none), named apart from its lr run."""
    quick = [o for o in TINY if not o.startswith(("train.batch_size", "dataset.test_subset"))] + [
        "train.max_steps_per_epoch=2", "dataset.test_subset=32"]
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cmd = [sys.executable, "-m", "bertaccel.run", "-m", "dataset.subset_seed=0,1", "optimizer.lr=2e-4", *quick,
           f"tracking.uri={store}", f"cache_dir={tmp_path / 'cache'}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = warm_cli.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[sweep] 4 runs;" in proc.stdout and "optimizer.lr=0.0001 on model=tiny" in proc.stdout, proc.stdout
    from mlflow import MlflowClient

    from bertaccel.record.tracking import runs_by_status

    names = sorted(r.info.run_name for r in runs_by_status(store, "bertaccel")["finished"])
    assert names == ["dataset.subset_seed=0", "dataset.subset_seed=0,optimizer.lr=0.0002",
                     "dataset.subset_seed=1", "dataset.subset_seed=1,optimizer.lr=0.0002"]
    assert MlflowClient(tracking_uri=store).get_experiment_by_name("bertaccel") is not None
    r = _report(["--uri", store, "--out", "rep"], tmp_path)
    assert r.returncode == 0, r.stderr
    answer = _answer((tmp_path / "rep" / "report.md").read_text())
    # Each subset's lr run against its own subset's defaults run, labelled apart.
    assert "dataset.subset_seed=0: '0 / 0.0001', the run with the config groups' defaults" in answer, answer[:1500]
    assert "dataset.subset_seed=1: '1 / 0.0001', the run with the config groups' defaults" in answer
    r = _report(["--uri", store, "--out", "given", "--baseline", "dataset.subset_seed=0"], tmp_path)
    assert r.returncode == 0, r.stderr
