"""Entry point: `python -m bertaccel.run [-m] group=option ...` (Hydra composes bertaccel/conf/;
studies: `-m --config-name <study>`, bertaccel/sweeps/ found by name).

Single run: bad input prints one line and exits 2; a skipped or failed run exits 1.
Multirun: every configuration is recorded (bad ones as failed, with the reason) and the sweep
goes on; the exit status is non-zero only when no run finished (sweep_progress says it).
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Dict, Optional, Sequence

import hydra
import psutil
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from .config import GROUPS, ConfigError, register_configs
from .data import DataError
from .job import group_choices, record_bad_input, run_label
from .launch import launch
from .sweep_runs import context_from_env

register_configs()


@dataclass
class JobInfo:
    """What a run takes from Hydra's side of its job, read while Hydra's job set-up holds."""
    multirun: bool
    name: str
    choices: Dict[str, str]
    started_at: float
    started_source: str


def job_info(hc: DictConfig) -> JobInfo:
    """From the job's Hydra config (HydraConfig.get() in a job, or the job's own sweep config)."""
    multirun = hc.mode == RunMode.MULTIRUN
    sweep = context_from_env() if multirun else None
    name = run_label(hc.overrides.task, sweep.swept if sweep is not None else ())
    choices = group_choices(hc.runtime.choices, GROUPS)
    # The first job pays the interpreter and import start-up, later jobs of a sweep do not.
    # (Hydra numbers a multirun's jobs from 0 in launch order; no counter of our own.)
    if not multirun or hc.job.num == 0:
        started_at, started_source = psutil.Process().create_time(), "process start"
    else:
        started_at, started_source = time.time(), "job start (later job of a multirun)"
    return JobInfo(multirun, name, choices, started_at, started_source)


def run_one(cfg: DictConfig, info: JobInfo, devices: Optional[Sequence[str]] = None):
    """One configuration, recorded; returns its Outcome. devices: the GPUs (as CUDA_VISIBLE_DEVICES
    names) the run's processes may see, when the sweep launcher hands each run its own."""
    try:
        outcome = launch(cfg, info.choices, info.name, info.started_at, info.started_source, devices=devices)
    except (ConfigError, DataError) as e:
        if not info.multirun:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        outcome = record_bad_input(cfg, info.choices, info.name, f"bad input: {e}")
        print(f"error in run {info.name}: {e}", file=sys.stderr)
    return outcome


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig):
    info = job_info(HydraConfig.get())
    outcome = run_one(cfg, info)
    if not info.multirun:
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
    # Reached after a finished single run, or a multirun with at least one finished run
    # (sweep_progress ends one without any with exit status 1).
    sys.exit(0)


if __name__ == "__main__":
    cli()
