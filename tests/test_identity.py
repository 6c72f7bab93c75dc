"""A run's identity is what determines its result (issue 42): the data it reads counts, the
launcher's and watchdog's settings do not, runs an older version recorded stay resumable, and a
sweep's report covers every configuration of the sweep, resumed ones included.

Real sweeps of the tiny model in subprocesses, real SQLite stores and real CSV files."""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf
import pytest

from bertaccel.data import load_raw
from bertaccel.report import load_rows
from bertaccel.record.tracking import IDENTITY_VERSION_TAG, legacy_config_hash, search_runs
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

# Every test here starts a real process (the CLI, a script, a server) or trains: slow (docs/contributing.md).
pytestmark = pytest.mark.slow

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
TINY = ["model=tiny", "train.device=cpu", "dataset.train_subset=64", "dataset.test_subset=32", "train.batch_size=16",
        "train.max_steps_per_epoch=2"]


def _sweep(tmp_path: Path, args):
    cmd = [sys.executable, "-m", "bertaccel.run", "-m", *args, f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
           f"cache_dir={tmp_path / 'cache'}"]
    done = warm_cli.run(cmd, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _runs(tmp_path: Path):
    return [r for r in search_runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "bertaccel")
            if r.data.tags.get("bertaccel.role") != "sweep"]


def _parent(tmp_path: Path, sweep_out: str):
    sweep_id = next(line.split("sweep id ")[1].split()[0] for line in sweep_out.splitlines() if "sweep id " in line)
    (parent,) = [r for r in search_runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "bertaccel")
                 if r.data.tags.get("bertaccel.role") == "sweep" and r.data.tags["sweep_id"] == sweep_id]
    return parent


