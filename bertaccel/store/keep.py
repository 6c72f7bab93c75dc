"""The store a sweep writes to stays the file it is now (keep_store), in the sweep's process and
the run processes it starts: its runs and its parent run are in that file, and a new empty store
made in its place (what store_lock does for a missing file) would take the rest of the sweep
without a word. So while a store is kept, store_lock (lock.py) neither makes a store where it
went nor writes to another file put in its place: check_kept raises StoreLost, which
record/store_failure.py turns into the sweep's one line and its stop.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from bertaccel.context import KeptStore, current, update
from bertaccel.store.file import holds_nothing, sqlite_file


class StoreLost(Exception):
    """The store a sweep writes to was deleted or replaced while it ran (keep_store)."""


def _identity(db: Path) -> str:
    st = db.stat()
    return f"{st.st_dev}:{st.st_ino}"


def kept(uri: Optional[str]) -> Optional[KeptStore]:
    """The sqlite:/// store of `uri` as the file it is now (None: no uri, not a sqlite file, no file yet)."""
    db = sqlite_file(uri) if uri else None
    return KeptStore(str(db), _identity(db)) if db is not None and db.is_file() else None


def keep_store(uri: Optional[str]) -> None:
    """From now on (None: no longer), in this process and the processes it starts (the run
    context, bertaccel/context.py), the sqlite:/// store of `uri` must stay the file it is now: a
    sweep's runs and its parent run are in it, and a new empty store made in its place (what
    store_lock does for a missing file) would take the rest of the sweep without a word."""
    update(kept_store=kept(uri))


def _kept_identity(db: Path) -> Optional[str]:
    """The identity keep_store recorded for db, or None if db is not the kept store."""
    held = current().kept_store
    return held.identity if held is not None and held.db == str(db) else None


def _made_in_its_place(db: Path, identity: str) -> bool:
    """Whether the file at db (there, not the kept one) is one our own processes made after the
    kept store was deleted, in the moment between a hold's check and its query: a pooled SQLite
    connection opening the path makes an empty file (or one with only a header), and MLflow's
    store set-up on a new client a fresh store with none of the sweep's runs. Either holds
    nothing; a file someone put there (a backup put back) holds runs."""
    return db.stat().st_size == 0 or (_identity(db) != identity and holds_nothing(db))


def check_kept(db: Path) -> None:
    """StoreLost if `db` is the store keep_store keeps and it is gone or another file now."""
    identity = _kept_identity(db)
    if identity is None:
        return
    if not db.exists() or _made_in_its_place(db, identity):
        raise StoreLost(f"the store {db} was deleted while the sweep ran; a new one is not made in its place (the "
                        "sweep's runs are not in it): put the file back, or give another tracking.uri=, then run the "
                        "same command again")
    if _identity(db) != identity:
        raise StoreLost(f"the store {db} was replaced by another file while the sweep ran; nothing more is written "
                        "to it: if it is the store you mean, run the same command again (it resumes there)")


def is_kept(db: Path) -> bool:
    return _kept_identity(db) is not None


def no_empty_in_place(db: Path, kept: bool) -> None:
    """At the end of a hold of the kept store: if it was deleted during the hold and our own
    processes made a file in its place that holds nothing (_made_in_its_place), that file is not
    left there (the next check says deleted)."""
    identity = _kept_identity(db) if kept else None
    if identity is not None and db.is_file() and _made_in_its_place(db, identity):
        db.unlink(missing_ok=True)
