"""The search block: what a Pareto search's trial returns. Its option: bertaccel/options/search.py."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List


@dataclass
class SearchConfig:
    """What a trial of the Pareto search (hydra/sweeper=optuna_pareto) returns, and which way each
    objective is better (bertaccel/options/search.py)."""
    # MLflow metric names a trial returns, with one direction (minimize | maximize) each.
    objectives: List[str] = field(default_factory=lambda: ["train_time_s", "cost_usd", "energy_kwh", "test_accuracy"])
    # minimize | maximize, one per objective.
    directions: List[str] = field(default_factory=lambda: ["minimize", "minimize", "minimize", "maximize"])
