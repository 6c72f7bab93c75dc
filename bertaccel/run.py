"""Entry point: `python -m bertaccel.run [-m] group=option ...` (Hydra composes bertaccel/conf/;
studies: `-m --config-name <study>`, bertaccel/sweeps/ found by name).

Single run: bad input prints one line and exits 2 (an unknown option or a value of the wrong type
on the command line too: Hydra's composition errors are caught here), and what Hydra's job set-up
wrote to the run's output directory is taken back, nothing else (runs/run_dir.py); a skipped or
failed run exits 1.
Multirun: every configuration is recorded (bad ones as failed, with the reason) and the sweep
goes on; the exit status is 1 when no requested configuration finished, the baseline the sweep
added not counting (runs/progress.py says it). A sweep with no configuration, past sweep.max_runs,
or with bad input in every requested one, is one line and exit 2 before its store is opened
(runs/sweep_plan.py). sweep.repeats without -m is bad input.
SIGINT / SIGTERM (interrupt.py): the current run is recorded interrupted, a sweep's parent run
is closed, one line is printed, exit 130 / 143.
"""
from __future__ import annotations

import os
import signal
import sys

if __name__ == "__main__":
    import gc

    _server: list = []  # the forkserver started below, if it was

    # Ctrl-C or SIGTERM while the libraries import (seconds, before cli() installs the handlers
    # of interrupt.py) is one line and the signal's exit status, not a KeyboardInterrupt
    # traceback: nothing has been written yet. Installed first, before this package's own
    # modules import (CI once saw the KeyboardInterrupt inside runs/bytecode.py's imports).
    def _before_start(signum, frame):  # noqa: ANN001 - a signal handler's signature
        name = signal.Signals(signum).name
        print(f"\ninterrupted by {name} while starting: no run was started, nothing was written",
              file=sys.stderr, flush=True)
        if _server:  # (os._exit skips the exit handler that would stop it)
            from bertaccel.runs.forkserver import stop as stop_server

            for pid in _server:
                stop_server(pid)
        # os._exit, not SystemExit: the exception would rise inside whatever library is importing,
        # and one that catches BaseException goes on half-initialized (seen: numpy under mlflow's
        # import recursed to a RecursionError, exit 1). Nothing is written yet, so nothing to unwind.
        os._exit(128 + signum)

    for _s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(_s, _before_start)

    from bertaccel.runs.bytecode import cache_bytecode

    # Before any heavy import, here and in the forkserver started below (runs/bytecode.py: on an
    # image that keeps no bytecode, torch and friends compile from source in every process).
    cache_bytecode()
    from bertaccel.runs.interrupt import quiet_when_stdout_closes

    quiet_when_stdout_closes()  # `run ... | head -2`: the sweep goes on, its output nowhere
    from bertaccel.runs.forkserver import start_early

    # The run processes' server first, before this process's own imports: its preload (torch,
    # transformers, MLflow: the longest wait of a sweep's first run) then runs beside them, Hydra's
    # composition and the sweep's parent run, not after them (runs/forkserver.py).
    _server += filter(None, [start_early(sys.argv[1:])])
    # The collector waits until the first run's checks are done (runs/startup.py resume_collector
    # freezes what the start-up made, then resumes it): its passes over a heap that only grows cost a sixth of this
    # module's imports (3.2-3.5 -> 2.7-2.9 s on a 2-core CPU box), a third of the forkserver's
    # (runs/preload.py, which does the same), and 0.6 s of Hydra's start, MLflow's SQL store and
    # torch._dynamo's import for the optimizer's check after them.
    gc.disable()

import time  # noqa: E402 (after the start-up signal handlers)
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import hydra
from hydra.conf import HydraConf
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException, OverrideParseException, SearchPathException
from hydra.types import RunMode
from omegaconf import DictConfig
from yaml import YAMLError
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from bertaccel.config import CONF_DIR, GROUPS, ConfigError, RunConfig, first_line, register_configs
from bertaccel.data import DataError
from bertaccel.options.checks import unknown_setting
from bertaccel.options.search import trial_result, uses_search
from bertaccel.runs.command_config import every_problem_of_argv, study_error
from bertaccel.runs.interrupt import Interrupted
from bertaccel.runs.interrupt import install as install_signal_handlers
from bertaccel.record.store_failure import StoreFailed
from bertaccel.record.store_failure import stopped as store_stopped
from bertaccel.runs.launch import launch
from bertaccel.record.run_record import group_choices, record_bad_input, run_label
from bertaccel.runs.run_dir import Refused
from bertaccel.runs.startup import MAIN_COMPOSE, Mark, job_marks, mark_main, process_started_at
from bertaccel.context import current as run_context
from bertaccel.record.sweep import interrupt_parent, set_sweep
from bertaccel.runs.sweep_jobs import refuse_repeats_alone
from bertaccel.runs.sweep_plan import SweepRefused

