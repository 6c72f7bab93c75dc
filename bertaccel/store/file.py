"""Where the file of a `sqlite:///` store is (sqlite_file), what it holds, read without writing (a
read-only connection), and whether bertaccel may build a store over it (lock.py).

The rule: a file bertaccel did not make is never rebuilt, only refused. The one file rebuilt is
one that is provably an abandoned, empty MLflow store creation (an older version's run killed
while MLflow made its tables): every table is one of MLflow's own, with MLflow's columns; its
alembic version, if any, is one of MLflow's revisions; and no table holds anything but what
MLflow writes itself when it makes a store (the version, the "Default" experiment 0, the "default"
workspace). MLflow is asked for its tables and revisions. Anything else is refused by name:
another program's database (Airflow, Optuna, Flask-Migrate: alembic_version beside tables of
their own), a lab's `experiments` table, an MLflow store of another schema holding experiments or
registered models but no runs.
"""
from __future__ import annotations

import fcntl
import os
import re
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Dict, FrozenSet, List, Optional, Tuple

import psutil

SQLITE_MAGIC = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file
LOCK_QUIET_S = 2.0   # a store locked this long is waited for silently (another sweep's write: milliseconds)
LOCK_WAIT_S = 30.0   # then, saying so, this long before the store counts as locked
ALEMBIC_TMP = "_alembic_tmp_"  # a table alembic's SQLite batch migration makes and drops again
# What MLflow writes into a store it makes: (table, SQL condition a row of its own meets).
MLFLOW_OWN_ROWS = {"experiments": "experiment_id = 0 and name = 'Default'", "workspaces": "name = 'default'"}
# How the refusal names rows of the tables a user fills (any other table: "N rows in TABLE").
LABELS = {"runs": "run", "experiments": "experiment", "registered_models": "registered model",
          "model_versions": "model version", "datasets": "dataset", "logged_models": "logged model",
          "trace_info": "trace"}


