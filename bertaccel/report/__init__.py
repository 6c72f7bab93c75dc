"""The weighted scoring report (thesis section 5.1): `python -m bertaccel.report`.

Also a library for notebooks: `load_rows`, `score_rows`, `STRATEGIES`, `pareto_front` (2-D by default,
`OBJECTIVES` for time, cost, energy and accuracy), and
`time_view` (--time, --project-epochs, break-even).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from .data import ReportInputError, parse_weights, rows_from_csv, rows_from_mlflow
from .pareto import OBJECTIVES, TIME_ACCURACY, pareto
from .scoring import STRATEGIES, Row, score_rows
from .timing import DEFAULT_TIME_MODE, TIME_MODES, TimeView, time_view

__all__ = ["DEFAULT_TIME_MODE", "OBJECTIVES", "ReportInputError", "Row", "STRATEGIES", "TIME_MODES", "TimeView",
           "load_rows", "parse_weights", "pareto_front", "rows_from_csv", "rows_from_mlflow", "score_rows", "time_view"]


def load_rows(uri: str = "sqlite:///mlflow.db", experiment: str = "bertaccel", sweep_id: Optional[str] = None,
              csv_path: Optional[str] = None, require: Sequence[Tuple[str, str]] = ()) -> List[Row]:
    """require: (CSV column, what needs it) pairs a CSV must have; MLflow rows say per run instead."""
    return rows_from_csv(csv_path, require) if csv_path is not None else rows_from_mlflow(uri, experiment, sweep_id)


def pareto_front(rows: Sequence[Row], objectives: Sequence[Tuple[str, str]] = TIME_ACCURACY) -> List[Row]:
    """Runs no other run beats on every objective, by time: (column, "min" | "max") pairs, by
    default time (lower) and accuracy (higher); pareto.OBJECTIVES adds cost and energy. Runs
    missing an objective are left out (pareto.pareto says why)."""
    front = pareto([{c: r.get(c) for c, _ in objectives} for r in rows], [r.extra for r in rows], objectives)
    return sorted((rows[i] for i in front.on_front), key=lambda r: (r.time_s is None, r.time_s or 0.0))
