"""The MLflow store itself, apart from the runs in it (tracking.py): where a `sqlite:///` store
lives, whether a tracking URI can be used at all (one line saying why not, before any work),
one writer at a time (store_lock), and a SQLite store created whole or not at all.

Why creation is ours and not MLflow's: MLflow creates its ~30 tables and then runs its schema
migrations in place, in the store file itself, not in one transaction. A run that died in those
seconds (launcher.timeout_s, Ctrl-C, SIGKILL) left a file that every later run and report
refused ("table spans already exists", "out-of-date database schema"), for good. Here a new
store is built in a file beside the target and renamed into place (rename is atomic on POSIX),
so the store file is either absent or complete; a half-created store left by an older version
(no runs in it) is rebuilt the same way by the next run.
"""
from __future__ import annotations

import fcntl
import os
import socket
import sqlite3
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional, Tuple
from urllib.parse import urlparse

import psutil
from hydra.core.utils import env_override

from bertaccel.config import ConfigError

CHECK_TIMEOUT_S = 5.0  # how long the store check waits on a tracking server
SQLITE_MAGIC = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file
CREATING = ".creating-"  # infix of a store being built beside its target: <db>.creating-<pid>


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


def sqlite_state(db: Path) -> Tuple[str, str]:
    """What the file of a sqlite:/// store holds, read without writing (a read-only connection):
    (kind, detail). kind: missing | directory | not_file | empty | not_sqlite | foreign |
    half_created | old_schema | ok. An empty or half-created store holds no runs: nothing is lost
    by building it anew."""
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
    try:
        con = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=30)
        try:
            tables = {r[0] for r in con.execute("select name from sqlite_master where type = 'table'")}
            runs = con.execute("select count(*) from runs").fetchone()[0] if "runs" in tables else 0
            version = (con.execute("select version_num from alembic_version").fetchone() or [None])[0] \
                if "alembic_version" in tables else None
        finally:
            con.close()
    except sqlite3.DatabaseError as e:  # "file is not a database": a damaged file
        return "not_sqlite", str(e)
    if not tables:
        return "empty", ""
    if "experiments" not in tables and "alembic_version" not in tables:
        return "foreign", ", ".join(sorted(tables)[:5])
    head_rev = _head_revision()
    if version is not None and (head_rev is None or version == head_rev) and "runs" in tables:
        return "ok", ""
    if runs == 0:
        return "half_created", f"schema {version or 'none'}, {len(tables)} tables, no runs"
    return "old_schema", f"schema {version}, this MLflow writes {head_rev}"


def _sqlite_problem(uri: str, db: Path, create: bool) -> Optional[str]:
    kind, detail = sqlite_state(db)
    if kind == "ok":
        return None
    if kind == "missing":
        if not create:
            return f"{db} does not exist (nothing creates a store here); give the tracking.uri your runs wrote to"
        parent = next(p for p in db.parents if p.exists())
        if not parent.is_dir():
            return f"{parent} is a file, so {db} cannot be created; give a path in a folder"
        if not os.access(parent, os.W_OK | os.X_OK):
            return f"cannot create {db}: {parent} is not writable; give a path in a folder you can write"
        return None
    if kind == "directory":
        return f"{db} is a directory, not a database file; give a file in it, e.g. sqlite:///{db / 'mlflow.db'}"
    if kind == "not_file":
        return f"{db} is not a regular file{f' ({detail})' if detail else ''}; give a database file path"
    if kind in ("empty", "half_created"):
        if create:
            return None  # a run builds the store there (ensure_store)
        what = ("an empty file" if kind == "empty" else
                f"a store left half-created by a run stopped while MLflow made its tables ({detail})")
        return f"{db} is {what}, not an MLflow store with runs; any bertaccel.run on it makes it a store"
    if kind == "not_sqlite":
        return (f"{db} is not an MLflow store (not a SQLite database: {detail}); give the store your runs "
                "wrote to, or a new file name")
    if kind == "foreign":
        return (f"{db} is a SQLite database of something else (tables {detail}), not an MLflow store; "
                "give another file name")
    return (f"{db} was written by another MLflow version ({detail}); back it up, then "
            f"`mlflow db upgrade {uri}`")


def server_problem(uri: str, timeout_s: float = CHECK_TIMEOUT_S) -> Optional[str]:
    """Why the MLflow tracking server of an http(s) URI cannot be used ("unreachable (...)"), or
    None; None for any other kind of URI. Takes at most about 2 x timeout_s: without it a dead
    server costs minutes of MLflow's retries and then a long traceback."""
    parsed = urlparse(uri)
    if parsed.scheme not in ("http", "https"):
        return None
    host = parsed.hostname or ""
    try:
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        socket.create_connection((host, port), timeout=timeout_s).close()
    except (OSError, ValueError) as e:  # refused, timed out, unknown host; ValueError: a bad port
        why = getattr(e, "strerror", None) or str(e) or type(e).__name__
        return f"unreachable ({why})"
    # Something listens: one request of MLflow's own API, with MLflow's own settings for no retries
    # and a short timeout, set for this call only (the runs keep MLflow's retries for a blip).
    from mlflow.environment_variables import MLFLOW_HTTP_REQUEST_MAX_RETRIES, MLFLOW_HTTP_REQUEST_TIMEOUT
    from mlflow.tracking import MlflowClient

    with env_override({MLFLOW_HTTP_REQUEST_MAX_RETRIES.name: "0",
                       MLFLOW_HTTP_REQUEST_TIMEOUT.name: str(max(1, round(timeout_s)))}):
        try:
            MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
        except Exception as e:  # noqa: BLE001 - any answer but a good one: not a usable MLflow server
            text = str(e).strip().splitlines()
            return f"unreachable as an MLflow tracking server ({(text[0] if text else type(e).__name__)[:300]})"
    return None


