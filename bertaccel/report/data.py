"""Rows for the report: from an MLflow experiment (optionally one sweep) or from a CSV file."""
from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .scoring import Row
from .timing import COMPILE_MODES, pairing_key

CSV_COLUMNS = ("name", "time_s", "cost_usd", "energy_kwh", "occupancy_pct", "accuracy")
# Optional timing columns (--time total, --project-epochs, break-even): CSV column -> Row field.
# time_s stays the training windows; compile_time_s is the one-time warm-up before them.
# epochs and train_rows (rows per epoch trained) only say what a projected run was measured on,
# optimizer_steps whether a compiled run lasted past its break-even.
TIMING_COLUMNS = {"compile_time_s": "compile_time_s", "step_time_ms": "step_time_ms",
                  "train_rows_full": "train_rows_full", "batch_size": "batch_size", "accumulation": "accumulation",
                  "num_gpus": "num_gpus", "compile": "compile_mode", "config": "config_key", "epochs": "epochs",
                  "train_rows": "train_rows", "optimizer_steps": "optimizer_steps"}
COUNT_COLUMNS = ("train_rows_full", "batch_size", "accumulation", "num_gpus", "train_rows", "optimizer_steps")
# A CSV without these columns is of runs on one device without accumulation (the thesis' own
# Table 5.1 names its multi-GPU runs instead); an empty cell is still "not measured".
COUNT_DEFAULTS = {"accumulation": 1, "num_gpus": 1}
OPTIONAL_COLUMNS = ("hardware", "precision") + tuple(TIMING_COLUMNS)
# MLflow metric for each report column.
MLFLOW_METRICS = {"time_s": "train_time_s", "cost_usd": "cost_usd", "energy_kwh": "energy_kwh",
                  "occupancy_pct": "occupancy_pct", "accuracy": "test_accuracy"}
# Row field -> (MLflow metric, whole number?) for the timing inputs (report/timing.py).
MLFLOW_TIMING_METRICS = {"compile_time_s": ("compile_time_s", False), "step_time_ms": ("step_time_ms", False),
                         "optimizer_steps": ("optimizer_steps", True), "train_rows": ("dataset_train_rows", True),
                         "train_rows_full": ("dataset_train_rows_full", True)}
# Row field -> (MLflow param, whole number?): params are stored as strings.
MLFLOW_TIMING_PARAMS = {"batch_size": ("train.batch_size", True), "accumulation": ("accumulation", True),
                        "num_gpus": ("num_gpus", True), "epochs": ("train.epochs", False)}


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


def _count(text: str, where: str) -> Optional[int]:
    value = _number(text, where)
    if value is None:
        return None
    if value <= 0 or value != int(value):
        raise ReportInputError(f"{where}: {text.strip()!r} is not a whole number > 0")
    return int(value)


def _timing_fields(rec: Dict[str, str], header: Sequence[str], where: str) -> Dict[str, Any]:
    """Row fields from the optional timing columns, with why each absent one is null (or filled)."""
    fields: Dict[str, Any] = {}
    extra: Dict[str, str] = {}
    for col, attr in TIMING_COLUMNS.items():
        if col not in header:
            if col in COUNT_DEFAULTS:
                fields[attr] = COUNT_DEFAULTS[col]
                extra[attr] = f"no {col} column: taken as {COUNT_DEFAULTS[col]}"
            else:
                extra[attr] = f"no {col} column in the CSV"
            continue
        text, here = rec[col], f"{where} column {col}"
        if col == "compile":
            mode = text.strip().lower()
            if mode and mode not in COMPILE_MODES:
                raise ReportInputError(f"{here}: {text.strip()!r} is not a compile mode ({', '.join(COMPILE_MODES)})")
            fields[attr] = mode
        elif col == "config":
            fields[attr] = text.strip()
        elif col in COUNT_COLUMNS:
            fields[attr] = _count(text, here)
        else:
            value = _number(text, here)
            positive = col in ("step_time_ms", "epochs")  # a warm-up may be 0, a step or an epoch not
            if value is not None and (value < 0 or (positive and value == 0)):
                raise ReportInputError(f"{here}: {text.strip()!r} must be {'> 0' if positive else '>= 0'}")
            fields[attr] = value
        if fields[attr] in (None, ""):
            extra[attr] = "empty in the input"
    fields["extra"] = extra
    return fields


def rows_from_csv(path: str, require: Sequence[Tuple[str, str]] = ()) -> List[Row]:
    """require: (optional column, what needs it) pairs, e.g. ("compile_time_s", "--time total")."""
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
    for col, why in require:
        if col not in header:
            raise ReportInputError(f"--csv {path}: no {col} column, which {why} needs")
    rows = []
    for lineno, raw in enumerate(reader, start=2):
        if None in raw or any(v is None for v in raw.values()):  # DictReader's marks for extra / missing fields
            raise ReportInputError(f"--csv {path} line {lineno}: expected {len(header)} fields")
        rec = {k.strip(): v for k, v in raw.items()}
        name = rec["name"].strip()
        if not name:
            raise ReportInputError(f"--csv {path} line {lineno}: empty name")
        where = f"--csv {path} line {lineno}"
        rows.append(Row(name=name, **{c: _number(rec[c], f"{where} column {c}") for c in CSV_COLUMNS[1:]},
                        hardware=rec.get("hardware", "").strip(), precision=rec.get("precision", "").strip(),
                        **_timing_fields(rec, header, where)))
    if not rows:
        raise ReportInputError(f"--csv {path}: no data rows")
    return rows


def _mlflow_timing(metrics: Mapping[str, float], params: Mapping[str, str], tags: Mapping[str, str]) -> Dict[str, Any]:
    """Row fields for --time total, --project-epochs and break-even, with why each is null."""
    from ..tracking import HASH_EXCLUDED_KEYS

    fields: Dict[str, Any] = {}
    extra: Dict[str, str] = {}
    for attr, (metric, whole) in MLFLOW_TIMING_METRICS.items():
        value = metrics.get(metric)
        if value is None:
            extra[attr] = tags.get(f"{metric}_source", "not logged")
        fields[attr] = int(value) if whole and value is not None else value
    for attr, (param, whole) in MLFLOW_TIMING_PARAMS.items():
        text = params.get(param)
        try:
            value = None if text is None else float(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or (whole and value != int(value)):
            extra[attr] = f"param {param} not logged" if text is None else f"param {param} = {text!r}, not a number"
            value = None
        fields[attr] = int(value) if whole and value is not None else value
    mode = params.get("compile.mode", params.get("compile", ""))
    fields["compile_mode"] = "off" if mode.lower() in ("off", "false") else mode  # YAML 1.1 reads a bare off as false
    fields["compile_cache"] = tags.get("compile_cache", "")
    # Where results go (tracking, cache_dir, sweep) says nothing about what was trained.
    fields["config_key"] = pairing_key(params, HASH_EXCLUDED_KEYS)
    fields["extra"] = extra
    return fields


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
                  **{col: m.get(metric) for col, metric in MLFLOW_METRICS.items()}, **_mlflow_timing(m, params, tags))
        for col, metric in MLFLOW_METRICS.items():
            if m.get(metric) is None:
                row.extra[col] = tags.get(f"{metric}_source", "not logged")
        rows.append(row)
    return rows
