"""Nothing lost, round 3 (issue 42, items 1, 7, 8): a database bertaccel did not make is refused,
never rebuilt; a read-only store or folder is one line for a run and readable for report and
plan; Ctrl-C of report and plan is one line; a store locked by another client is called locked.

Real files (another program's SQLite database, a real Optuna storage, MLflow stores made by
MLflow), real processes, real signals; the tiny model on the CPU."""
from __future__ import annotations

import hashlib
import os
import select
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from bertaccel.store import sqlite_state
from test_nothing_lost import ENV, TINY, _cmd, _listing, _popen, _said, _wait_for
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

# Every test here starts a real process (the CLI, a script, a server) or trains: slow (docs/contributing.md).
pytestmark = pytest.mark.slow

SWEEP = ["-m", "accumulation=1,2"]
QUICK = TINY + ["train.max_steps_per_epoch=2"]


def _digests(folder: Path):
    """Every file under folder with its sha256: what "nothing written" is checked against."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _plan(tmp_path: Path, uri: str, *extra):
    return [sys.executable, "-m", "bertaccel.plan", "-m", *QUICK, "train.seed=1,2", f"tracking.uri={uri}",
            f"cache_dir={tmp_path / 'cache'}", *extra]


def _report(uri: str, *extra):
    return [sys.executable, "-m", "bertaccel.report", "--uri", uri, *extra]


def _all_at_once(cmds, cwd: Path, timeout: float = 300):
    """Run the commands side by side (each refusal costs the imports: seconds), each in a folder
    of its own under cwd (cwd/0, cwd/1, ...: what one leaves is told apart); their results."""
    for i in range(len(cmds)):
        (cwd / str(i)).mkdir(exist_ok=True)
    procs = [warm_cli.popen(c, cwd=cwd / str(i), env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True) for i, c in enumerate(cmds)]
    return [(c, p.returncode, out, err) for c, p, (out, err) in
            ((c, p, p.communicate(timeout=timeout)) for c, p in zip(cmds, procs))]


# ---------------------------------------------------------------------------------------------
# Item 1: another program's database, a lab's table, an MLflow store with things in it.

def _alembic_app(db: Path) -> None:
    """What Flask-Migrate / Airflow / Superset leave: alembic's version table beside their own."""
    con = sqlite3.connect(db)
    con.executescript("create table alembic_version (version_num varchar(32) primary key);"
                      "insert into alembic_version values ('3f4e5a6b7c8d');"
                      "create table users (id integer primary key, name text);"
                      "insert into users (name) values ('ann'), ('bob');")
    con.commit()
    con.close()


def _lab(db: Path) -> None:
    con = sqlite3.connect(db)
    con.executescript("create table experiments (id integer primary key, name text, started text);"
                      "insert into experiments (name, started) values ('mice-a', '2026-01-02'), ('mice-b', '2026-01-09');")
    con.commit()
    con.close()


