"""What MLflow's own UI shows of a sweep (issue 44, item 7): one param per config group choice (the
compare view's axes are what the sweep varies), the answer and the report's path as the parent
run's description, and a CSV dataset named by its data (`imdb (csv)`), not by its loader.

One real sweep of the tiny model on the CPU, on a SQLite store and real CSV rows in tmp_path,
shared by the tests (module fixture)."""
from __future__ import annotations

import csv
import gzip
import io
import os
import sys
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from bertaccel.config import GROUPS
from bertaccel.record.run_record import run_label
from bertaccel.record.tracking import flatten, search_runs
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

# Every test here starts a real process (the CLI, a script, a server) or trains: slow (docs/contributing.md).
pytestmark = pytest.mark.slow

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
TINY = ["model=tiny", "train.device=cpu", "dataset.train_subset=64", "dataset.test_subset=32", "train.batch_size=16"]
SHARED_IMDB = Path(__file__).resolve().parents[2] / "shared" / "data" / "imdb"
SAMPLES = Path(__file__).resolve().parents[1] / "bertaccel" / "samples" / "ag_news"
# The group settings this sweep sets on the command line to other values than its options' own
# (TINY's, the CSV's, the lr): params of their own beside the group choices.
GIVEN = {"dataset.train_subset", "dataset.test_subset", "dataset.train_path", "dataset.test_path",
         "dataset.max_length", "optimizer.lr"}


def _few_rows(src: Path, dst: Path, per_label: int) -> None:
    """per_label rows of each label of a real CSV (the IMDb files list all negatives first),
    written gzip-compressed like the original."""
    with gzip.open(src, "rt", encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        header, kept, seen = reader.fieldnames, [], {}
        for row in reader:
            if seen.get(row["label"], 0) < per_label:
                seen[row["label"]] = seen.get(row["label"], 0) + 1
                kept.append(row)
    out = io.StringIO()
    writer = csv.DictWriter(out, header)
    writer.writeheader()
    writer.writerows(kept)
    dst.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(dst, "wt", encoding="utf-8", newline="") as f:
        f.write(out.getvalue())


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """`attention=eager,sdpa` on a few IMDb rows (the bundled AG News sample where the shared IMDb
    copy is not on this machine) read with dataset=csv from a folder named for the data. (Options
    every CPU runs: bf16 is skipped on a CPU without native bf16, and the tests then saw one run.)"""
    tmp = tmp_path_factory.mktemp("view")
    # (dataset=csv reads the column `text` unless told: the AG News sample has two others)
    name, src, text = ("imdb", SHARED_IMDB, []) if (SHARED_IMDB / "train.csv.gz").is_file() else \
        ("ag_news", SAMPLES, ["dataset.text_columns=[title,description]"])
    for split, n in (("train", 32), ("test", 16)):
        _few_rows(src / f"{split}.csv.gz", tmp / "data" / name / f"{split}.csv.gz", n)
    store = f"sqlite:///{tmp / 'mlflow.db'}"
    cmd = [sys.executable, "-m", "bertaccel.run", "-m", "attention=eager,sdpa", "encoder=hf", *TINY,
           "dataset=csv", f"dataset.train_path=data/{name}/train.csv.gz", f"dataset.test_path=data/{name}/test.csv.gz",
           *text, "dataset.max_length=64", "optimizer.lr=2e-4", "sweep.baseline=false",  # (no added lr baseline)
           f"tracking.uri={store}", f"cache_dir={tmp / 'cache'}"]
    proc = warm_cli.run(cmd, cwd=tmp, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = search_runs(store, "bertaccel")
    children = [r for r in runs if r.data.tags.get("bertaccel.role") != "sweep"]
    (parent,) = [r for r in runs if r.data.tags.get("bertaccel.role") == "sweep"]
    return {"store": store, "dir": tmp, "data": name, "children": children, "parent": parent,
            "given": GIVEN | ({"dataset.text_columns"} if text else set())}


def test_each_group_choice_is_one_param_and_the_swept_one_differs(sweep):
    children = sweep["children"]
    assert len(children) == 2 and {r.data.tags["status"] for r in children} == {"finished"}
    for run in children:
        params = run.data.params
        # One param per group: its choice. No `encoder.name` or `encoder.layer` beside `encoder`.
        assert set(GROUPS) <= set(params)
        group_fields = {k for k in params if "." in k and k.split(".", 1)[0] in GROUPS}
        assert group_fields == sweep["given"], group_fields ^ sweep["given"]
        assert params["optimizer.lr"] == "0.0002"  # set on the command line: a param, an axis of its own
    assert sorted(r.data.params["attention"] for r in children) == ["eager", "sdpa"]  # the swept axis


def test_the_settings_a_choice_restates_are_still_recorded(sweep):
    from bertaccel.record.run_record import run_settings

    client = MlflowClient(tracking_uri=sweep["store"])
    for run in sweep["children"]:
        settings = run_settings(run)  # params and the tags config.* of what the choices restate
        assert run.data.tags["config.encoder.layer"] == settings["encoder.layer"] == "hf"
        assert settings["precision.name"] == run.data.params["precision"]
        # config.yaml has the whole configuration; run_settings gives every setting of it.
        config = yaml.safe_load(open(client.download_artifacts(run.info.run_id, "config.yaml", str(sweep["dir"]))))
        flat = flatten(config)
        assert {k: settings.get(k) for k in flat} == flat


def test_the_parent_run_describes_the_answer_and_where_the_report_is(sweep):
    client = MlflowClient(tracking_uri=sweep["store"])
    parent = sweep["parent"]
    md = Path(client.download_artifacts(parent.info.run_id, "report/report.md", str(sweep["dir"]))).read_text()
    headline = next(line for line in md.splitlines() if line.startswith("**")).split("**")[1]  # the answer's
    about = parent.data.tags["mlflow.note.content"]
    assert about.startswith(headline)  # the same headline, then the answer's lines (headline.answer_text)
    lines = [line for line in about.splitlines() if line.startswith("- ") and " best: " in line]
    assert lines and all(line.split(" best: ")[1] in md for line in lines), about
    assert "`report/report.html`" in about
    local = about.rsplit("(", 1)[1].split(")", 1)[0]
    html = Path(client.download_artifacts(parent.info.run_id, "report/report.html", str(sweep["dir"]))).read_text()
    assert local.endswith("report/report.html") and Path(local).read_text() == html  # the file itself


def test_a_csv_dataset_is_named_by_its_data(sweep):
    name = f"{sweep['data']} (csv)"
    client = MlflowClient(tracking_uri=sweep["store"])
    for run in sweep["children"]:
        inputs = client.get_run(run.info.run_id).inputs.dataset_inputs
        assert sorted(i.dataset.name for i in inputs) == [name, name]  # the MLflow UI's Dataset column
    from bertaccel.report.data import rows_from_mlflow

    assert {row.dataset for row in rows_from_mlflow(sweep["store"], "bertaccel")} == {name}  # the report's
    # A run's name as Hydra's overrides make it (run.py job_info): the data, not the loader and paths.
    given = ["dataset=csv", f"dataset.train_path=data/{sweep['data']}/train.csv.gz",
             f"dataset.test_path=data/{sweep['data']}/test.csv.gz", "precision=bf16"]
    assert run_label(given) == f"dataset={name},precision=bf16"
    assert run_label(given, {"dataset.train_path"}) == f"dataset={name}"
