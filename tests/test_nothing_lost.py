"""Nothing lost, nothing counted twice (issue 24): killed and concurrent sweeps, a store that
survives a kill while it is made, stores that are not stores, Ctrl-C while starting.

Real processes, real signals, real SQLite stores; the tiny model on the CPU."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
from mlflow.tracking import MlflowClient
import pytest

from bertaccel.record.tracking import search_runs
from bertaccel.store import sqlite_state
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

# Every test here starts a real process (the CLI, a script, a server) or trains: slow (docs/contributing.md).
pytestmark = pytest.mark.slow

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
TINY = ["model=tiny", "train.device=cpu", "dataset.train_subset=64", "dataset.test_subset=32", "train.batch_size=16"]


def _cmd(tmp_path: Path, args, store=None):
    store = store or f"sqlite:///{tmp_path / 'mlflow.db'}"
    return [sys.executable, "-m", "bertaccel.run", *args, f"tracking.uri={store}", f"cache_dir={tmp_path / 'cache'}"]


def _popen(tmp_path: Path, args, store=None, fresh=False, **kw):
    """The command in a session of its own, forked from a warm parent, or (fresh) a new interpreter:
    for the tests of its start-up, which the warm parent has behind it."""
    return (subprocess.Popen if fresh else warm_cli.popen)(
        _cmd(tmp_path, args, store), cwd=tmp_path, env=ENV, start_new_session=True,
        stdout=kw.pop("stdout", subprocess.DEVNULL), stderr=kw.pop("stderr", subprocess.PIPE), text=True, **kw)


def _runs(store):
    return [r for r in search_runs(store, "bertaccel") if r.data.tags.get("bertaccel.role") != "sweep"]


def _parents(store):
    return [r for r in search_runs(store, "bertaccel") if r.data.tags.get("bertaccel.role") == "sweep"]


def _said(err: str):
    """stderr without what runs write there anyway: progress bars, MLflow's and Python's warnings."""
    return [line for line in err.splitlines() if line.strip() and not re.match(r"^epoch \d+/\d+:", line)
            and "INFO mlflow" not in line and "resource_tracker" not in line and "warnings.warn" not in line]


def _group_gone(pgid: int, limit_s: float) -> bool:
    """Whether every process of a process group (a sweep started in a session of its own) ended."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        alive = [p for p in psutil.process_iter(["pid"]) if _pgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return True
        time.sleep(0.2)
    return False


def _pgid(pid: int):
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def _wait_for(predicate, limit_s: float, what: str, proc=None):
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the process ended before {what}: {proc.stderr.read()[-3000:] if proc.stderr else ''}")
        try:
            if predicate():
                return
        except Exception:  # noqa: BLE001 - the store may not exist yet
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _one_per_config(store, n):
    runs = _runs(store)
    finished = Counter(r.data.tags["config_hash"] for r in runs if r.data.tags.get("status") == "finished")
    assert len(finished) == n and set(finished.values()) == {1}, finished
    assert not [r for r in runs if r.data.tags.get("status") == "running" or r.info.status == "RUNNING"]
    return runs


# ---------------------------------------------------------------------------------------------
# 2. SIGKILL of the sweep's own process: its worker stops with it and marks its run interrupted.