register_configs()

CONFIG_PATH = "conf"  # hydra.main's config_path, relative to this file (config.CONF_DIR)


@dataclass
class JobInfo:
    """What a run takes from Hydra's side of its job, read while Hydra's job set-up holds."""
    multirun: bool
    name: str
    choices: Dict[str, str]
    started_at: float
    started_source: str
    startup: List[Mark]  # where the start-up goes, up to now (runs/startup.py)


def job_info(hc: HydraConf) -> JobInfo:
    """From the job's Hydra config (HydraConfig.get() in a job, or the job's own sweep config's
    `hydra` node: both HydraConf's fields, as a DictConfig)."""
    multirun = hc.mode == RunMode.MULTIRUN
    sweep = run_context().sweep if multirun else None
    name = run_label(hc.overrides.task, sweep.swept if sweep is not None else ())
    choices = group_choices(hc.runtime.choices, GROUPS)
    # The first job pays the interpreter and import start-up, later jobs of a sweep do not.
    # (Hydra numbers a multirun's jobs from 0 in launch order; no counter of our own.) A submitit
    # job (hydra/launcher=slurm, local_jobs) is a process of its own, whatever its number.
    first = not multirun or hc.job.num == 0 or bool(os.environ.get("SUBMITIT_EXECUTOR"))
    if first:
        started_at, started_source = process_started_at(), "process start"
    else:
        started_at, started_source = time.time(), "job start (later job of a multirun)"
    return JobInfo(multirun, name, choices, started_at, started_source, job_marks(started_at, first))


def run_one(cfg: DictConfig, info: JobInfo, devices: Optional[Sequence[str]] = None,
            typed: Optional[RunConfig] = None, untrained: Optional[str] = None):
    """One configuration, recorded; returns its Outcome. devices: the GPUs (as CUDA_VISIBLE_DEVICES
    names) the run's processes may see, when the sweep launcher hands each run its own. typed: cfg
    as the sweep's plan typed it (runs/sweep_plan.py), not converted again (runs/launch.py).
    untrained: why the sweep's plan leaves this run (its added baseline) untrained: recorded skipped."""
    try:
        if not info.multirun:
            refuse_repeats_alone(cfg)
        outcome = launch(cfg, info.choices, info.name, info.started_at, info.started_source, devices=devices,
                         startup=info.startup, typed=typed, untrained=untrained)
    except (ConfigError, DataError) as e:
        if not info.multirun:
            print(said("error: ", e), file=sys.stderr)
            # Handed to the frame (runs/progress.py on_run_end), which takes back what Hydra's job
            # set-up wrote to the output directory, and only that (runs/run_dir.py), then exits 2.
            raise Refused(str(e)) from None
        outcome = record_bad_input(cfg, info.choices, info.name, f"bad input: {e}")
        print(said(f"error in run {info.name}: ", e), file=sys.stderr)
    return outcome


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="config")
def main(cfg: DictConfig):
    hc = HydraConfig.get()
    info = job_info(hc)
    outcome = run_one(cfg, info)
    if info.multirun and uses_search(hc):
        # Optuna's sweeper reads the objective values (or a failed trial) from the job's return.
        return trial_result(outcome, cfg.search)
    if not info.multirun:
        if outcome.status != "finished":
            print(f"run {outcome.status}: {outcome.reason} (mlflow_run_id={outcome.run_id})", file=sys.stderr)
            sys.exit(1)
        m = outcome.metrics
        print(f"test_accuracy={m['test_accuracy']:.4f} train_time_s={m['train_time_s']:.1f} "
              f"mlflow_run_id={outcome.run_id} (store {cfg.tracking.uri}, experiment {cfg.tracking.experiment})",
              flush=True)
    return outcome


def group_options(group: str, found: Optional[Sequence[str]] = None) -> List[str]:
    """The options of a config group a user can pick: Hydra's list when it gave one (it has a
    searchpath's own files too), else conf/<group>/*.yaml; never a `*_schema` entry."""
    names = list(found) if found else [p.stem for p in (CONF_DIR / group).glob("*.yaml")]
    return sorted(n for n in names if not n.endswith("_schema"))