def sqlite_file(uri: str) -> Optional[Path]:
    """The database file of a `sqlite:///` URI (relative to the working directory), else None."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri[len("sqlite:///"):]).expanduser().resolve()


def _head_revision() -> Optional[str]:
    """The schema version this MLflow writes (its newest migration), None if it cannot say."""
    try:
        from mlflow.store.db.utils import _get_latest_schema_revision

        return _get_latest_schema_revision()
    except Exception:  # noqa: BLE001 - a private MLflow helper: without it, any version passes
        return None


def mlflow_schema() -> Optional[Tuple[Dict[str, FrozenSet[str]], Dict[str, FrozenSet[str]], FrozenSet[str]]]:
    """MLflow's own tables (name -> the columns MLflow's models and migrations ever gave it), its
    initial tables (name -> columns: what its first step makes) and its schema revisions, asked of this MLflow;
    None if it cannot say (then nothing is provably MLflow's, and nothing is rebuilt)."""
    try:
        from alembic.script import ScriptDirectory
        from mlflow.store.db.base_sql_model import Base
        from mlflow.store.db.utils import InitialBase, _get_alembic_config
        import mlflow.store.model_registry.dbmodels.models  # noqa: F401 - registers its tables on Base
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401 - registers the tracking tables on Base

        scripts = list(ScriptDirectory.from_config(_get_alembic_config("sqlite://")).walk_revisions())
        # Columns an older revision had and a later one renamed or dropped are named in the
        # migrations' own text: any quoted identifier there counts as a column MLflow once had.
        named = frozenset(w for s in scripts for w in re.findall(r"[\"']([a-z_][a-z0-9_]*)[\"']",
                                                                  Path(s.path).read_text()))
        tables: Dict[str, FrozenSet[str]] = {}
        for meta in (Base.metadata, InitialBase.metadata):
            for name, table in meta.tables.items():
                tables[name] = tables.get(name, frozenset()) | {c.name for c in table.columns} | named
        initial = {n: frozenset(c.name for c in t.columns) for n, t in InitialBase.metadata.tables.items()}
        return tables, initial, frozenset(s.revision for s in scripts)
    except Exception:  # noqa: BLE001 - MLflow's private layout: without it no file is MLflow's
        return None


def _lockers(db: Path, kind: str = "POSIX") -> List[int]:
    """The pids holding a lock of `kind` on the file, from /proc/locks (Linux): POSIX, SQLite's own
    locks; FLOCK, bertaccel's store lock file. [] when the system does not say. Waiters ("->")
    are not holders."""
    try:
        st = db.stat()
    except OSError:
        return []
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    return sorted({int(f[4]) for f in (line.split() for line in lines)
                   if len(f) > 5 and f[1] == kind and f[5] == key})


def holders(db: Path, kind: str = "POSIX") -> str:
    """Who holds the store locked ("pid 12 (sqlite3 app.db)", ...): the processes with a lock of
    `kind` on it, else those that have it open, besides this process; "another process" when the
    system does not say. A stopped holder (Ctrl-Z) is said to be stopped, with what ends the wait."""
    pids = [p for p in _lockers(db, kind) if p != os.getpid()]
    if not pids and kind == "POSIX":  # (every waiter has the lock file open too: not asked for FLOCK)
        for p in psutil.process_iter(["pid"]):
            try:
                if p.info["pid"] != os.getpid() and any(Path(f.path) == db for f in p.open_files()):
                    pids.append(p.info["pid"])
            except (psutil.Error, OSError):  # another user's process, or gone meanwhile
                continue
    named = []
    for pid in pids[:3]:
        try:
            proc = psutil.Process(pid)
            stopped = proc.status() == psutil.STATUS_STOPPED
            named.append(f"pid {pid} ({' '.join(' '.join(proc.cmdline()).split())[:60]})"
                         + (f", which is stopped (Ctrl-Z?): `kill -CONT {pid}` (or `fg` in its terminal) or end it"
                            if stopped else ""))
        except psutil.Error:
            named.append(f"pid {pid}")
    return ", ".join(named) if named else "another process"


SAY_WAIT_AFTER_S = 2.0  # a wait on the store's lock file this long is said, naming its holder


def flock_saying_who(fd: int, mode: int, lock: Path) -> None:
    """fcntl.flock(fd, mode), and while it waits longer than SAY_WAIT_AFTER_S, one line on stderr
    naming who holds the lock file, again whenever that changes. Why: a process stopped with
    Ctrl-Z while it holds the store's lock (it does while it opens or closes a run) holds up every
    bertaccel process on that store, and a silent wait looks like a hang. The wait itself stays
    the kernel's blocking flock (fair, no polling); a thread only watches, and only once the lock
    was found taken."""
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    got = threading.Event()

    def say() -> None:
        said = None
        while not got.wait(SAY_WAIT_AFTER_S if said is None else 1.0):
            who = holders(lock, "FLOCK")
            if who != said:
                print(f"waiting for the store's lock {lock}: held by {who}", file=sys.stderr, flush=True)
                said = who

    threading.Thread(target=say, name="bertaccel-store-lock-wait", daemon=True).start()
    try:
        fcntl.flock(fd, mode)
    finally:
        got.set()


def _tables(con: sqlite3.Connection) -> Dict[str, List[str]]:
    names = [r[0] for r in con.execute("select name from sqlite_master where type = 'table'")]
    return {n: [c[1] for c in con.execute(f'pragma table_info("{n}")')]
            for n in names if not n.startswith("sqlite_")}  # (sqlite_sequence: SQLite's own)


def _user_rows(con: sqlite3.Connection, tables: Dict[str, List[str]]) -> Dict[str, int]:
    """Rows per table that MLflow does not write itself when it makes a store."""
    found = {}
    for name in tables:
        if name == "alembic_version":
            continue
        own = MLFLOW_OWN_ROWS.get(name)
        n = con.execute(f'select count(*) from "{name}"' + (f" where not ({own})" if own else "")).fetchone()[0]
        if n:
            found[name] = n
    return found


def describe(rows: Dict[str, int]) -> str:
    """'2 experiments and 1 registered model but no runs', '12 runs, 1 experiment'."""
    def one(table: str, n: int) -> str:
        label = LABELS.get(table)
        return f"{n} {label}{'s' if n != 1 else ''}" if label else f"{n} rows in {table}"
    order = sorted(rows, key=lambda t: (t not in LABELS, list(LABELS).index(t) if t in LABELS else 0, t))
    parts = [one(t, rows[t]) for t in order[:4]] + (["..."] if len(order) > 4 else [])
    text = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return text + ("" if "runs" in rows else " but no runs")


def _mlflow_made(tables: Dict[str, List[str]], version: Optional[str], schema) -> bool:
    """Whether the tables are MLflow's own, as MLflow makes them (see the module's docstring)."""
    known, initial, revisions = schema
    if version is None:  # MLflow's first step (before any migration) makes its initial tables only
        return set(tables) <= set(initial) and all(set(cols) == initial[t] for t, cols in tables.items())
    if version not in revisions:
        return False
    for name, cols in tables.items():
        base = name[len(ALEMBIC_TMP):] if name.startswith(ALEMBIC_TMP) else name
        if name != "alembic_version" and (base not in known or not set(cols) <= known[base]):
            return False
    return True


def _read(db: Path, timeout: float) -> Tuple[str, str]:
    """sqlite_state of a SQLite file, read through a read-only connection."""
    con = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=timeout)
    try:
        tables = _tables(con)
        if not tables:  # (a program that marks its files marks them before any table: not ours)
            marks = [con.execute(f"pragma {p}").fetchone()[0] for p in ("application_id", "user_version")]
            return ("empty", "") if not any(marks) else ("foreign", "no tables, application_id/user_version set")
        version = ((con.execute("select version_num from alembic_version").fetchone() or [None])[0]
                   if "alembic_version" in tables else None)
        head = _head_revision()
        if version is not None and (head is None or version == head) and "runs" in tables:
            return "ok", ""  # the common case: no table scanned
        head = head or "unknown"
        schema = mlflow_schema()
        if schema is None or not _mlflow_made(tables, version, schema):
            if schema is not None and version is not None and version not in schema[2] \
                    and {"experiments", "runs"} <= set(tables):
                return "new_schema", f"schema {version}, which this MLflow (schema {head}) does not know"
            return "foreign", ", ".join(sorted(tables)[:6]) + (", ..." if len(tables) > 6 else "")
        rows = _user_rows(con, tables)
        if not rows:
            return "half_created", f"schema {version or 'none'}, {len(tables)} tables"
        return "old_schema", f"schema {version or 'none'} (this MLflow writes {head}) with {describe(rows)}"
    finally:
        con.close()