def test_sigkill_of_the_sweep_process_stops_its_worker_and_a_rerun_counts_each_once(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # 12 epochs (48 steps): long enough to be caught mid-run, as test_resume's killed runs (48
    # steps); the rerun trains two of them to their end again, so not 30.
    args = ["-m", *TINY, "train.seed=1,2,3", "train.epochs=12"]
    proc = _popen(tmp_path, args)

    def one_done_next_running():
        status = Counter(r.data.tags.get("status") for r in _runs(store))
        return status["finished"] >= 1 and status["running"] >= 1

    _wait_for(one_done_next_running, 300, "one run finished and the next one running", proc)
    os.kill(proc.pid, signal.SIGKILL)  # the sweep's process alone, not its group: its worker is orphaned
    proc.wait()
    assert _group_gone(proc.pid, 30), "a worker or the forkserver outlived the killed sweep"
    killed = [r for r in _runs(store) if r.data.tags.get("status") == "interrupted"]
    assert len(killed) == 1 and killed[0].info.status == "KILLED"
    assert f"its sweep's process (pid {proc.pid}) ended" in killed[0].data.tags["reason"]

    rerun = warm_cli.run(_cmd(tmp_path, args), cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    runs = _one_per_config(store, 3)
    assert Counter(r.data.tags["status"] for r in runs)["interrupted"] == 1


# ---------------------------------------------------------------------------------------------
# 3 and the acceptance soak: three identical 6-run sweeps at once on one store, one of them
# SIGKILLed midway and run again: one finished run per configuration, nothing left running, the
# parent run closed once, by the last sweep, and the report sees 6 configurations.

def test_three_identical_sweeps_at_once_one_killed_and_rerun_count_each_configuration_once(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # 2 epochs (8 steps a run): what is checked is who runs and records each configuration, not
    # the training; the kill lands after two finished runs, mid-run or between runs alike.
    args = ["-m", *TINY, "train.seed=1,2,3", "accumulation=1,2", "train.epochs=2"]
    procs = [_popen(tmp_path, args, stdout=subprocess.PIPE) for _ in range(3)]
    victim = procs[1]
    _wait_for(lambda: Counter(r.data.tags.get("status") for r in _runs(store))["finished"] >= 2, 600,
              "two finished runs", victim)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    again = _popen(tmp_path, args, stdout=subprocess.PIPE)
    for p in (procs[0], procs[2], again):
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, err[-3000:]
        assert "run 6 of 6" in out
    assert _group_gone(victim.pid, 10)
    runs = _one_per_config(store, 6)
    # every run is finished, or interrupted by the kill (at most the one the victim was running)
    assert Counter(r.data.tags["status"] for r in runs)["interrupted"] <= 1
    assert set(r.data.tags["status"] for r in runs) <= {"finished", "interrupted"}
    (parent,) = _parents(store)
    assert parent.info.status == "FINISHED" and parent.data.tags["status"] == "finished (6 of 6 runs finished)"
    assert "reason" not in parent.data.tags and parent.data.tags["sweep_processes"] == ""

    report = warm_cli.run([sys.executable, "-m", "bertaccel.report", "--uri", store, "--out", "rep"],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]
    md = (tmp_path / "rep" / "report.md").read_text()
    # (with repeats the tables of single runs are in the appendix, under ### headings)
    raw = re.split(r"\n#{2,3} ", md.split("# Raw metrics", 1)[1], maxsplit=1)[0]
    rows = [line for line in raw.splitlines() if re.match(r"^\| \d+ \|", line)]
    assert len(rows) == 6, raw
    # Runs are labelled by their varying values, the seed aside (its repeats: report/labels.py): the
    # Runs table maps the 6 rows to 6 distinct MLflow runs, one per configuration.
    runs_table = re.split(r"\n#{2,3} ", md.split("# Runs: each label's MLflow run name and id", 1)[1], maxsplit=1)[0]
    names = [line.split("|")[2].strip() for line in runs_table.splitlines() if re.match(r"^\| \d \| train\.seed=", line)]
    assert sorted(names) == sorted(f"train.seed={s},accumulation={a}" for s in (1, 2, 3) for a in (1, 2)), runs_table


def test_a_parent_run_stays_open_while_another_sweep_process_is_on_it(tmp_path):
    """The first of two sweeps of one command to end does not close their shared parent run."""
    from bertaccel.record.sweep import close_parent, open_parent, process_tags

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    other = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom bertaccel.record.sweep import open_parent\n"
                              f"open_parent({store!r}, 'bertaccel', 's1', [], 2)\nprint('open', flush=True)\n"
                              "time.sleep(600)"], stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert other.stdout.readline().strip() == "open"
        run_id = open_parent(store, "bertaccel", "s1", [], 2)
        close_parent(store, run_id, {"finished": 2})
        run = MlflowClient(tracking_uri=store).get_run(run_id)
        assert run.info.status == "RUNNING" and run.data.tags["status"] == "running"
        assert run.data.tags["sweep_processes"].split() == [f"{process_tags(other.pid)['host']}:{other.pid}:"
                                                            f"{process_tags(other.pid)['pid_started_at']}"]
    finally:
        other.kill()
        other.wait()
    # the other process is gone: the next to leave closes it
    open_parent(store, "bertaccel", "s1", [], 2)
    close_parent(store, run_id, {"finished": 2})
    run = MlflowClient(tracking_uri=store).get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["status"] == "finished (2 of 2 runs finished)"


# ---------------------------------------------------------------------------------------------
# 4. A store killed while MLflow makes its tables is not broken for good.

MAKE_STORE = "import sys\nfrom bertaccel.store import store_lock\nwith store_lock(sys.argv[1]):\n    pass\n"


def test_sigkill_while_the_store_is_made_leaves_no_store_and_the_next_run_makes_it(tmp_path):
    db = tmp_path / "mlflow.db"
    store = f"sqlite:///{db}"
    proc = subprocess.Popen([sys.executable, "-c", MAKE_STORE, store], env=ENV, stderr=subprocess.DEVNULL)
    making = db.with_name(f"mlflow.db.creating-{proc.pid}")
    _wait_for(lambda: making.exists() and making.stat().st_size > 0, 120, "the store being made")
    proc.kill()
    proc.wait()
    assert making.exists() and not db.exists()  # killed mid-way: the half-made file is beside, not in place
    r = warm_cli.run(_cmd(tmp_path, TINY + ["train.max_steps_per_epoch=2"]), cwd=tmp_path, env=ENV,
                     capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sqlite_state(db)[0] == "ok" and not making.exists()
    assert [x.data.tags["status"] for x in _runs(store)] == ["finished"]


def test_ctrl_c_while_a_run_makes_the_store_is_one_line_and_the_store_survives(tmp_path):
    db = tmp_path / "mlflow.db"
    proc = _popen(tmp_path, TINY + ["train.max_steps_per_epoch=2"])
    _wait_for(lambda: any(".creating-" in p.name for p in tmp_path.iterdir()), 180, "the store being made", proc)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert len(_said(err)) == 1 and _said(err)[0].startswith("interrupted by SIGINT"), err[-3000:]
    assert sqlite_state(db)[0] in ("missing", "ok")  # never half-made
    assert not [p for p in tmp_path.iterdir() if ".creating-" in p.name]
    r = warm_cli.run(_cmd(tmp_path, TINY + ["train.max_steps_per_epoch=2"]), cwd=tmp_path, env=ENV,
                     capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]


def _half_created(db: Path) -> None:
    """What a run killed between MLflow's table creation and its migrations left (older versions)."""
    import sqlalchemy
    from mlflow.store.db.utils import InitialBase

    engine = sqlalchemy.create_engine(f"sqlite:///{db}")
    InitialBase.metadata.create_all(engine)
    engine.dispose()


def test_a_half_created_store_is_one_line_for_the_report_and_rebuilt_by_the_next_run(tmp_path):
    db = tmp_path / "mlflow.db"
    _half_created(db)
    before = db.read_bytes()
    rep = warm_cli.run([sys.executable, "-m", "bertaccel.report", "--uri", f"sqlite:///{db}"], cwd=tmp_path,
                       env=ENV, capture_output=True, text=True, timeout=120)
    assert rep.returncode == 2 and len(_said(rep.stderr)) == 1, rep.stderr[-3000:]
    assert "half-created" in rep.stderr and "Traceback" not in rep.stderr
    assert db.read_bytes() == before and not (tmp_path / "report").exists()
    r = warm_cli.run(_cmd(tmp_path, TINY + ["train.max_steps_per_epoch=2"]), cwd=tmp_path, env=ENV,
                     capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sqlite_state(db)[0] == "ok"


# ---------------------------------------------------------------------------------------------
# 7, 9, 10, 11: URIs and files that are not stores: one line, exit 2, nothing written.

def _listing(path: Path):
    return sorted((str(p.relative_to(path)), p.stat().st_size if p.is_file() else -1) for p in path.rglob("*"))


def test_report_and_plan_on_an_empty_file_or_random_bytes_write_nothing(tmp_path):
    (tmp_path / "z.db").touch()
    (tmp_path / "g.db").write_bytes(os.urandom(5000))
    before = _listing(tmp_path)
    for name, what in (("z.db", "an empty file"), ("g.db", "not a SQLite database")):
        uri = f"sqlite:///{tmp_path / name}"
        for cmd in ([sys.executable, "-m", "bertaccel.report", "--uri", uri],
                    [sys.executable, "-m", "bertaccel.plan", "-m", "model=tiny", "accumulation=1,2", f"tracking.uri={uri}"]):
            r = warm_cli.run(cmd, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
            assert r.returncode == 2, (cmd, r.stderr[-3000:])
            (line,) = _said(r.stderr)
            assert line.startswith("error: ") and what in line, line
    assert _listing(tmp_path) == before  # not one byte written, no lock file, no report folder


def test_uris_that_are_no_store_are_one_line_for_a_run_and_a_sweep(tmp_path):
    (tmp_path / "adir").mkdir()
    (tmp_path / "g.db").write_bytes(os.urandom(5000))
    before = _listing(tmp_path)
    cases = {f"sqlite:///{tmp_path / 'adir'}/": "is a directory", "foo://bar": "no store for the scheme 'foo:'",
             f"sqlite:///{tmp_path / 'g.db'}": "not a SQLite database",
             f"sqlite:///{tmp_path / 'g.db'}/x.db": "is a file"}
    for uri, what in cases.items():
        for sweep in ([], ["-m", "accumulation=1,2"]):
            start = time.monotonic()
            r = warm_cli.run(_cmd(tmp_path, [*sweep, *TINY], store=uri), cwd=tmp_path, env=ENV,
                             capture_output=True, text=True, timeout=120)
            assert r.returncode == 2, (uri, sweep, r.stderr[-3000:])
            (line,) = _said(r.stderr)
            assert line.startswith(f"error: tracking.uri={uri}: ") and what in line, line
            assert time.monotonic() - start < 60  # no minutes of retries
    assert _listing(tmp_path) == before  # no outputs/, multirun/, .lock or store


# ---------------------------------------------------------------------------------------------
# 8. A resumed sweep's parent does not keep the reason of its interruption.

def test_a_resumed_sweep_parent_loses_its_interruption_reason(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # One configuration: the check is the parent run's reason tag, which one run's sweep has as well.
    args = ["-m", *TINY, "train.seed=1", "train.max_steps_per_epoch=2"]
    proc = _popen(tmp_path, args)
    _wait_for(lambda: len(_parents(store)) == 1, 300, "the sweep's parent run", proc)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    (parent,) = _parents(store)
    assert parent.data.tags["reason"] == "interrupted by SIGINT"
    rerun = warm_cli.run(_cmd(tmp_path, args), cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    (parent,) = _parents(store)
    assert parent.data.tags["status"] == "finished (1 of 1 runs finished)" and "reason" not in parent.data.tags


# ---------------------------------------------------------------------------------------------
# 12. Ctrl-C in the first seconds: one line, no traceback.

def test_ctrl_c_while_the_libraries_import_is_one_line(tmp_path):
    proc = _popen(tmp_path, TINY, fresh=True)
    time.sleep(0.3)  # python has started; the imports take seconds
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and len(_said(err)) == 1 and "interrupted by SIGINT" in err, err[-3000:]
    assert not (tmp_path / "mlflow.db").exists()


def test_ctrl_c_while_the_forkserver_imports_is_one_line(tmp_path):
    proc = _popen(tmp_path, ["-m", *TINY, "train.seed=1,2"], fresh=True)

    def forkserver_started():
        return any("forkserver" in " ".join(c.cmdline()) for c in psutil.Process(proc.pid).children())

    _wait_for(forkserver_started, 120, "the forkserver", proc)
    time.sleep(0.5)  # it is importing its preload (torch, transformers, mlflow: seconds)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert len(_said(err)) == 1 and _said(err)[0].startswith("interrupted by SIGINT"), err[-3000:]
    assert _group_gone(proc.pid, 30)