def _optuna(db: Path) -> None:
    """A real Optuna storage with a study and a trial. The installed Optuna's own stamp of its
    alembic version does not commit under SQLAlchemy 2 (its create_study then fails on its own
    assertion, with its tables made): then the study is made through the tables Optuna made."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        optuna.create_study(storage=f"sqlite:///{db}", study_name="s").optimize(
            lambda t: t.suggest_float("x", 0, 1), n_trials=1)
        return
    except AssertionError:
        pass
    import gc

    gc.collect()  # (the failed storage's connection holds its uncommitted stamp's write lock until collected)
    from alembic.script import ScriptDirectory
    from optuna.storages._rdb import storage

    head = ScriptDirectory(str(Path(storage.__file__).parent / "alembic")).get_current_head()
    con = sqlite3.connect(db)
    con.execute("insert into alembic_version values (?)", (head,))
    con.execute("insert into studies (study_id, study_name) values (1, 's')")
    con.execute("insert into trials (trial_id, number, study_id, state) values (1, 0, 1, 'COMPLETE')")
    con.commit()
    con.close()


def _mlflow_with_model(db: Path, schema=None) -> None:
    """An MLflow store made by MLflow, with an experiment and a registered model but no runs;
    schema: an older alembic version recorded in it (as an older MLflow leaves it)."""
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    client.create_experiment("mine", artifact_location=(db.parent / "art").as_uri())
    client.create_registered_model("m1")
    if schema:
        con = sqlite3.connect(db)
        con.execute("update alembic_version set version_num = ?", (schema,))
        con.commit()
        con.close()


OLD_SCHEMA = "0584bdc529eb"  # one of MLflow's own earlier revisions


@pytest.fixture(scope="module")
def foreign(tmp_path_factory):
    folder = tmp_path_factory.mktemp("foreign")
    _alembic_app(folder / "app.db")
    _lab(folder / "lab.db")
    _optuna(folder / "optuna.db")
    _mlflow_with_model(folder / "old.db", OLD_SCHEMA)
    return folder, {"app.db": "something else (tables alembic_version, users)",
                    "lab.db": "something else (tables experiments)",
                    "optuna.db": "something else (tables alembic_version, studies",
                    "old.db": f"an MLflow store of schema {OLD_SCHEMA} (this MLflow writes "}


def test_another_programs_database_is_refused_by_a_run_and_a_sweep_never_rebuilt(foreign, tmp_path):
    folder, what = foreign
    assert {name: sqlite_state(folder / name)[0] for name in what} == {
        "app.db": "foreign", "lab.db": "foreign", "optuna.db": "foreign", "old.db": "old_schema"}
    before = _digests(folder)
    cmds = [_cmd(tmp_path, [*sweep, *QUICK], store=f"sqlite:///{folder / name}") for name in what for sweep in ([], SWEEP)]
    for cmd, rc, _, err in _all_at_once(cmds, tmp_path):
        assert rc == 2, (cmd, err[-3000:])
        (line,) = _said(err)
        name = Path(cmd[-2].split("sqlite:///")[1]).name
        assert line.startswith("error: tracking.uri=") and what[name] in line, line
    assert "1 experiment and 1 registered model but no runs; back it up, then `mlflow db upgrade" in line
    assert _digests(folder) == before  # not one byte of any of them changed, nothing made beside them
    assert not [p for p in tmp_path.rglob("*") if not (p.is_dir() and p.parent == tmp_path)]  # where the
    # runs started: no outputs/, multirun/, store or lock


def test_report_and_plan_name_what_another_programs_database_is(foreign, tmp_path):
    folder, what = foreign
    before = _digests(folder)
    cmds = [c for name in ("app.db", "old.db") for c in (_report(f"sqlite:///{folder / name}"),
                                                         _plan(tmp_path, f"sqlite:///{folder / name}"))]
    for cmd, rc, _, err in _all_at_once(cmds, tmp_path):
        assert rc == 2, (cmd, err[-3000:])
        (line,) = _said(err)
        assert "makes it a store" not in line and ("something else" in line or "registered model" in line), line
    assert _digests(folder) == before and not (tmp_path / "report").exists()


def test_an_mlflow_store_with_a_model_but_no_runs_is_used_as_it_is(store_made):
    # (the run is the shared `store` fixture's own: the tests reading that store write nothing to it)
    db, state_before, r = store_made
    assert state_before == "ok"
    assert r.returncode == 0, r.stderr[-3000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    assert client.get_experiment_by_name("mine") is not None  # kept: the store was not rebuilt
    assert [m.name for m in client.search_registered_models()] == ["m1"]
    (run,) = client.search_runs([client.get_experiment_by_name("bertaccel").experiment_id])
    assert run.data.tags["status"] == "finished"


def test_only_an_empty_mlflow_creation_counts_as_half_created(tmp_path):
    """What may be rebuilt: MLflow's tables holding nothing but what MLflow writes itself."""
    from mlflow.store.db.utils import _get_latest_schema_revision

    def variant(name: str, *sql) -> Path:
        db = tmp_path / name
        shutil.copy(tmp_path / "base.db", db)
        con = sqlite3.connect(db)
        for statement in sql:
            con.execute(statement)
        con.commit()
        con.close()
        return db

    MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'base.db'}").search_experiments()  # made by MLflow: Default only
    con = sqlite3.connect(tmp_path / "base.db")
    con.execute("update alembic_version set version_num = ?", (OLD_SCHEMA,))
    con.commit()
    con.close()
    empty_old = variant("empty_old.db")
    assert sqlite_state(empty_old)[0] == "half_created"  # an older MLflow's empty store: nothing to lose
    assert sqlite_state(variant("notes.db", "create table notes (id integer primary key)"))[0] == "foreign"
    renamed = variant("renamed.db", "update experiments set name = 'mine' where experiment_id = 0")
    assert sqlite_state(renamed) == ("old_schema", f"schema {OLD_SCHEMA} (this MLflow writes "
                                                   f"{_get_latest_schema_revision()}) with 1 experiment but no runs")
    assert sqlite_state(variant("unknown.db", "update alembic_version set version_num = 'aaaaaaaaaaaa'"))[0] == "new_schema"


# ---------------------------------------------------------------------------------------------
# A store with one finished run, shared by the tests below (a real run costs 10-20 s here). It is
# made as test_an_mlflow_store_with_a_model_but_no_runs_is_used_as_it_is needs it: an MLflow store
# with an experiment and a registered model but no runs, then one run into it (one real run for
# both; every test that reads this store checks it writes nothing to it).

