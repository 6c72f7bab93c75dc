"""What the MLflow UI shows of bertaccel's runs, part by part, on real temp stores: the experiment
marked model training, a sweep's parent named by its axes, each run's dataset splits as MLflow
inputs, the sweep's report on its parent run (or the reason it has none). The UI itself, read in a
browser, is tests/test_mlflow_ui_browser.py."""
from __future__ import annotations

from pathlib import Path

import pytest
from mlflow import MlflowClient
from omegaconf import OmegaConf
from report_store import Store

from bertaccel.report import sweep_report
from bertaccel.config import DatasetConfig
from bertaccel.data import RawData, RawSplit, load_raw, split_fingerprint
from bertaccel.record.datasets import DIGEST_CHARS, dataset_inputs
from bertaccel.runs.progress import sweep_axes
from bertaccel.context import SweepContext
from bertaccel.record.sweep import open_parent, set_sweep
from bertaccel.record.tracking import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, RunTracker, experiment_id, ui_address
from bertaccel.report.sweep_report import REASON_TAG, REPORT_TAG, SweepReport, attach_report

CONF = Path(__file__).resolve().parents[1] / "bertaccel" / "conf"


def _store(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


# --- 1. the experiment is model training --------------------------------------------------------

def test_a_new_experiment_is_marked_model_training(tmp_path):
    uri = _store(tmp_path)
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment(experiment_id(client, uri, "bertaccel"))
    assert exp.tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND == "custom_model_development"


@pytest.mark.parametrize("before,after", [(None, EXPERIMENT_KIND),  # an older version's experiment
                                          ("genai_development_inferred", EXPERIMENT_KIND),  # a UI's guess
                                          ("no_inferred_type", EXPERIMENT_KIND),
                                          ("finetuning", "finetuning")])  # someone's choice stays
def test_an_existing_experiment_gets_the_kind_unless_one_was_chosen(tmp_path, before, after):
    uri = _store(tmp_path)
    client = MlflowClient(tracking_uri=uri)
    exp_id = client.create_experiment("bertaccel", tags={EXPERIMENT_KIND_TAG: before} if before else None)
    assert experiment_id(client, uri, "bertaccel") == exp_id
    assert client.get_experiment(exp_id).tags.get(EXPERIMENT_KIND_TAG) == after


def test_the_ui_address_opens_the_runs_view():
    assert ui_address("http://127.0.0.1:5001/", "3") == \
        "http://127.0.0.1:5001/#/experiments/3/runs?workflowType=machine_learning"
    local = ui_address("sqlite:///mlflow.db", "1")
    assert local.startswith("http://127.0.0.1:5000/#/experiments/1/runs?workflowType=machine_learning")
    assert "mlflow ui --backend-store-uri sqlite:///mlflow.db" in local


# --- 2. a sweep's parent run is named by its axes ----------------------------------------------

def test_parent_name_lists_the_swept_axes_in_command_line_order():
    overrides = ["precision=fp16,fp32", "train.epochs=2", "attention=xformers,triton"]
    assert sweep_axes(overrides) == "precision=fp16,fp32 x attention=xformers,triton"


def test_parent_name_of_sweeps_hydra_cannot_list_and_of_none():
    assert sweep_axes(["optimizer.lr=interval(1e-5,1e-3)", "train.seed=range(0,3)"]) == \
        "optimizer.lr=interval(1e-5,1e-3) x train.seed=0,1,2"
    assert sweep_axes(["precision=fp16"]) == ""


def test_a_reopened_parent_takes_the_axes_name_and_keeps_its_sweep_id(tmp_path):
    uri = _store(tmp_path)
    client = MlflowClient(tracking_uri=uri)
    old = open_parent(uri, "bertaccel", "config-abc", ["precision=fp16,fp32"], 2)  # as an older version named it
    assert client.get_run(old).info.run_name == "sweep config-abc"
    client.set_terminated(old)
    again = open_parent(uri, "bertaccel", "config-abc", ["precision=fp16,fp32"], 2, name="precision=fp16,fp32")
    run = client.get_run(again)
    assert again == old  # one parent for the same sweep
    assert (run.info.run_name, run.data.tags["sweep_id"]) == ("precision=fp16,fp32", "config-abc")


# --- 3. each run's dataset splits are MLflow inputs ---------------------------------------------

def _dataset_cfg(name: str, **over):
    """The dataset section as a run has it: the option's file through its schema, typed."""
    from bertaccel.config import DatasetConfig

    cfg = OmegaConf.merge(OmegaConf.structured(DatasetConfig), OmegaConf.load(CONF / "dataset" / f"{name}.yaml"))
    cfg.subset_seed = 0
    for k, v in over.items():
        cfg[k] = v
    return OmegaConf.to_object(cfg)


def test_dataset_inputs_carry_the_content_digest_rows_source_and_split(tmp_path):
    cfg = _dataset_cfg("ag_news_sample", train_subset=128, test_subset=64)
    raw = load_raw(cfg)
    uri = _store(tmp_path)
    tracker = RunTracker(uri, "bertaccel", "r", {}, {}, "x: 1\n")
    tracker.log_inputs(dataset_inputs(cfg, raw))
    logged = MlflowClient(tracking_uri=uri).get_run(tracker.run_id).inputs.dataset_inputs
    by_split = {i.tags[0].value: i for i in logged}
    assert set(by_split) == {"train", "test"} and {i.tags[0].key for i in logged} == {"mlflow.data.context"}
    for split, rows in (("train", 128), ("test", 64)):
        ds = by_split[split].dataset
        assert ds.name == "ag_news_sample"
        assert ds.digest == split_fingerprint(getattr(raw, split))[:DIGEST_CHARS]
        assert ds.profile == f'{{"num_rows": {rows}}}'
        assert ds.source_type == "local" and ds.source.endswith(f'ag_news/{split}.csv.gz"}}')
    assert by_split["train"].dataset.digest != by_split["test"].dataset.digest


def test_other_rows_give_another_digest_and_a_hub_dataset_names_its_hub_id():
    cfg = _dataset_cfg("ag_news")
    raw = RawData(RawSplit(["a b", "c"], [0, 1]), RawSplit(["d"], [1]), ["x", "y"])
    other = RawData(RawSplit(["a b", "c!"], [0, 1]), RawSplit(["d"], [1]), ["x", "y"])
    first, second = dataset_inputs(cfg, raw), dataset_inputs(cfg, other)
    assert first[0].dataset.source_type == "hugging_face" and '"path": "fancyzhx/ag_news"' in first[0].dataset.source
    assert '"split": "train"' in first[0].dataset.source and '"split": "test"' in first[1].dataset.source
    assert first[0].dataset.digest != second[0].dataset.digest  # one character of one row
    assert first[1].dataset.digest == second[1].dataset.digest  # the same test rows


# --- 4. the sweep's report on its parent run ---------------------------------------------------

METRICS = {"train_time_s": 10.0, "cost_usd": 0.01, "energy_kwh": 0.001, "occupancy_pct": 40.0, "test_accuracy": 0.9}


def _sweep(tmp_path, statuses) -> SweepContext:
    store = Store(tmp_path)
    parent = store.client.create_run(store.exp, run_name="precision=fp16,fp32",
                                     tags={"bertaccel.role": "sweep", "sweep_id": "sw1"}).info.run_id
    for i, status in enumerate(statuses):
        store.log(f"r{i}", {"precision": "fp32"}, {**METRICS, "train_time_s": 10.0 + i},
                  {"sweep_id": "sw1", "status": status, "mlflow.parentRunId": parent})
    store.log("other sweep", {"precision": "fp32"}, METRICS, {"sweep_id": "sw2"})  # not this sweep's
    return SweepContext("sw1", parent, ["precision"], store.uri)


def _artifacts(ctx: SweepContext, path: str = "") -> set:
    return {a.path for a in MlflowClient(tracking_uri=ctx.uri).list_artifacts(ctx.parent_run_id, path)}


@pytest.mark.slow
def test_the_report_of_the_sweeps_finished_runs_is_attached_to_its_parent(tmp_path):
    ctx = _sweep(tmp_path, ["finished", "finished", "failed"])
    said = attach_report(ctx, "bertaccel")
    assert said == "report of 2 finished runs attached to the parent run (report/report.html)"
    assert _artifacts(ctx, "report") >= {"report/report.html", "report/report.md"}
    html = (Path(MlflowClient(tracking_uri=ctx.uri).download_artifacts(ctx.parent_run_id, "report/report.html"))
            .read_text())
    assert "r0" in html and "r1" in html and "other sweep" not in html  # this sweep's finished runs only
    tags = MlflowClient(tracking_uri=ctx.uri).get_run(ctx.parent_run_id).data.tags
    assert tags[REPORT_TAG] == "report/report.html" and REASON_TAG not in tags


def test_a_sweep_without_finished_runs_attaches_nothing_and_says_why(tmp_path):
    ctx = _sweep(tmp_path, ["failed", "skipped"])
    assert attach_report(ctx, "bertaccel") == "no report: the sweep has no finished runs"
    tags = MlflowClient(tracking_uri=ctx.uri).get_run(ctx.parent_run_id).data.tags
    assert tags[REASON_TAG] == "no report: the sweep has no finished runs" and REPORT_TAG not in tags
    assert _artifacts(ctx) == set()


def test_a_report_that_cannot_be_built_is_a_reason_tag(tmp_path, monkeypatch):
    ctx = _sweep(tmp_path, ["finished"])
    monkeypatch.setattr(sweep_report, "build_report", lambda *a: "--weights x: not a number")
    assert attach_report(ctx, "bertaccel") == "no report: it could not be built (--weights x: not a number)"
    assert MlflowClient(tracking_uri=ctx.uri).get_run(ctx.parent_run_id).data.tags[REASON_TAG] == \
        "no report: it could not be built (--weights x: not a number)"
    assert _artifacts(ctx) == set()


def test_the_callback_never_fails_the_sweep(tmp_path, monkeypatch, capsys):
    ctx = _sweep(tmp_path, ["finished"])

    def broken(*args):
        raise RuntimeError("disk full\nmore")

    monkeypatch.setattr(sweep_report, "build_report", broken)
    callback = SweepReport()
    callback.context, callback.experiment = ctx, "bertaccel"
    callback.on_multirun_end(config=None)  # no exception
    why = "no report: attaching it failed (RuntimeError: disk full)"
    assert MlflowClient(tracking_uri=ctx.uri).get_run(ctx.parent_run_id).data.tags[REASON_TAG] == why
    assert f"[sweep] {why}" in capsys.readouterr().out


@pytest.mark.slow
def test_a_later_report_clears_an_earlier_reason(tmp_path):
    ctx = _sweep(tmp_path, ["finished"])
    MlflowClient(tracking_uri=ctx.uri).set_tag(ctx.parent_run_id, REASON_TAG, "no report: the sweep has no finished runs")
    attach_report(ctx, "bertaccel")
    assert REASON_TAG not in MlflowClient(tracking_uri=ctx.uri).get_run(ctx.parent_run_id).data.tags


def test_the_report_callback_comes_after_the_sweeps_frame_and_takes_its_context():
    """Hydra starts callbacks in order and ends them in reverse: listed after sweep_progress, the
    report's callback finds the parent run opened and attaches before the parent is closed."""
    callbacks = OmegaConf.load(CONF / "config.yaml").hydra.callbacks
    assert list(callbacks) == ["sweep_progress", "sweep_report"]
    assert callbacks.sweep_report._target_ == "bertaccel.report.sweep_report.SweepReport"
    ctx = SweepContext("sw1", "parent-id", ["precision"], "sqlite:///x.db")
    set_sweep(ctx)
    try:
        callback = SweepReport()
        callback.on_multirun_start(OmegaConf.create({"tracking": {"experiment": "mine"}}))
    finally:
        set_sweep(None)
    assert (callback.context, callback.experiment) == (ctx, "mine")
