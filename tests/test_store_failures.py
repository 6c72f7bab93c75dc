"""A store or file system that fails under a sweep (issue 42, items 7 and 9): an experiment deleted
in the MLflow UI, the disk filling, the store file deleted or replaced, and a suspended sweep
holding a configuration. Each is one line and a non-zero exit, nothing is left running that the
next sweep does not close, and a store is never silently made again in place of the one that went.

Real processes, real signals, real SQLite stores (a real full tmpfs); the tiny model on the CPU."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient
from test_nothing_lost import ENV, TINY, _cmd, _group_gone, _one_per_config, _parents, _popen, _runs, _said, _wait_for
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

# Long enough that a run is still training when the test acts on its sweep (a few seconds each):
# 12 epochs of 4 steps, 48 steps and 12 evaluations, as long as test_resume's runs that are killed
# mid-way (2 epochs of 24 steps). Not 30: three tests here train both configurations to their end
# again (the rerun, or sweep B and A's rest), so every epoch counts 2 to 3 times (a loaded 2-core
# box takes about 2 s an epoch).
SLOW = ["train.epochs=12"]


def _running(store):
    return [r for r in _runs(store) if r.data.tags.get("status") == "running"]


def _rerun_closes_everything(tmp_path, args, store, n):
    """The same sweep command again: it resumes, closes what the failed one left open, and every
    configuration ends with one finished run, the parent run closed."""
    r = warm_cli.run(_cmd(tmp_path, args, store), cwd=tmp_path, env=ENV, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    runs = _one_per_config(store, n)
    (parent,) = _parents(store)
    assert parent.info.status == "FINISHED" and parent.data.tags["status"] == f"finished ({n} of {n} runs finished)"
    return runs


# ---------------------------------------------------------------------------------------------
# An experiment deleted in the MLflow UI (soft delete: MLflow keeps it in its trash).

@pytest.mark.slow
def test_a_deleted_experiment_is_one_line_and_exit_2_before_any_work(tmp_path):
    db = tmp_path / "mlflow.db"
    store = f"sqlite:///{db}"
    client = MlflowClient(tracking_uri=store)
    exp = client.create_experiment("bertaccel")
    client.delete_experiment(exp)
    before = db.read_bytes()
    for sweep in ([], ["-m", "train.seed=1,2"]):
        r = warm_cli.run(_cmd(tmp_path, [*sweep, *TINY]), cwd=tmp_path, env=ENV, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 2, (sweep, r.stderr[-3000:])
        (line,) = _said(r.stderr)
        assert "experiment 'bertaccel' is deleted in the store" in line, line
        assert f"mlflow experiments restore --experiment-id {exp}" in line and "tracking.experiment=" in line, line
    assert db.read_bytes() == before  # nothing written: no run, no parent run, no experiment made
    assert client.search_runs([exp], run_view_type=ViewType.ALL) == []


@pytest.mark.slow
def test_an_experiment_deleted_mid_sweep_stops_it_with_one_line_and_the_next_sweep_closes_what_it_left(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = ["-m", *TINY, "train.seed=1,2", *SLOW]
    proc = _popen(tmp_path, args)
    _wait_for(lambda: _running(store), 300, "the first run training", proc)
    client = MlflowClient(tracking_uri=store)
    exp = client.get_experiment_by_name("bertaccel").experiment_id
    client.delete_experiment(exp)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err[-3000:]
    (line,) = _said(err)
    assert "experiment 'bertaccel' was deleted in the store while the sweep ran" in line, line
    assert f"mlflow experiments restore --experiment-id {exp}" in line, line
    # Nothing can be written to a deleted experiment's runs: the line names what it left open.
    assert "left open" in line and "parent run" in line and "train.seed=1" in line, line
    assert _group_gone(proc.pid, 30)
    client.restore_experiment(exp)
    runs = _rerun_closes_everything(tmp_path, args, store, 2)
    assert Counter(r.data.tags["status"] for r in runs) == {"finished": 2, "interrupted": 1}


# ---------------------------------------------------------------------------------------------
# The disk holding the store fills up mid-sweep: a real full file system (a small tmpfs).

@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({(mounted.stderr or 'mount failed').strip()}): the disk-full "
                    "test needs a real file system that fills up (run it as root)")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def _fill(disk: Path) -> Path:
    filler = disk / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    return filler


@pytest.mark.slow
def test_a_disk_filling_mid_sweep_is_one_line_naming_the_cause_and_what_is_left_open(tmp_path, small_disk):
    store = f"sqlite:///{small_disk / 'mlflow.db'}"
    args = ["-m", *TINY, "train.seed=1,2", *SLOW]
    proc = _popen(tmp_path, args, store=store)
    _wait_for(lambda: _running(store), 300, "the first run training", proc)
    filler = _fill(small_disk)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err[-3000:]
    (line,) = _said(err)
    assert "database or disk is full" in line or "No space left on device" in line, line
    assert str(small_disk) in line and "free space" in line, line
    # Whether a full disk still takes the closing writes depends on the room SQLite finds in pages
    # the file already has (seen both ways on one box): the runs it opened are then recorded
    # interrupted, else named, for the next sweep to close. Either way the rerun below sees the same.
    if "left open" in line:
        assert "train.seed=1" in line and "parent run" in line, line
    else:
        assert "recorded interrupted with this reason" in line, line
    assert "Background on this error" not in line and "Traceback" not in err
    assert _group_gone(proc.pid, 30)
    filler.unlink()
    runs = _rerun_closes_everything(tmp_path, args, store, 2)
    assert Counter(r.data.tags["status"] for r in runs) == {"finished": 2, "interrupted": 1}


# ---------------------------------------------------------------------------------------------
# The store file deleted, or replaced by another file, while a sweep writes to it.

@pytest.mark.slow
def test_a_store_deleted_mid_sweep_stops_it_and_is_not_made_again(tmp_path):
    db = tmp_path / "mlflow.db"
    store = f"sqlite:///{db}"
    proc = _popen(tmp_path, ["-m", *TINY, "train.seed=1,2", *SLOW])
    _wait_for(lambda: _running(store), 300, "the first run training", proc)
    db.unlink()
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err[-3000:]
    (line,) = _said(err)
    assert f"the store {db} was deleted while the sweep ran" in line, line
    assert not db.exists()  # no new empty store in its place
    assert _group_gone(proc.pid, 30)


def _an_empty_file(db: Path) -> None:
    import sqlite3

    sqlite3.connect(db).execute("select 1").fetchall()  # what a new pooled connection does
    assert db.stat().st_size == 0


def _a_fresh_mlflow_store(db: Path) -> None:
    # What a new MLflow client's set-up leaves there: a store with MLflow's tables and none of the
    # sweep's runs (made beside it and moved in: this process's MLflow keeps its engine for the
    # URI, whose connections hold the deleted file).
    fresh = db.with_name("fresh.db")
    MlflowClient(tracking_uri=f"sqlite:///{fresh}").search_experiments()
    os.replace(fresh, db)
    assert db.stat().st_size > 0


@pytest.mark.slow
@pytest.mark.parametrize("made", [_an_empty_file, _a_fresh_mlflow_store], ids=["empty file", "fresh store"])
def test_a_kept_store_deleted_during_a_hold_is_not_left_as_a_file_holding_nothing(tmp_path, monkeypatch, made):
    """The race behind the test above's rare 'replaced by another file': the store is deleted after
    store_lock checked it, and our own process makes a file at its path before MLflow's query fails:
    a new pooled connection an empty one, a new MLflow client a fresh store. Either holds none of
    the sweep's runs: the hold leaves no file there, and the next hold says the store was deleted."""
    from bertaccel.store import store_lock
    from bertaccel.context import CONTEXT_ENV
    from bertaccel.store.keep import StoreLost, keep_store

    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    monkeypatch.setenv(CONTEXT_ENV, "")
    client = MlflowClient(tracking_uri=uri)
    client.create_run(client.create_experiment("sweep"))  # a store with a run in it
    keep_store(uri)
    try:
        with store_lock(uri):
            db.unlink()
            made(db)
        assert not db.exists()
        with pytest.raises(StoreLost, match="was deleted while the sweep ran"):
            with store_lock(uri):
                pass
        assert not db.exists()
    finally:
        keep_store(None)


