"""The sweep block: what a multirun does with configurations that already ran; no option of its
own: its declared ranges are its checks."""
from __future__ import annotations

from dataclasses import dataclass

from bertaccel.option import bounded


@dataclass
class SweepConfig:
    """What a multirun (-m) does with configurations that already ran."""
    # Skip a configuration whose config_hash already has a finished run (multirun only).
    resume: bool = True
    # Also re-run configurations whose earlier run was failed or skipped.
    retry_failed: bool = False
    # Each configuration this many times, seeds train.seed, +1, ..., interleaved (A B A B, never
    # A A B B) so host drift falls on all alike; the report's intervals and ties come from them.
    repeats: int = bounded(1, ge=1)
    max_runs: int = bounded(10000, ge=1)  # The most runs (configurations x repeats) a sweep may have; more: refused
    # Add the config groups' defaults run (per model and dataset) when no configuration is it: the
    # report's speed-ups are then against what the user runs today (bertaccel/runs/sweep_jobs.py).
    baseline: bool = True
