"""The weighted scoring report (thesis section 5.1): `python -m bertaccel.report`.

Also a library for notebooks: `load_rows`, `score_rows`, `STRATEGIES`, `pareto_front`, and
`time_view` (--time, --project-epochs, break-even).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from .data import ReportInputError, rows_from_csv, rows_from_mlflow
from .scoring import STRATEGIES, Row, parse_weights, score_rows
from .timing import DEFAULT_TIME_MODE, TIME_MODES, TimeView, time_view

__all__ = ["DEFAULT_TIME_MODE", "ReportInputError", "Row", "STRATEGIES", "TIME_MODES", "TimeView", "load_rows",
           "parse_weights", "pareto_front", "rows_from_csv", "rows_from_mlflow", "score_rows", "time_view"]


def load_rows(uri: str = "sqlite:///mlflow.db", experiment: str = "bertaccel", sweep_id: Optional[str] = None,
              csv_path: Optional[str] = None, require: Sequence[Tuple[str, str]] = ()) -> List[Row]:
    """require: (CSV column, what needs it) pairs a CSV must have; MLflow rows say per run instead."""
    return rows_from_csv(csv_path, require) if csv_path else rows_from_mlflow(uri, experiment, sweep_id)


def pareto_front(rows: Sequence[Row]) -> List[Row]:
    """Runs no other run beats on both time (lower) and accuracy (higher), by time."""
    pts = [r for r in rows if r.time_s is not None and r.accuracy is not None]
    front = [r for r in pts if not any((o.time_s <= r.time_s and o.accuracy >= r.accuracy)
                                       and (o.time_s < r.time_s or o.accuracy > r.accuracy) for o in pts)]
    return sorted(front, key=lambda r: r.time_s)
