"""The MLflow store itself, apart from the runs in it (record/tracking.py): whether a tracking URI
can be used at all (one line saying why not, before any work), one writer at a time (store_lock),
and a SQLite store created whole or not at all. Where a `sqlite:///` store's file is and what it
holds: store_file.py; the store a sweep writes to staying that file: store_keep.py.

Why creation is ours and not MLflow's: MLflow creates its ~30 tables and then runs its schema
migrations in place, in the store file itself, not in one transaction. A run that died in those
seconds (launcher.timeout_s, Ctrl-C, SIGKILL) left a file that every later run and report
refused ("table spans already exists", "out-of-date database schema"), for good. Here a new
store is built in a file beside the target and renamed into place (rename is atomic on POSIX),
so the store file is either absent or complete; a half-created store left by an older version
is rebuilt the same way by the next run, and only a file that is provably that (MLflow's own
tables holding nothing: store_file.py): a file bertaccel did not make is refused, never rebuilt.
"""
from __future__ import annotations

import fcntl
import os
import socket
import sqlite3
import sys
import threading
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Iterator, List, Optional, Tuple
from urllib.parse import urlparse

import psutil
from hydra.core.utils import env_override

from bertaccel.config import ConfigError
from bertaccel.store_file import LOCK_WAIT_S, flock_saying_who, hot_journal, journal, roll_back, sqlite_file
from bertaccel.store_file import sqlite_state  # noqa: F401 - what a store's file holds (one home: store_file.py)
from bertaccel.store_keep import StoreLost, check_kept, is_kept, no_empty_in_place

CHECK_TIMEOUT_S = 5.0  # how long the store check waits on a tracking server
CREATING = ".creating-"  # infix of a store being built beside its target: <db>.creating-<pid>


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
        with store_lock(f"sqlite:///{db}", tidy=True) if not getattr(_held, "depth", 0) else nullcontext():
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


def _missing_folders(folder: Path) -> List[Path]:
    """The folders from `folder` up that do not exist yet, deepest first."""
    missing: List[Path] = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def _open_lock(lock: Path, shared: bool) -> Tuple[Optional[int], bool]:
    """(descriptor of the lock file, whether this call created it). A reader (shared) that can
    neither create nor open it for writing opens it read-only (flock needs no write access), and
    gets None where it cannot open it at all: a read-only folder that holds no lock file."""
    try:
        return os.open(lock, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o666), True
    except FileExistsError:
        pass
    except OSError:
        if not shared:
            raise
    try:
        return os.open(lock, os.O_WRONLY | os.O_APPEND), False
    except OSError:
        if not shared:
            raise
    try:
        return os.open(lock, os.O_RDONLY), False
    except OSError:
        return None, False


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _exclusive_now(fd: int) -> bool:
    """Whether this holder has the lock file to itself now (a reader that shares it does not)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False


@contextmanager
def store_lock(uri: str, shared: bool = False, tidy: bool = False) -> Iterator[None]:
    """Serialize access to one SQLite store across processes, and make sure the store exists.

    SQLite allows one writer at a time and MLflow's retries give up under contention, so
    parallel sweeps on one `sqlite:///` store take an exclusive flock on `<db>.lock` around
    every store call. Re-entrant within a thread; another thread of the same process waits like
    another process (a separate open of the lock file). The first holder after the file is gone
    or empty builds the store (_build_store). Other stores (a tracking server) serialize
    themselves: no lock.

    shared: a read (report, plan, a run's look-ups) of a store that exists: a shared flock, so
    readers do not wait on each other, only on writers. Where the reader cannot open the lock
    file at all (a read-only folder without one, or one it may not read) it reads without it.
    That is safe: every bertaccel writer creates and holds the lock file before it writes, so
    where none exists and none can be made, no bertaccel writer is writing; another client's
    writes are SQLite's own business (its file locks make each read see a whole transaction;
    a writer holding it past the busy timeout is a locked store, store_file.py).

    A lock file this call created is removed again, holding it exclusively, when no store came
    of it (a run refused or stopped before the store was made leaves neither; so is a folder it
    made for the store) or when the call only read (report and plan leave nothing beside the
    store; one another process holds stays). That is safe because every holder checks, once it
    holds the lock, that the lock file it holds is still the one at the path, and takes the new
    one otherwise. A lock file beside a store is harmless: empty, never read, and its flock
    ends with its holder's process, a killed one's too. tidy: an exclusive hold that leaves no
    lock file of its making either (a report's or plan's journal roll-back, _roll_back_journal).
    """
    depth = getattr(_held, "depth", 0)
    if not uri.startswith("sqlite:///") or depth:
        if depth and not shared and getattr(_held, "shared", False):
            raise RuntimeError("store_lock: a write inside a shared (read) hold of the store lock")
        _held.depth = depth + 1
        try:
            yield
        finally:
            _held.depth -= 1
        return
    db = sqlite_file(uri)
    check_kept(db)  # (before the folder is made: one deleted with the store is not made again either)
    shared = shared and db.is_file() and db.stat().st_size > 0  # (a store to build takes the exclusive lock)
    lock = db.with_name(db.name + ".lock")
    made = [] if shared else _missing_folders(db.parent)
    while True:
        if not shared:
            db.parent.mkdir(parents=True, exist_ok=True)
        fd, created = _open_lock(lock, shared)
        if fd is None:
            break
        try:
            flock_saying_who(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX, lock)
        except BaseException:
            os.close(fd)
            raise
        if _same_file(fd, lock):
            break
        os.close(fd)  # its maker removed it meanwhile (no store came of it): lock the one there now
    _held.depth, _held.shared = 1, shared
    kept = False
    try:
        check_kept(db)
        kept = is_kept(db)
        # (a stat per call; the table read only while the file is missing or empty)
        if not shared and not (db.is_file() and db.stat().st_size > 0):
            _build_store(db)
        yield
    finally:
        _held.depth, _held.shared = 0, False
        no_empty_in_place(db, kept)
        if fd is not None:
            try:
                if created and (shared or tidy or not db.exists()) and _exclusive_now(fd):
                    lock.unlink(missing_ok=True)
                    for folder in made:  # (deepest first; one something else was put in stays)
                        try:
                            folder.rmdir()
                        except OSError:
                            break
            finally:
                os.close(fd)  # (closing releases the flock)


def repair_store(uri: str) -> None:
    """Rebuild a half-created sqlite:/// store (provably MLflow's, with nothing in it: store_file.py)
    or an SQLite file without tables before a run or a sweep uses it; a missing or 0-byte one is
    built by the first store_lock. Nothing else is ever built over: the checks refuse it first."""
    db = sqlite_file(uri)
    if db is None:
        return
    if sqlite_state(db)[0] in ("half_created", "empty"):
        with store_lock(uri):
            if sqlite_state(db)[0] in ("half_created", "empty"):  # (another process may have built it meanwhile)
                _build_store(db)


def exit_if_store_unusable(uri: str) -> None:
    """check_store for a sweep, before its parent run is opened: one line on stderr and exit 2
    (an exception there would reach Hydra, which prints a traceback)."""
    try:
        check_store(uri)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