def _read_waiting(db: Path, wait_s: float):
    """_read, waiting for a write lock another client holds: quietly a moment, then saying so."""
    try:
        return _read(db, LOCK_QUIET_S)
    except sqlite3.OperationalError as e:
        if "locked" not in str(e):
            raise
    print(f"waiting up to {wait_s:g} s: {db} is locked by {holders(db)}", file=sys.stderr, flush=True)
    return _read(db, wait_s)


def holds_nothing(db: Path, wait_s: float = 1.0) -> bool:
    """Whether the file at db holds nothing anyone wrote: empty, a SQLite file without tables, or
    a store with only the rows MLflow writes when it makes one (no runs, no experiment of a user's).
    False for anything else, and for a file it cannot read within wait_s."""
    kind, _ = sqlite_state(db, wait_s)
    if kind == "empty":
        return True
    if kind not in ("ok", "half_created"):
        return False
    try:
        con = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=wait_s)
        try:
            return not _user_rows(con, _tables(con))
        finally:
            con.close()
    except sqlite3.Error:
        return False


def journal(db: Path) -> Path:
    """The rollback journal SQLite writes beside a store while it writes (MLflow's default mode)."""
    return db.with_name(db.name + "-journal")


def hot_journal(db: Path) -> bool:
    """Whether a write that failed or was stopped (a store made read-only or a disk full mid-write,
    a kill) may have left its journal beside db: present, not empty, its header not zeroed. SQLite
    rolls such a journal back on the next open that may write, never on a read-only one, so the
    store reads as broken until then although nothing in it is lost (roll_back). A journal of a
    write still in progress looks the same; SQLite tells them apart itself by its locks."""
    try:
        with open(journal(db), "rb") as f:
            return any(f.read(28))  # (SQLite zeroes the header of a journal it keeps: PERSIST mode)
    except OSError:
        return False


def roll_back(db: Path, wait_s: float) -> None:
    """Open db the way its owner's SQLite would (for writing) and read it: a hot journal is rolled
    back, which is SQLite's own recovery; a journal of a write in progress is left to its writer.
    Never creates the file (mode=rw). Raises sqlite3.Error as the open or the read does."""
    con = sqlite3.connect(f"{db.as_uri()}?mode=rw", uri=True, timeout=wait_s)
    try:
        con.execute("select count(*) from sqlite_master").fetchone()
    finally:
        con.close()


def sqlite_state(db: Path, wait_s: float = LOCK_WAIT_S) -> Tuple[str, str]:
    """What the file of a sqlite:/// store holds: (kind, detail). kind: missing | directory |
    not_file | empty | not_sqlite | unreadable | locked | foreign | half_created | old_schema |
    new_schema | ok. Only `empty` and `half_created` may be built over (nothing is lost); `ok` is used
    as it is. not_sqlite only where the file provably is no SQLite database (its header, or SQLite
    saying so); a read that fails otherwise (a hot journal a read-only open cannot roll back, a
    damaged page) is `unreadable`: the file may hold runs."""
    if not db.exists():
        return "missing", ""
    if db.is_dir():
        return "directory", ""
    if not db.is_file():
        return "not_file", ""
    if db.stat().st_size == 0:
        return "empty", ""
    try:
        with open(db, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError as e:
        return "not_file", e.strerror or str(e)
    if head != SQLITE_MAGIC:
        return "not_sqlite", repr(head[:8])
    started = time.monotonic()
    try:
        return _read_waiting(db, wait_s)
    except sqlite3.OperationalError as e:
        if "locked" in str(e):
            return "locked", f"by {holders(db)} for over {time.monotonic() - started:.0f} s"
        if "unable to open" in str(e):
            return "not_file", str(e)
        return "unreadable", str(e)
    except sqlite3.DatabaseError as e:  # "file is not a database" (SQLITE_NOTADB), or a damaged page
        return ("not_sqlite" if "not a database" in str(e) else "unreadable"), str(e)