def _write_csv(path: Path, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        w.writerows(rows)


def test_a_csv_whose_rows_changed_under_the_same_name_trains_again_and_is_not_a_repeat_of_the_old(tmp_path):
    train, test = tmp_path / "train.csv", tmp_path / "test.csv"
    # 80 train rows, of which dataset.train_subset=64 are read: what the run saw is the subset.
    old_rows = [(f"old text number {i} about topic {i % 2}", i % 2) for i in range(80)]
    _write_csv(train, old_rows)
    _write_csv(test, [(f"test text {i} topic {i % 2}", i % 2) for i in range(40)])
    args = ["train.seed=1", *TINY, "dataset=csv", f"dataset.train_path={train}", f"dataset.test_path={test}"]
    _sweep(tmp_path, args)

    # A row the subset leaves out changes: the run would read the same rows, so it is resumed.
    ds = OmegaConf.create({"source": "csv", "train_path": str(train), "test_path": str(test), "text_columns": ["text"],
                           "label_column": "label", "train_subset": 64, "test_subset": 32, "subset_seed": 0})
    seen = set(load_raw(ds).train.texts)
    unseen = next(i for i, (text, _) in enumerate(old_rows) if text not in seen)
    _write_csv(train, [(t + " edited", y) if i == unseen else (t, y) for i, (t, y) in enumerate(old_rows)])
    same = _sweep(tmp_path, args)
    assert "already finished=1" in same.stdout and len(_runs(tmp_path)) == 1, same.stdout[-2000:]

    # Every row replaced under the same file name: a run on other data, trained again.
    _write_csv(train, [(f"new words {i} on subject {i % 2}", i % 2) for i in range(80)])
    changed = _sweep(tmp_path, args)
    assert "finished=1 " in changed.stdout and "already finished" not in changed.stdout, changed.stdout[-2000:]
    runs = _runs(tmp_path)
    assert [r.data.tags["status"] for r in runs] == ["finished", "finished"]
    digests = [{d.dataset.digest for d in r.inputs.dataset_inputs} for r in runs]
    assert digests[0] != digests[1]
    # The sweep's report (and the whole store's) keeps the two apart: not two repeats of one configuration.
    rows = load_rows(f"sqlite:///{tmp_path / 'mlflow.db'}", "bertaccel", _parent(tmp_path, changed.stdout)
                     .data.tags["sweep_id"])
    assert len(rows) == 2 and rows[0].group != rows[1].group


def test_a_sweep_that_resumed_configurations_reports_all_of_them_and_launcher_settings_and_the_legacy_hash_resume(
        tmp_path, compose_cfg):
    # One resumed configuration beside one new one is the case (not two resumed): one run fewer.
    _sweep(tmp_path, ["train.seed=1", *TINY])
    more = _sweep(tmp_path, ["train.seed=1,2", *TINY])
    assert "finished=1 " in more.stdout and "already finished=1" in more.stdout, more.stdout[-2000:]
    parent = _parent(tmp_path, more.stdout)
    assert parent.data.tags["status"] == "finished (2 of 2 runs finished)"
    rows = load_rows(f"sqlite:///{tmp_path / 'mlflow.db'}", "bertaccel", parent.data.tags["sweep_id"])
    assert sorted(r.seed for r in rows) == ["1", "2"]
    # The report attached to the parent run is of the same two runs.
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    md = Path(client.download_artifacts(parent.info.run_id, "report/report.md", str(tmp_path))).read_text()
    assert "Adopt 'train.seed=2'" not in md
    for seed in ("1", "2"):
        assert f"train.seed={seed}" in md

    # Launcher settings are not identity, and a run recorded under the legacy hash is resumed. (Was a
    # test of its own that first trained seeds 1 and 2 in a sweep of their own: the two finished runs
    # above are the same two configurations, so they are resumed here instead: one 2-run sweep fewer.)
    runs = _runs(tmp_path)
    assert len(runs) == 2
    # As an older version recorded it: config_hash computed with the launcher's settings, no version tag.
    one = next(r for r in runs if r.data.params["train.seed"] == "1")
    resolved = OmegaConf.to_container(compose_cfg(["train.seed=1", *TINY]), resolve=True)
    client.set_tag(one.info.run_id, "config_hash", legacy_config_hash(resolved))
    client.delete_tag(one.info.run_id, IDENTITY_VERSION_TAG)

    again = _sweep(tmp_path, ["train.seed=1,2", *TINY, "launcher.runs_at_once=2", "launcher.timeout_s=5000",
                              "launcher.collective_timeout_s=100", "launcher.start_method=spawn"])
    assert "finished=0 " in again.stdout and "already finished=2" in again.stdout, again.stdout[-2000:]
    assert len(_runs(tmp_path)) == 2  # nothing trained twice
    # ... and both sweeps' runs are one configuration per seed in the report.
    rows = load_rows(f"sqlite:///{tmp_path / 'mlflow.db'}", "bertaccel")
    assert len(rows) == 2 and rows[0].group == rows[1].group  # seeds 1 and 2: repeats of one configuration


def test_two_sweeps_at_once_sharing_a_configuration_each_report_all_of_theirs(tmp_path):
    """Two different sweeps started together that share train.seed=3, first in both: one runs it,
    the other puts it off, runs its own, then takes the finished run. Each sweep's report covers
    its configurations, the shared one included (before, each reported 1 of its 2: the shared run
    carried one sweep_id tag). One own configuration per sweep, not two: the put-off-then-taken
    path is the same, with two runs fewer to train."""
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cmds = [[sys.executable, "-m", "bertaccel.run", "-m", seeds, *TINY, f"tracking.uri={store}",
             f"cache_dir={tmp_path / 'cache'}"] for seeds in ("train.seed=3,1", "train.seed=3,4")]
    procs = [warm_cli.popen(c, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c in cmds]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    finished = [r.data.params["train.seed"] for r in _runs(tmp_path) if r.data.tags.get("status") == "finished"]
    assert sorted(finished) == ["1", "3", "4"]  # (the shared configuration ran once)
    for (out, _), seeds in zip(outs, (["1", "3"], ["3", "4"])):
        parent = _parent(tmp_path, out)
        assert parent.data.tags["status"] == "finished (2 of 2 runs finished)", parent.data.tags
        rows = load_rows(store, "bertaccel", parent.data.tags["sweep_id"])
        assert sorted(r.seed for r in rows) == seeds