def _scheme_problem(uri: str) -> Optional[str]:
    """A URI whose scheme MLflow has no store for (foo://bar), asked of MLflow's own registry."""
    try:
        from mlflow.tracking._tracking_service.utils import _tracking_store_registry

        schemes = sorted(s for s in _tracking_store_registry._registry if s)
    except Exception:  # noqa: BLE001 - a private MLflow table: without it MLflow's own error stands
        return None
    scheme = urlparse(uri).scheme
    if uri in ("databricks", "databricks-uc", "uc") or scheme in schemes:
        return None
    if not scheme:
        return f"'{uri}' is not a tracking URI (no scheme); give e.g. sqlite:///mlflow.db or http://HOST:PORT"
    return f"MLflow has no store for the scheme '{scheme}:'; use one of {', '.join(schemes)}"


def store_problem(uri: str, *, create: bool) -> Optional[str]:
    """Why `uri` cannot be used as this command's MLflow store, in one line, or None. create:
    the command may make the store (a run: a missing or empty sqlite file is fine); otherwise it
    reads one (report, plan), which must exist and hold MLflow's tables. Writes nothing."""
    if not isinstance(uri, str) or not uri.strip():
        return "no tracking URI given; give e.g. sqlite:///mlflow.db"
    db = sqlite_file(uri)
    if db is not None:
        return _sqlite_problem(uri, db, create)
    if uri.startswith("sqlite:"):
        return f"'{uri}' is not a SQLite store URI; a file is sqlite:///relative/path.db or sqlite:////abs/path.db"
    return _scheme_problem(uri) or server_problem(uri)


def store_refusal(uri: str) -> Optional[str]:
    """Why a run's tracking.uri cannot be used (one line, store_problem with a hint), or None.
    Writes nothing (bertaccel.plan validates with it); the run repairs a half-created store (repair_store)."""
    why = store_problem(uri, create=True)
    if not why:
        return None
    hint = ("; start the tracking server (mlflow server --host ... --port ...) or use "
            "tracking.uri=sqlite:///mlflow.db (a local file, no server)") if "unreachable" in why else ""
    return f"tracking.uri={uri}: {why}{hint}"


def check_store(uri: str) -> None:
    """store_refusal as a ConfigError, for a caller that stops on it (exit_if_store_unusable)."""
    why = store_refusal(uri)
    if why:
        raise ConfigError(why)


def _build_store(db: Path) -> None:
    """A complete MLflow store at `db`, built in a file beside it and renamed over it. Called
    with the store's lock held. Interrupted (an exception, a signal): the file beside is removed
    and `db` is as it was; killed: `db` is as it was, the file beside is left and removed by the
    next build."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    for stale in db.parent.glob(f"{db.name}{CREATING}*"):
        pid = stale.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or not psutil.pid_exists(int(pid)):
            stale.unlink(missing_ok=True)
    tmp = db.with_name(f"{db.name}{CREATING}{os.getpid()}")
    try:
        store = SqlAlchemyStore(f"sqlite:///{tmp}", (db.parent / "mlartifacts").as_uri())
        store.engine.dispose()  # every connection to the file beside is closed before the rename
        os.replace(tmp, db)
    finally:
        tmp.unlink(missing_ok=True)


_held = threading.local()


@contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Serialize access to one SQLite store across processes, and make sure the store exists.

    SQLite allows one writer at a time and MLflow's retries give up under contention, so
    parallel sweeps on one `sqlite:///` store take an exclusive flock on `<db>.lock` around
    every store call. Re-entrant within a thread; another thread of the same process waits like
    another process (a separate open of the lock file). The first holder after the file is gone
    or empty builds the store (_build_store). Other stores (a tracking server) serialize
    themselves: no lock.
    """
    if not uri.startswith("sqlite:///") or getattr(_held, "depth", 0):
        _held.depth = getattr(_held, "depth", 0) + 1
        try:
            yield
        finally:
            _held.depth -= 1
        return
    db = sqlite_file(uri)
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        _held.depth = 1
        try:
            # (a stat per call; the table read only while the file is missing or empty)
            if not (db.is_file() and db.stat().st_size > 0):
                _build_store(db)
            yield
        finally:
            _held.depth = 0
            fcntl.flock(f, fcntl.LOCK_UN)


def repair_store(uri: str) -> None:
    """Rebuild a half-created sqlite:/// store (no runs in it: nothing is lost) before a run or a
    sweep uses it; a missing or empty one is built by the first store_lock."""
    db = sqlite_file(uri)
    if db is None:
        return
    if sqlite_state(db)[0] == "half_created":
        with store_lock(uri):
            if sqlite_state(db)[0] == "half_created":  # (another process may have built it meanwhile)
                _build_store(db)


def exit_if_store_unusable(uri: str) -> None:
    """check_store for a sweep, before its parent run is opened: one line on stderr and exit 2
    (an exception there would reach Hydra, which prints a traceback)."""
    try:
        check_store(uri)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
