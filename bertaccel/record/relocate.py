"""A store that moved: its runs' artifacts pointed at the `mlartifacts/` folder beside it.

MLflow records each run's artifact location as an absolute path (`file:///tmp/w3/mlartifacts/1/
<run>/artifacts`) when the run is created, so a store copied to another machine or folder, with
its `mlartifacts/` beside it, shows "No Artifacts Recorded" in the MLflow UI: the recorded path
is the measuring machine's. MLflow has no command to re-point them; this does it in the store's
own tables (experiments.artifact_location, runs.artifact_uri), under the store's lock, keeping
what follows `mlartifacts/` (or `<experiment id>/<run id>/artifacts`): every local location of a
store just unpacked (it owns nothing elsewhere: everything=True); else each local location outside
the store's folder that no longer exists, or whose copy beside the store does (a store copied with
its mlartifacts/ reads its own copy). Remote locations (s3:, a tracking server's mlflow-artifacts:)
and artifacts kept on purpose elsewhere (present there, absent beside the store) are left as they are.
"""
from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Tuple
from urllib.parse import unquote, urlparse

from bertaccel.store import store_lock

FOLDER = "mlartifacts"  # where MLflow keeps a sqlite store's artifacts by default, beside it
_TAIL = re.compile(r"(?:^|/)mlartifacts/(.+)$")


@dataclass(frozen=True)
class Relocated:
    experiments: int   # experiment artifact locations re-pointed
    runs: int          # run artifact locations re-pointed
    root: Path         # the mlartifacts/ folder they point into now


def _local(uri: str) -> Optional[Path]:
    """The local path a file: (or plain) location names; None for a remote one."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return Path(unquote(parsed.path))
    return None


def _moved(uri: str, root: Path, fallback: str, everything: bool) -> Optional[str]:
    """uri re-pointed under root, or None where it stays (see the module's rule)."""
    path = _local(uri)
    if path is None:
        return None
    m = _TAIL.search(path.as_posix())
    new = root / (m.group(1) if m else fallback)
    if path == new:
        return None
    if everything or not path.exists() or new.exists():
        return new.as_uri()
    return None


def relocate(db: Path, everything: bool = False) -> Relocated:
    """Re-point the artifact locations of the SQLite store `db` at `<db's folder>/mlartifacts`;
    everything: every local one (a store just unpacked), else by the module's rule."""
    root = db.resolve().parent / FOLDER
    uri = f"sqlite:///{db.resolve()}"
    with store_lock(uri), sqlite3.connect(db) as con:
        experiments = _rewrite(con, "experiments", "experiment_id", "artifact_location", root, lambda key: str(key),
                               everything)
        runs = _rewrite(con, "runs", "run_uuid", "artifact_uri", root, None, everything)
    return Relocated(experiments, runs, root)


def _rewrite(con: sqlite3.Connection, table: str, key: str, column: str, root: Path,
             tail: Optional[Callable[[Any], str]], everything: bool) -> int:
    changed = 0
    rows = con.execute(f"select {key}, {column}{', experiment_id' if table == 'runs' else ''} from {table}").fetchall()
    for row in rows:
        ident, location = row[0], row[1]
        if not location:
            continue
        fallback = tail(ident) if tail else f"{row[2]}/{ident}/artifacts"
        new = _moved(location, root, fallback, everything)
        if new is not None and new != location:
            con.execute(f"update {table} set {column} = ? where {key} = ?", (new, ident))
            changed += 1
    return changed


def repoint_experiment(db: Path, experiment_id: int, old: str, new: str) -> None:
    """One experiment moved from location `old` to `new`, its runs with it, in one transaction
    (record/tracking.py, when a run is made in a store moved with its mlartifacts/: the caller
    holds the store's lock). Raises sqlite3.Error where the store cannot be written."""
    old = old.rstrip("/")
    con = sqlite3.connect(db, timeout=30)
    try:
        with con:
            con.execute("update experiments set artifact_location = ? where experiment_id = ? and artifact_location = ?",
                        (new, experiment_id, old))
            con.execute("update experiments set artifact_location = ? where experiment_id = ? and artifact_location = ?",
                        (new, experiment_id, old + "/"))
            con.execute("update runs set artifact_uri = ? || substr(artifact_uri, ?) where experiment_id = ? "
                        "and substr(artifact_uri, 1, ?) = ?", (new, len(old) + 1, experiment_id, len(old) + 1, old + "/"))
    finally:
        con.close()


def counts(db: Path) -> Tuple[int, int]:
    """(experiments, runs) in the store: what relocate looked at."""
    with sqlite3.connect(db) as con:
        return (con.execute("select count(*) from experiments").fetchone()[0],
                con.execute("select count(*) from runs").fetchone()[0])
