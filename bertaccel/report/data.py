"""Rows for the report: from an MLflow experiment (optionally one sweep) or from a CSV file."""
from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import List, Optional

from .scoring import Row

CSV_COLUMNS = ("name", "time_s", "cost_usd", "energy_kwh", "occupancy_pct", "accuracy")
OPTIONAL_COLUMNS = ("hardware", "precision")
# MLflow metric for each report column.
MLFLOW_METRICS = {"time_s": "train_time_s", "cost_usd": "cost_usd", "energy_kwh": "energy_kwh",
                  "occupancy_pct": "occupancy_pct", "accuracy": "test_accuracy"}


class ReportInputError(ValueError):
    """Bad report input; the message is the one line the user sees."""


def _number(text: str, where: str) -> Optional[float]:
    text = text.strip()
    if text == "" or text.lower() in ("null", "none", "nan", "n/a"):
        return None
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        raise ReportInputError(f"{where}: {text!r} is not a number (leave the cell empty for 'not measured')") from None
    if not math.isfinite(value):
        raise ReportInputError(f"{where}: {text!r} is not a finite number")
    return value


def rows_from_csv(path: str) -> List[Row]:
    p = Path(path)
    if not p.is_file():
        raise ReportInputError(f"--csv {path}: no such file")
    text = p.read_text(encoding="utf-8-sig")
    reader = csv.DictReader(io.StringIO(text))
    header = [h.strip() for h in (reader.fieldnames or [])]
    missing = [c for c in CSV_COLUMNS if c not in header]
    if missing:
        raise ReportInputError(f"--csv {path}: missing column(s) {', '.join(missing)}; the header must have "
                               f"{','.join(CSV_COLUMNS)} (optional: {','.join(OPTIONAL_COLUMNS)})")
    rows = []
    for lineno, raw in enumerate(reader, start=2):
        if None in raw or any(v is None for v in raw.values()):  # DictReader's marks for extra / missing fields
            raise ReportInputError(f"--csv {path} line {lineno}: expected {len(header)} fields")
        rec = {k.strip(): v for k, v in raw.items()}
        name = rec["name"].strip()
        if not name:
            raise ReportInputError(f"--csv {path} line {lineno}: empty name")
        rows.append(Row(name=name, **{c: _number(rec[c], f"--csv {path} line {lineno} column {c}")
                                      for c in CSV_COLUMNS[1:]},
                        hardware=rec.get("hardware", "").strip(), precision=rec.get("precision", "").strip()))
    if not rows:
        raise ReportInputError(f"--csv {path}: no data rows")
    return rows


def rows_from_mlflow(uri: str, experiment: str, sweep_id: Optional[str] = None) -> List[Row]:
    from mlflow import MlflowClient

    from ..tracking import search_runs

    if MlflowClient(tracking_uri=uri).get_experiment_by_name(experiment) is None:
        raise ReportInputError(f"--experiment {experiment}: no such experiment in {uri}")
    flt = "tags.status = 'finished'"
    if sweep_id:
        flt += f" and tags.sweep_id = '{sweep_id}'"
    runs = search_runs(uri, experiment, flt)  # the shared query, under the store lock
    runs = [r for r in runs if r.data.tags.get("bertaccel.role") != "sweep"]  # parent runs hold no metrics
    if not runs:
        where = f"sweep {sweep_id} of " if sweep_id else ""
        raise ReportInputError(f"no finished runs in {where}experiment {experiment} ({uri})")
    rows = []
    for r in runs:
        m, tags, params = r.data.metrics, r.data.tags, r.data.params
        row = Row(name=r.info.run_name or r.info.run_id, run_id=r.info.run_id,
                  hardware=tags.get("hardware_profile", ""), precision=params.get("precision", ""),
                  **{col: m.get(metric) for col, metric in MLFLOW_METRICS.items()})
        for col, metric in MLFLOW_METRICS.items():
            if m.get(metric) is None:
                row.extra[col] = tags.get(f"{metric}_source", "not logged")
        rows.append(row)
    return rows
