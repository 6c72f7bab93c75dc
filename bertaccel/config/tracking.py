"""The tracking block: the MLflow store. Its option: bertaccel/options/tracking.py."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TrackingConfig:
    """The MLflow store every run is recorded in (checks: bertaccel/options/tracking.py)."""
    uri: str = "sqlite:///mlflow.db"  # The MLflow store: any tracking URI; a relative path is from where you run
    experiment: str = "bertaccel"  # The MLflow experiment the runs go to