@pytest.fixture(scope="module")
def store_made(tmp_path_factory):
    folder = tmp_path_factory.mktemp("store")
    db = folder / "mlflow.db"
    _mlflow_with_model(db)
    state_before = sqlite_state(db)[0]
    r = warm_cli.run(_cmd(folder, QUICK), cwd=folder, env=ENV, capture_output=True, text=True, timeout=600)
    return db, state_before, r


@pytest.fixture(scope="module")
def store(store_made):
    db, _, r = store_made
    assert r.returncode == 0, r.stderr[-3000:]
    return db


def _read_only(path: Path, cmd):
    """cmd run with `path` (a file or a folder) read-only to it. chmod does not stop root: then
    a read-only bind mount in a mount namespace of the command's own (unshare), which stops
    root too (EROFS), and leaves every other process's view as it is."""
    if os.geteuid() != 0:
        path.chmod(path.stat().st_mode & ~0o222)
        return cmd
    return ["unshare", "-m", "sh", "-c", 'mount --bind -o ro "$1" "$1" && shift && exec "$@"', "sh", str(path), *cmd]


@pytest.fixture(scope="module")
def can_make_read_only(tmp_path_factory):
    probe = tmp_path_factory.mktemp("ro")
    r = subprocess.run(_read_only(probe, ["touch", str(probe / "x")]), capture_output=True, text=True)
    if os.geteuid() != 0:
        probe.chmod(0o755)
    if r.returncode == 0 or "Read-only" not in r.stderr and "Permission denied" not in r.stderr:
        pytest.skip(f"cannot make a folder read-only here (running as root without mount namespaces: {r.stderr.strip()})")


def _copy_store(store: Path, to: Path) -> Path:
    to.mkdir()
    shutil.copy(store, to / "mlflow.db")
    return to / "mlflow.db"


def test_a_read_only_store_or_folder_is_one_line_for_a_run_and_readable_for_report_and_plan(
        store, can_make_read_only, tmp_path):
    ro_file = _copy_store(store, tmp_path / "file")  # the store read-only, its folder not
    ro_dir = _copy_store(store, tmp_path / "dir")    # the folder read-only (no lock file in it)
    work = tmp_path / "work"
    work.mkdir()
    before = {d: _digests(tmp_path / d) for d in ("file", "dir")}
    cmds = [_read_only(db if db is ro_file else db.parent, _cmd(work, [*sweep, *QUICK], store=f"sqlite:///{db}"))
            for db in (ro_file, ro_dir) for sweep in ([], SWEEP)]
    cmds += [_read_only(ro_dir.parent, _report(f"sqlite:///{ro_dir}", "--out", str(tmp_path / "report"))),
             _read_only(ro_dir.parent, _plan(work, f"sqlite:///{ro_dir}")),
             _read_only(ro_file, _report(f"sqlite:///{ro_file}", "--out", str(tmp_path / "report2")))]
    results = _all_at_once(cmds, work)
    for cmd, rc, _, err in results[:4]:
        assert rc == 2, (cmd, err[-3000:])
        (line,) = _said(err)
        assert "is read-only" in line and "give a store you can write" in line, line
    for cmd, rc, out, err in results[4:]:
        assert rc == 0, (cmd, err[-3000:])
        assert "OSError" not in err and "Traceback" not in err, err[-3000:]
    for name in ("report", "report2"):
        assert (tmp_path / name / "report.md").is_file()
    assert {d: _digests(tmp_path / d) for d in before} == before  # the stores as they were, no lock file beside
    assert not [p for p in work.rglob("*") if p.is_file() and "cache" not in p.relative_to(work).parts]  # (the
    # plan's data cache): no outputs/, no store, no lock file where the commands started


# ---------------------------------------------------------------------------------------------
# Item 7: Ctrl-C of report and plan; a run stopped or refused before its store leaves nothing.

def _has_open(pid: int, path: Path) -> bool:
    return any(Path(f.path) == path for p in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
               for f in p.open_files())


@pytest.mark.parametrize("command", ["report", "plan"])
def test_ctrl_c_of_report_or_plan_is_one_line_and_writes_nothing(store, tmp_path, command):
    uri = f"sqlite:///{store}"
    before = _digests(store.parent)
    cmd = _report(uri, "--out", str(tmp_path / "out")) if command == "report" else \
        _plan(tmp_path, uri, "--out", str(tmp_path / "out"))
    proc = warm_cli.popen(cmd, cwd=tmp_path, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, start_new_session=True)
    _wait_for(lambda: _has_open(proc.pid, store), 120, f"the {command} reading the store", proc)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    (line,) = _said(err)
    assert line == "interrupted by SIGINT: nothing written", line  # (in its main, not while it imports)
    assert not (tmp_path / "out").exists() and _digests(store.parent) == before


