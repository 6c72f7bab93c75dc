"""Entry point: `python -m bertaccel.run [-m] group=option ...` (Hydra composes conf/).

Single run: bad input prints one line and exits 2; a skipped or failed run exits 1.
Multirun: every configuration is recorded (bad ones as failed, with the reason) and the sweep
goes on; the exit status is non-zero only when no run finished.
"""
from __future__ import annotations

import sys
import time

import hydra
import psutil
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from .config import GROUPS, ConfigError, register_configs
from .data import DataError
from .job import group_choices, record_bad_input, run_label
from .launch import launch
from .sweep_progress import STATE

register_configs()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig):
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    name = run_label(hc.overrides.task, STATE.swept if multirun else ())
    choices = group_choices(hc.runtime.choices, GROUPS)
    # The first job pays the interpreter and import start-up, later jobs of a sweep do not.
    # (Hydra numbers a multirun's jobs from 0 in launch order; no counter of our own.)
    if not multirun or hc.job.num == 0:
        started_at, started_source = psutil.Process().create_time(), "process start"
    else:
        started_at, started_source = time.time(), "job start (later job of a multirun)"
    try:
        outcome = launch(cfg, choices, name, started_at, started_source)
    except (ConfigError, DataError) as e:
        if not multirun:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        outcome = record_bad_input(cfg, choices, name, f"bad input: {e}")
        print(f"error in run {name}: {e}", file=sys.stderr)
    if not multirun:
        if outcome.status != "finished":
            print(f"run {outcome.status}: {outcome.reason} (mlflow_run_id={outcome.run_id})", file=sys.stderr)
            sys.exit(1)
        m = outcome.metrics
        print(f"test_accuracy={m['test_accuracy']:.4f} train_time_s={m['train_time_s']:.1f} "
              f"mlflow_run_id={outcome.run_id} (store {cfg.tracking.uri}, experiment {cfg.tracking.experiment})",
              flush=True)
    return outcome


def cli() -> None:
    main()
    # Reached after a multirun (a single run exits inside main when it did not finish).
    sys.exit(STATE.exit_code() if STATE.outcomes else 0)


if __name__ == "__main__":
    cli()
