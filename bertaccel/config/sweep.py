"""The sweep block: what a multirun does with configurations that already ran, and how many of its
runs share a GPU. Its option: bertaccel/options/sweep.py."""
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
    # Up to this many runs train at once on each GPU (and on a CPU host), each run's timed window
    # of window_steps steps with the device to itself; its time and energy are projected to the
    # whole run (bertaccel/train/exclusive.py, record/exclusive.py). 1: each run alone, timed whole.
    concurrent: int = bounded(1, ge=1, note="1: one run per GPU, timed over its whole training")
    # sweep.concurrent > 1: the steady steps (after warm-up, in the first epoch) timed alone.
    window_steps: int = bounded(200, ge=1)