@pytest.mark.slow
def test_a_store_replaced_mid_sweep_stops_it_and_the_file_in_its_place_is_not_written(tmp_path):
    db = tmp_path / "mlflow.db"
    store = f"sqlite:///{db}"
    proc = _popen(tmp_path, ["-m", *TINY, "train.seed=1,2", *SLOW])
    _wait_for(lambda: _running(store), 300, "the first run training", proc)
    copy = tmp_path / "copy.db"
    shutil.copyfile(db, copy)  # e.g. a backup put back while the sweep runs: another file (inode)
    os.replace(copy, db)
    replaced = db.read_bytes()
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err[-3000:]
    (line,) = _said(err)
    assert f"the store {db} was replaced by another file while the sweep ran" in line, line
    assert db.read_bytes() == replaced
    assert _group_gone(proc.pid, 30)


# ---------------------------------------------------------------------------------------------
# A suspended sweep (Ctrl-Z: its whole process group stopped) does not hold up an identical sweep.

@pytest.mark.slow
def test_a_stopped_sweep_does_not_hold_up_the_configurations_another_sweep_is_free_to_run(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = ["-m", *TINY, "train.seed=1,2", *SLOW]
    a = _popen(tmp_path, args)
    # Training: past the run's last store write before it (its prediction), so A does not hold the
    # store's lock while stopped (a lock held by a stopped process is the store lock's business).
    _wait_for(lambda: any("prediction_basis" in r.data.tags for r in _running(store)), 300,
              "sweep A training its first configuration", a)
    os.killpg(a.pid, signal.SIGSTOP)  # what Ctrl-Z does to a job in a terminal
    held = _running(store)[0]
    b_out = tmp_path / "b.out"
    with open(b_out, "w") as out:
        b = _popen(tmp_path, args, stdout=out)
        try:
            # B runs train.seed=2 while A is stopped, then says whom it waits on for train.seed=1.
            _wait_for(lambda: "which is stopped (Ctrl-Z?)" in b_out.read_text(), 300, "B saying it waits on a "
                      "stopped process", b)
            said = b_out.read_text()
            assert f"held by pid {held.data.tags['pid']}, which is stopped (Ctrl-Z?): waiting" in said, said
            assert f"kill -CONT {held.data.tags['pid']}" in said, said
            seed2 = [r for r in _runs(store) if r.data.tags.get("status") == "finished"]
            assert [r.data.params["train.seed"] for r in seed2] == ["2"], "B did not run train.seed=2 first"
            assert a.poll() is None and psutil_status(a.pid) == "stopped"
        finally:
            os.killpg(a.pid, signal.SIGCONT)
        for p in (a, b):
            _, err = p.communicate(timeout=600)
            assert p.returncode == 0, err[-3000:]
    runs = _one_per_config(store, 2)
    assert Counter(r.data.tags["status"] for r in runs) == {"finished": 2}
    said = b_out.read_text()
    assert "run 2 of 2" in said and "already_finished" in said, said[-3000:]


def psutil_status(pid: int) -> str:
    import psutil

    return psutil.Process(pid).status()