def input_error(e: BaseException) -> str:
    """One line for a command line Hydra could not compose."""
    study = study_error(e)  # (a --config-dir that is not there, a file that is not YAML)
    if study:
        return study
    missing = getattr(e, "missing_cfg_file", None)
    if missing and "/" in missing:
        group, option = missing.rsplit("/", 1)
        options = group_options(group, getattr(e, "options", None))
        return f"{group}={option} is not an option of {group}; choose one of: {', '.join(options)}"
    if isinstance(e, OverrideParseException):
        return f"cannot read the override '{e.override}': {first_line(e.message)}"
    unknown = getattr(e.__cause__, "full_key", None)
    if (isinstance(e.__cause__, (ConfigAttributeError, ConfigKeyError)) and unknown
            and str(e).startswith("Could not override") and not unknown.startswith("hydra.")):
        return unknown_setting(unknown)  # (the same line as for `+key=...`: options/checks.py)
    parts = []
    for x in (e, e.__cause__):
        if x is not None:
            first = first_line(x, default="").rstrip(".")
            first = first.removeprefix("Error merging override ")
            if first and first not in parts:
                parts.append(first)
    if isinstance(e.__cause__, OmegaConfBaseException) and "could not be converted" in " ".join(parts):
        return ": ".join(parts) + " (the types are bertaccel/config's)"
    return ": ".join(parts) or type(e).__name__


def interrupted(e: Interrupted) -> int:
    """SIGINT / SIGTERM: close the sweep's parent run, say it in one line; the exit status."""
    what = (f"run {e.run_name} recorded as interrupted (mlflow_run_id={e.run_id})" if e.run_id
            else "no run was open")
    sweep = run_context().sweep
    if sweep is not None and sweep.uri:
        try:
            interrupt_parent(sweep.uri, sweep.parent_run_id, e.reason)
            what += (f"; sweep {sweep.sweep_id} stopped (parent run {sweep.parent_run_id} interrupted): "
                     "the same command resumes it")
        except Exception as x:  # noqa: BLE001 - the run's record is what matters; say what went wrong
            what += f"; the sweep's parent run could not be closed ({type(x).__name__})"
        set_sweep(None)
    # (a newline first: a progress bar may have the line)
    print(f"\n{e.reason}: {what}", file=sys.stderr, flush=True)
    return e.exit_code


def said(prefix: str, e: BaseException) -> str:
    """A refusal as the user reads it: each problem (validate() says every one, a line each) on a
    line of its own that starts with the prefix, so no line of stderr reads as a stray sentence."""
    return "\n".join(prefix + line for line in str(e).splitlines() or [""])


def refused(e: BaseException) -> str:
    """A command line Hydra could not compose, as every problem it has (a typo key and the bad
    values beside it: runs/command_config.py), a line each."""
    return "\n".join(f"error: {line}" for line in every_problem_of_argv(e, sys.argv[1:], input_error))


def cli() -> None:
    mark_main(MAIN_COMPOSE)  # (this module's imports are done: Hydra's part begins)
    install_signal_handlers()
    # Hydra prints a traceback for a command line it cannot compose unless HYDRA_FULL_ERROR=1,
    # which lets the exception reach this function: one line then, unless the user asked for it.
    user_full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        main()
    except Interrupted as e:
        sys.exit(interrupted(e))
    except SweepRefused as e:  # (before the sweep's store: runs/sweep_plan.py)
        if user_full_error and e.error is not None:
            raise e.error
        print(refused(e.error) if not e.why and e.error is not None else said("error: ", e), file=sys.stderr)
        sys.exit(2)
    except Refused:
        # (its line is printed; here only without bertaccel's frame among Hydra's callbacks, e.g. a
        # primary config of the user's own: nothing is undone then, nothing is deleted)
        sys.exit(2)
    except StoreFailed as e:  # the store or its disk failed under a run: one line (record/store_failure.py)
        sys.exit(store_stopped(e))
    except (ConfigCompositionException, OverrideParseException, OmegaConfBaseException, SearchPathException,
            YAMLError) as e:
        if user_full_error:
            raise
        print(refused(e), file=sys.stderr)
        sys.exit(2)
    # Reached after a finished single run, or a multirun with at least one finished run
    # (runs/progress.py ends one without any with exit status 1).
    sys.exit(0)


if __name__ == "__main__":
    cli()
