"""Whether a tracking URI can be used as a command's MLflow store at all, apart from the runs in it
(record/tracking.py): one line saying why not, before any work (store_problem, store_refusal).
Writes nothing but a journal roll-back under the store's lock (lock.py)."""
from __future__ import annotations

import os
import socket
import sqlite3
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Optional
from urllib.parse import urlparse

from bertaccel.config import ConfigError
from bertaccel.hydra_adapter import env_override
from bertaccel.store.file import LOCK_WAIT_S, hot_journal, journal, roll_back, sqlite_file, sqlite_state
from bertaccel.store.keep import StoreLost
from bertaccel.store.lock import lock_held, store_lock

CHECK_TIMEOUT_S = 5.0  # how long the store check waits on a tracking server


def _read_only(db: Path) -> Optional[str]:
    """Why a run cannot write the store at `db` (it exists), or None. os.access says what this
    process may do: a read-only mount (EROFS) stops root too, a mode without write bits does not."""
    lock = db.with_name(db.name + ".lock")
    if not os.access(db, os.W_OK):
        what = f"{db} is read-only"
    elif not os.access(db.parent, os.W_OK | os.X_OK):
        what = f"{db.parent} is read-only (SQLite writes its journal beside the store, bertaccel its lock file)"
    elif lock.exists() and not os.access(lock, os.W_OK):
        what = f"{lock} (the store's lock file) is read-only"
    else:
        return None
    return (f"{what}: a run writes its results into the store; give a store you can write, e.g. a copy "
            f"of it in a folder you can write (cp {db} DIR/ and tracking.uri=sqlite:///DIR/{db.name})")


def _roll_back_journal(db: Path) -> Optional[str]:
    """A hot journal beside the store rolled back, as SQLite does when its owner opens the file,
    under the store's lock (no bertaccel writer is mid-write then), before the store is judged: a
    read-only look cannot roll it back and would call an intact store broken. Where it cannot be
    (the file or its folder read-only), the line saying so, else None."""
    if not hot_journal(db):
        return None
    if not os.access(db, os.W_OK) or not os.access(db.parent, os.W_OK | os.X_OK):
        what = db if not os.access(db, os.W_OK) else db.parent
        return (f"{db} holds a write that failed or was stopped ({journal(db).name} beside it), which SQLite "
                f"undoes on the next open that may write, but {what} is read-only; make it writable again "
                f"(chattr -i, chmod u+w), then run the same command: the store is then as before that write")
    try:
        with store_lock(f"sqlite:///{db}", tidy=True) if not lock_held() else nullcontext():
            roll_back(db, LOCK_WAIT_S)
    except StoreLost:
        return None  # (the store's next call says it, as one line of the sweep)
    except (OSError, sqlite3.Error) as e:
        if "locked" in str(e):
            return None  # (a write in progress, not a failed one: judged as a locked store)
        return (f"{db} holds a write that failed or was stopped ({journal(db).name} beside it), and SQLite could "
                f"not undo it ({e}); make the file and its folder writable, then run the same command again")
    return None


def _sqlite_problem(uri: str, db: Path, create: bool) -> Optional[str]:
    why = _roll_back_journal(db) if db.is_file() else None
    if why:
        return why
    kind, detail = sqlite_state(db)
    if kind in ("ok", "empty", "half_created") and create:
        return _read_only(db)  # (a run builds an empty or half-created store there: repair_store)
    if kind == "ok":
        return None
    if kind == "missing":
        if not create:
            return f"{db} does not exist (nothing creates a store here); give the tracking.uri your runs wrote to"
        parent = next(p for p in db.parents if p.exists())
        if not parent.is_dir():
            return f"{parent} is a file, so {db} cannot be created; give a path in a folder"
        if not os.access(parent, os.W_OK | os.X_OK):
            return f"cannot create {db}: {parent} is read-only; give a path in a folder you can write"
        return None
    if kind == "directory":
        return f"{db} is a directory, not a database file; give a file in it, e.g. sqlite:///{db / 'mlflow.db'}"
    if kind == "not_file":
        return f"{db} is not a regular file{f' ({detail})' if detail else ''}; give a database file path"
    if kind in ("empty", "half_created"):
        what = ("an empty file" if kind == "empty" else
                f"a half-created or empty MLflow store ({detail}, nothing in them but what MLflow makes "
                "itself: a run stopped while MLflow made its tables leaves one)")
        return f"{db} is {what}, not an MLflow store with runs; any bertaccel.run on it makes it a store"
    if kind == "not_sqlite":
        return (f"{db} is not an MLflow store (not a SQLite database: {detail}); give the store your runs "
                "wrote to, or a new file name")
    if kind == "unreadable":  # (may hold runs: never called no store, nor another file advised)
        return (f"{db} could not be read ({detail}); bertaccel leaves it as it is: see what SQLite says of it "
                f"(sqlite3 {db} 'pragma integrity_check'), then run again")
    if kind == "locked":
        return (f"{db} is locked {detail}: another client holds a write transaction on this store (it is "
                "in use, not broken); let it finish or stop it, then run again")
    if kind == "foreign":
        return (f"{db} is a SQLite database of something else (tables {detail}), not an MLflow store; "
                "bertaccel leaves it as it is: give another file name")
    if kind == "new_schema":
        return (f"{db} was written by a newer MLflow ({detail}); use that MLflow version with it "
                "(pip install -U mlflow)")
    return f"{db} is an MLflow store of {detail}; back it up, then `mlflow db upgrade {uri}`"


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


KINDS = ("a SQLite file (sqlite:///mlflow.db), an MLflow tracking server (http://HOST:PORT) or a database "
         "MLflow writes itself ({})")  # the stores a run, a sweep, the plan and the report use


def _scheme_problem(uri: str) -> Optional[str]:
    """A URI of a kind no command can use, in one line naming the kinds it can: a scheme MLflow
    has no store for (foo://bar, asked of MLflow's own registry), or MLflow's file store (file:,
    a folder of runs), which this MLflow refuses (maintenance mode) after the run's folder is made."""
    try:
        from mlflow.tracking._tracking_service.utils import _tracking_store_registry

        schemes = sorted(s for s in _tracking_store_registry._registry if s and s != "file")
    except Exception:  # noqa: BLE001 - a private MLflow table: without it MLflow's own error stands
        return None
    scheme = urlparse(uri).scheme
    kinds = KINDS.format(", ".join(f"{s}:" for s in schemes if s not in ("sqlite", "http", "https")))
    if scheme == "file":
        rest = uri.split(":", 1)[1]
        folder = rest[2:] if rest.startswith("//") else rest  # (file:///abs, file:relative)
        return (f"MLflow's file store (a folder of runs) is not a store bertaccel uses; give {kinds}. Runs already "
                f"in it move to a SQLite file with `mlflow migrate-filestore --source {folder or '.'} "
                "--target sqlite:///mlflow.db`")
    if uri in ("databricks", "databricks-uc", "uc") or scheme in schemes:
        return None
    if not scheme:
        return f"'{uri}' is not a tracking URI (no scheme); give {kinds}"
    return f"MLflow has no store for the scheme '{scheme}:'; give {kinds}"


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


def exit_if_store_unusable(uri: str) -> None:
    """check_store for a sweep, before its parent run is opened: one line on stderr and exit 2
    (an exception there would reach Hydra, which prints a traceback)."""
    try:
        check_store(uri)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