def test_a_run_stopped_while_it_makes_the_store_or_refused_leaves_no_lock_file_and_no_folder(tmp_path):
    store = f"sqlite:///{tmp_path / 'new' / 'mlflow.db'}"
    before = _listing(tmp_path)
    r = warm_cli.run(_cmd(tmp_path, [*QUICK, "train.epochs=0"], store=store), cwd=tmp_path, env=ENV,
                     capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and _listing(tmp_path) == before, r.stderr[-3000:]
    proc = _popen(tmp_path, QUICK, store=store)  # (a session of its own, stderr a pipe)
    new = tmp_path / "new"
    _wait_for(lambda: any(".creating-" in p.name for p in new.iterdir()), 180, "the store being made", proc)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert not new.exists(), _listing(new)  # no store, no mlflow.db.lock, not the folder made for them


# ---------------------------------------------------------------------------------------------
# Item 8: a store another client holds locked.

HOLD = ("import sqlite3, sys, time\ncon = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "con.execute('BEGIN EXCLUSIVE')\nprint('locked', flush=True)\ntime.sleep(float(sys.argv[2]))\n"
        "con.execute('ROLLBACK')\n")


def _hold(db: Path, seconds: float):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(db), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


def test_a_store_another_client_locks_is_waited_for_then_called_locked(store, tmp_path):
    other = tmp_path / "other.db"
    _mlflow_with_model(other)
    before = _digests(tmp_path)
    long_hold, short_hold = _hold(other, 60), _hold(store, 8)
    try:
        start = time.monotonic()
        results = _all_at_once([_cmd(tmp_path, QUICK, store=f"sqlite:///{other}"),
                                _report(f"sqlite:///{store}", "--out", str(tmp_path / "report"))], tmp_path)
        waited = time.monotonic() - start
    finally:
        long_hold.kill()
        short_hold.kill()
    (_, rc, _, err), (_, rep_rc, _, rep_err) = results
    assert rc == 2, err[-3000:]
    waiting, refused = _said(err)
    assert waiting.startswith(f"waiting up to 30 s: {other} is locked by pid {long_hold.pid} "), waiting
    assert f"{other} is locked by pid {long_hold.pid}" in refused and "not an MLflow store" not in refused, refused
    assert refused.startswith("error: tracking.uri=") and "let it finish or stop it" in refused, refused
    assert waited > 30  # (it waited the 30 s, then gave up)
    assert rep_rc == 0, rep_err[-3000:]  # the short hold was waited out, then the store read
    assert f"waiting up to 30 s: {store} is locked by pid {short_hold.pid}" in rep_err, rep_err[-3000:]
    shutil.rmtree(tmp_path / "report")
    assert _digests(tmp_path) == before


# A process stopped (Ctrl-Z) while it holds the store's lock file: the others say who holds it.

_HOLD_LOCK = ("import fcntl, sys, time\n"
              "f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)")
_TAKE_LOCK = ("import sys\nfrom bertaccel.store import store_lock\n"
              "with store_lock(sys.argv[1]):\n    print('got the lock', flush=True)")


def test_a_wait_on_a_stopped_holder_of_the_store_lock_names_it_and_ends_when_it_goes_on(store, tmp_path):
    """The real store_lock in a process of its own, waiting on a real holder of the lock file
    that is SIGSTOPped: within seconds one line names the holder's pid and that it is stopped;
    once the holder goes on and ends, the waiter gets the lock."""
    db = _copy_store(store, tmp_path / "s")
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(db.with_name(db.name + ".lock"))],
                              stdout=subprocess.PIPE, text=True)
    waiter = None
    try:
        assert holder.stdout.readline().strip() == "held"
        os.kill(holder.pid, signal.SIGSTOP)
        waiter = subprocess.Popen([sys.executable, "-c", _TAKE_LOCK, f"sqlite:///{db}"], env=ENV,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready, _, _ = select.select([waiter.stderr], [], [], 30)  # (it says it after 2 s of waiting)
        line = waiter.stderr.readline() if ready else "(nothing said in 30 s)"
        assert f"held by pid {holder.pid}" in line and "stopped (Ctrl-Z?)" in line \
            and f"kill -CONT {holder.pid}" in line, line
        assert waiter.poll() is None  # still waiting: the stopped process holds the lock
        os.kill(holder.pid, signal.SIGCONT)
        holder.kill()  # (the holder ends: its lock goes with it)
        out, err = waiter.communicate(timeout=60)
        assert waiter.returncode == 0 and out.strip() == "got the lock", err
    finally:
        os.kill(holder.pid, signal.SIGCONT) if holder.poll() is None else None
        holder.kill()
        if waiter is not None and waiter.poll() is None:
            waiter.kill()
