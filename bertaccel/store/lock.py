"""One writer at a time on a `sqlite:///` store (store_lock), and the store created whole or not at all
(_build_store, repair_store).

Why creation is ours and not MLflow's: MLflow creates its ~30 tables and then runs its schema
migrations in place, in the store file itself, not in one transaction. A run that died in those
seconds (launcher.timeout_s, Ctrl-C, SIGKILL) left a file that every later run and report
refused ("table spans already exists", "out-of-date database schema"), for good. Here a new
store is built in a file beside the target and renamed into place (rename is atomic on POSIX),
so the store file is either absent or complete; a half-created store left by an older version
is rebuilt the same way by the next run, and only a file that is provably that (MLflow's own
tables holding nothing: file.py): a file bertaccel did not make is refused, never rebuilt.
"""
from __future__ import annotations

import fcntl
import os
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

import psutil

from bertaccel.store.file import flock_saying_who, sqlite_file, sqlite_state
from bertaccel.store.keep import check_kept, is_kept, no_empty_in_place

CREATING = ".creating-"  # infix of a store being built beside its target: <db>.creating-<pid>


def lock_held() -> bool:
    """Whether this thread holds the store lock now (a nested store_lock is then a no-op)."""
    return bool(getattr(_held, "depth", 0))


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
    a writer holding it past the busy timeout is a locked store, file.py).

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
    db = None if depth else sqlite_file(uri)  # (None: not a sqlite:/// store, or held already)
    if db is None:
        if depth and not shared and getattr(_held, "shared", False):
            raise RuntimeError("store_lock: a write inside a shared (read) hold of the store lock")
        _held.depth = depth + 1
        try:
            yield
        finally:
            _held.depth -= 1
        return
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
    """Rebuild a half-created sqlite:/// store (provably MLflow's, with nothing in it: file.py)
    or an SQLite file without tables before a run or a sweep uses it; a missing or 0-byte one is
    built by the first store_lock. Nothing else is ever built over: the checks refuse it first."""
    db = sqlite_file(uri)
    if db is None:
        return
    if sqlite_state(db)[0] in ("half_created", "empty"):
        with store_lock(uri):
            if sqlite_state(db)[0] in ("half_created", "empty"):  # (another process may have built it meanwhile)
                _build_store(db)
