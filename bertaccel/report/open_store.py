"""python -m bertaccel.report.open_store: open a committed or moved store in the MLflow UI, with
its sweeps' reports in their parent runs' Artifacts tab.

    python -m bertaccel.report.open_store docs/results/stores/h200-card-repeats.db.gz --to card-repeats
    python -m bertaccel.report.open_store moved/mlflow.db      # a store moved with its mlartifacts/

A `.db.gz` (the stores the docs ship) is unpacked into the folder --to names (new or empty; default:
the store's name in the current directory) as `mlflow.db`; a `.db` is opened where it is. Then every
artifact location the store recorded on the machine that measured it is pointed at the
`mlartifacts/` beside it (record/relocate.py), and each sweep whose parent run has no report there
gets one, built from the store's own runs with this version's report (report/sweep_report.py).
It ends with the one command to start the UI and the address to open.
"""
from __future__ import annotations

import gzip
import shutil
import sys
from pathlib import Path
from typing import List, Optional

from .args import OneLineParser
from .data import ReportInputError

EXPERIMENT = "bertaccel"


def _unpack(store: Path, to: Optional[str]) -> Path:
    folder = Path(to) if to else Path.cwd() / store.name.removesuffix(".db.gz")
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ReportInputError(f"--to {folder}: exists and is not an empty folder; name a new one")
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / "mlflow.db"
    try:
        with gzip.open(store) as src, db.open("wb") as dst:
            shutil.copyfileobj(src, dst)
    except OSError as e:
        shutil.rmtree(folder, ignore_errors=True)  # (nothing half-written)
        raise ReportInputError(f"{store}: not a gzipped store ({e})") from None
    return db


def attach_missing(uri: str, experiment: str = EXPERIMENT) -> List[str]:
    """Attach a report to every sweep parent run without one; what each attach said."""
    from bertaccel.record.access import has_local_artifact, sweep_parents
    from bertaccel.context import SweepContext

    from .sweep_report import ARTIFACT_DIR, attach_report

    said = []
    for parent in sweep_parents(uri, experiment):
        sweep = parent.data.tags.get("sweep_id", "")
        if sweep and not has_local_artifact(uri, parent.info.run_id, ARTIFACT_DIR, "report.html"):
            said.append(f"sweep {sweep}: " + attach_report(SweepContext(sweep, parent.info.run_id, uri=uri), experiment))
    return said


def main(argv: Optional[List[str]] = None) -> int:
    from bertaccel.record.relocate import relocate

    ap = OneLineParser(prog="python -m bertaccel.report.open_store",
                       description="Open a committed (.db.gz) or moved (.db) store for the MLflow UI.")
    ap.add_argument("store", help="a .db.gz the docs ship, or a moved store's mlflow.db")
    ap.add_argument("--to", help="the folder a .db.gz is unpacked into (default: its name, here)")
    ap.add_argument("--experiment", default=EXPERIMENT)
    a = ap.parse_args(argv)
    store = Path(a.store)
    try:
        if not store.is_file():
            raise ReportInputError(f"{store}: no such file; give a .db.gz from docs/results/stores/ or a mlflow.db")
        unpacked = store.name.endswith(".db.gz")
        if unpacked:
            db = _unpack(store, a.to)
        elif a.to:
            raise ReportInputError(f"--to {a.to}: only a .db.gz is unpacked; a .db is opened where it is")
        else:
            db = store
        moved = relocate(db, everything=unpacked)
    except ReportInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    uri = f"sqlite:///{db.resolve()}"
    print(f"{db}: {moved.runs} run(s) pointed at {moved.root}")
    for line in attach_missing(uri, a.experiment):
        print(line)
    from bertaccel.record.access import experiment_id

    exp = experiment_id(uri, a.experiment)
    print(f"open it: mlflow ui --backend-store-uri {uri}")
    if exp is not None:
        print(f"then: http://127.0.0.1:5000/#/experiments/{exp}/runs?workflowType=machine_learning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
