"""A multirun's frame: its MLflow parent run, a line per run ("run k of N"), the summary.

Hydra calls this callback in the launching process; bertaccel's launcher runs every job's
Hydra side there (also with launcher.runs_at_once > 1), so the outcomes collected here are
all the sweep's runs. The parent run's id and the swept keys reach the jobs in the run context
(bertaccel/context.py: one environment variable across processes).

The submitit launchers (hydra/launcher=slurm, slurm_gpu, slurm_ddp, local_jobs) run a job's
Hydra side in the job's own process, with a pickled copy of this callback: there it only makes
sure the job has the sweep's context (a cluster may not pass the submitting environment on) and
stays silent; the launcher hands each outcome to this instance in the launching process.
"""
from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from bertaccel.option import user_path

from bertaccel.options.search import parent_tags, uses_search
from bertaccel.runs import interrupt, run_dir
from bertaccel.runs.startup import MAIN_PARENT_RUN, MAIN_SWEEP_START, mark_main
from bertaccel.runs.sweep_jobs import grid_axes, naming_keys, values_count
from bertaccel.runs.sweep_plan import SweepPlan, SweepRefused, plan_sweep
from bertaccel.context import SweepContext, current as run_context
from bertaccel.runs.untrained_baseline import untrained_after_resume
from bertaccel.record.sweep import close_parent, open_parent, set_sweep, sweep_identity
from bertaccel.record.tracking import experiment_id_of, ui_address
from bertaccel.record.store_failure import exit_if_experiment_deleted, parent_failed, quiet_store_errors
from bertaccel.store import exit_if_store_unusable, repair_store

# interrupted: a submitit job killed from outside (its run is marked so and runs again next time)
STATUSES = ("finished", "skipped", "failed", "interrupted", "already_finished", "not_retried")
# hydra-submitit-launcher's own classes: they collect no outcome where this callback can see it
# and check nothing before submitting; conf/hydra/launcher/ has them with bertaccel's bookkeeping.
PLAIN_SUBMITIT = {"hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher": "slurm",
                  "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher": "local_jobs"}
LISTED_VALUES = 20  # an axis with more values is named as typed in the parent run's name (sweep_axes)


def count_jobs(overrides: List[str]) -> int:
    """Jobs the basic sweeper makes of these overrides: the product of the sweep lengths, counted
    without listing them (runs/sweep_jobs.py grid_axes)."""
    return math.prod(grid_axes(OverridesParser.create().parse_overrides(overrides)).values())


def swept_keys(overrides: List[str]) -> Set[str]:
    return {o.get_key_element() for o in OverridesParser.create().parse_overrides(overrides)
            if o.is_sweep_override()}


def sweep_axes(overrides: List[str]) -> str:
    """What a sweep varies, as the parent run's name in the MLflow UI:
    `precision=fp16,fp32 x attention=xformers,triton` (the sweep overrides in command-line order;
    one Hydra cannot list, such as a search's interval(...), as typed). Empty when nothing varies."""
    axes: List[str] = []
    for o in OverridesParser.create().parse_overrides(overrides):
        typed = o.input_line or o.get_key_element()  # (set for every override parsed from a string)
        if not o.is_sweep_override():
            continue
        try:  # (a long axis as typed: train.seed=range(0,10000), not ten thousand numbers in a name)
            long = (values_count(o) or 0) > LISTED_VALUES
            axes.append(typed if long else f"{o.get_key_element()}={','.join(o.sweep_string_iterator())}")
        except Exception:  # noqa: BLE001 - hydra raises its base exception for sweeps it cannot enumerate
            axes.append(typed)
    return " x ".join(axes)


@dataclass
class SweepState:
    total: Optional[int] = None
    swept: Set[str] = field(default_factory=set)  # keys the sweep varies: they name its runs
    outcomes: List[Any] = field(default_factory=list)
    context: Optional[SweepContext] = None
    uri: str = ""
    ui: str = ""  # the MLflow UI's address of the sweep's runs (tracking.ui_address)
    pid: int = 0  # the launching process (a submitit job's process has a copy of this state)
    plan: Optional[SweepPlan] = None  # a grid's configurations, composed and checked (runs/sweep_plan.py)
    added: Set[int] = field(default_factory=set)  # the outcomes (their places) of the baseline the sweep added

    def count(self, status: str) -> int:
        return sum(o.status == status for o in self.outcomes)

    def counts(self) -> str:
        text = (f"finished={self.count('finished')} skipped={self.count('skipped')} "
                f"failed={self.count('failed')}")
        if self.count("interrupted"):
            text += f" interrupted={self.count('interrupted')}"
        if self.count("already_finished") or self.count("not_retried"):
            text += (f" | resumed: already finished={self.count('already_finished')}, "
                     f"failed/skipped before and not retried={self.count('not_retried')}")
        return text

    def progress_line(self) -> str:
        last = self.outcomes[-1]
        return (f"[sweep] run {len(self.outcomes)} of {self.total or '?'} {last.status} ({last.run_name}); "
                f"so far {self.counts()}")

    def table(self) -> str:
        rows = [("#", "run", "status", "test_accuracy", "train_time_s", "reason / mlflow run id")]
        for i, o in enumerate(self.outcomes):
            acc = o.metrics.get("test_accuracy")
            t = o.metrics.get("train_time_s")
            rows.append((str(i), o.run_name, o.status, "-" if acc is None else f"{acc:.4f}",
                         "-" if t is None else f"{t:.1f}", o.reason or o.run_id or ""))
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]) - 1)]
        lines = ["  ".join(r[c].ljust(widths[c]) for c in range(len(widths))) + "  " + r[-1] for r in rows]
        totals = f"{len(self.outcomes)} runs: {self.counts()}"
        if self.context is not None:
            totals += f"\nsweep id {self.context.sweep_id} (MLflow parent run {self.context.parent_run_id})"
        if self.ui:
            totals += f"\nMLflow UI: {self.ui}"
        return "\n".join(["", "== sweep summary ==", *lines, totals])

    def requested_finished(self) -> int:
        """Requested configurations with a finished run (now or from before): the baseline the
        sweep added (runs/sweep_jobs.py) is not one; alone it answers nothing the user asked."""
        return sum(o.status in ("finished", "already_finished") for i, o in enumerate(self.outcomes)
                   if i not in self.added)

    def exit_code(self) -> int:
        """Non-zero (1) when no requested configuration has a finished run, whatever the baseline did."""
        return 0 if self.requested_finished() > 0 else 1


def plan_of(hydra_context: Any) -> Optional[SweepPlan]:
    """The plan the sweep's frame made (runs/sweep_plan.py), or None (a search, or no frame)."""
    frames = [c for c in hydra_context.callbacks.callbacks if isinstance(c, SweepProgress)]
    return frames[0].state.plan if frames else None


def planned_jobs(hydra_context: Any, job_overrides: Sequence[Sequence[str]],
                 initial_job_idx: int) -> List[Tuple[int, List[str], Any, Any]]:
    """What a launcher launches of the sweeper's jobs: (index, overrides, the sweep config the
    frame composed for it or None, its config as the frame typed it or None), the repeats of a
    configuration left out (runs/sweep_plan.py)."""
    plan = plan_of(hydra_context)
    jobs = []
    for i, overrides in enumerate(job_overrides):
        idx = initial_job_idx + i
        planned = plan.planned(idx, overrides) if plan is not None else None
        if planned is None or planned.repeat_of is None:
            jobs.append((idx, list(overrides), planned.config if planned is not None else None,
                         planned.run if planned is not None else None))
    return jobs


def untrained_jobs(hydra_context: Any) -> Dict[int, str]:
    """The jobs (the added baseline's) the launcher records skipped instead of training them, each
    with the plan's one line why (runs/untrained_baseline.py); empty when the baseline trains."""
    plan = plan_of(hydra_context)
    if plan is None or plan.untrained is None:
        return {}
    return {idx: plan.untrained for idx in plan.baseline}


def expand_dir(config: DictConfig, mode: str) -> None:
    """hydra.<mode>.dir through option.user_path: Hydra makes the folder as given, `~` included."""
    with read_write(config.hydra), open_dict(config.hydra):
        config.hydra[mode].dir = str(user_path(config.hydra[mode].dir))


class SweepProgress(Callback):
    """The sweep's frame. Hydra makes one instance per multirun and calls it in the launching
    process (bertaccel's launcher runs every job's Hydra side there, also with runs_at_once > 1),
    so the sweep's bookkeeping is this instance's, not module state shared between sweeps.
    A single run's frame too, for one thing: what its output directory held before Hydra's job
    set-up wrote there, put back when the run is refused for bad input (runs/run_dir.py)."""

    def __init__(self) -> None:
        self.state = SweepState()
        self.before: Optional[run_dir.Before] = None

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        expand_dir(config, "run")
        self.before = run_dir.before_job(config)

    def on_run_end(self, config: DictConfig, job_return: Any = None, **kwargs: Any) -> None:
        if job_return is not None and isinstance(getattr(job_return, "_return_value", None), run_dir.Refused):
            run_dir.undo(self.before)
            # (raised here, not left to Hydra: it would print "Error executing job ..." first;
            # SystemExit passes Hydra's callback wrapper, which turns exceptions into warnings)
            raise SystemExit(2)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        mark_main(MAIN_PARENT_RUN)  # (Hydra has composed the sweep's config: the first run's start-up)
        expand_dir(config, "sweep")  # (before the sweeper writes multirun.yaml there; the launcher: each job's)
        plain = PLAIN_SUBMITIT.get(config.hydra.launcher.get("_target_", ""))
        if plain is not None:
            presets = " (the same options), or the presets slurm_gpu, slurm_ddp" if plain == "slurm" else ""
            print(f"error: hydra-submitit-launcher's own launcher would run this sweep without bertaccel's checks "
                  f"before submission and without the sweep's summary; use hydra/launcher={plain}{presets}", file=sys.stderr)
            raise SystemExit(2)
        state = self.state = SweepState(pid=os.getpid())
        overrides = list(config.hydra.overrides.task)
        params = config.hydra.sweeper.get("params") or {}
        overrides += [f"{k}={v}" for k, v in params.items()]
        searching = uses_search(config.hydra)
        if not searching:
            # Before the store and the parent run: an empty sweep, one past sweep.max_runs, or one
            # whose every requested configuration is bad input, is one line and exit 2 with nothing
            # written, as a single run is; a configuration given twice is counted and run once.
            state.plan = plan_sweep(config)
        try:
            state.total, state.swept = count_jobs(overrides), swept_keys(overrides)
            axes = sweep_axes(overrides)
        except Exception:  # noqa: BLE001 - an unusual sweeper syntax only costs us "of N" and short names
            state.total, state.swept, axes = None, set(), ""
        if searching:  # a search runs its n_trials, not the grid
            state.total = int(config.hydra.sweeper.n_trials)
            if state.total < 1:
                raise SweepRefused(f"hydra.sweeper.n_trials={state.total}: a search needs at least one trial")
        elif state.plan is not None:
            state.total = len(state.plan.distinct())
            # (an added baseline takes off what every grid job sets: that names the runs too)
            state.swept |= naming_keys([j.overrides for j in state.plan.jobs])
        state.uri = config.tracking.uri
        exit_if_store_unusable(state.uri)  # before the parent run: one line, exit 2 (not minutes of retries)
        exit_if_experiment_deleted(state.uri, config.tracking.experiment)  # (in MLflow's trash: the same)
        repair_store(state.uri)  # a store left half-created by an older version: rebuilt (no runs in it)
        # A search's sampler, seed, n_trials and objectives are Hydra-side settings, not task
        # overrides: they join its identity, so a search is not the grid of the same study and two
        # sampler seeds are two sweeps, each with its own parent and front.
        search_tags = parent_tags(config.hydra, config.search) if searching else {}
        sweep_id = sweep_identity(config.hydra.job.config_name, overrides + [f"{k}={v}" for k, v in search_tags.items()])
        quiet_store_errors()  # (a full disk as the parent opens: the one line below, not MLflow's logged tracebacks)
        # A Ctrl-C while the parent run is made waits until its context is set (milliseconds):
        # raised between the two, it left the parent RUNNING, with no context to close it.
        with interrupt.deferred():
            try:
                parent = open_parent(state.uri, config.tracking.experiment, sweep_id, overrides, state.total,
                                     search_tags, name=axes)
            except Exception as e:
                stop = parent_failed(e, state.uri, config.tracking.experiment, sweep_id)
                if stop is None:
                    raise
                raise stop from None  # (a BaseException: through Hydra's callback handling to run.cli, one line)
            state.context = SweepContext(sweep_id, parent, sorted(state.swept), state.uri)
            set_sweep(state.context)  # first: from here a Ctrl-C closes the parent run (run.interrupted)
        state.ui = ui_address(state.uri, experiment_id_of(state.uri, parent))
        print(f"[sweep] {state.total or '?'} runs; sweep id {sweep_id}", flush=True)
        if state.plan is not None and state.plan.untrained is not None:
            # A finished earlier run of another configuration (resumed) is one to compare with.
            state.plan.untrained = untrained_after_resume(state.plan, state.uri, config.tracking.experiment)
        for line in [*state.plan.said, state.plan.untrained or ""] if state.plan is not None else ():
            if line:
                print(f"[sweep] {line}", flush=True)
        mark_main(MAIN_SWEEP_START)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if os.getpid() != self.state.pid and self.state.context is not None and run_context().sweep is None:
            set_sweep(self.state.context)  # a submitit job whose scheduler did not pass the environment on

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        if os.getpid() != self.state.pid:
            return  # a submitit job's process: its launcher hands the outcome to the launching process
        # A search trial (search.py) returns its objective values with the Outcome attached, or
        # fails with it attached (JobReturn keeps a failed job's exception as _return_value).
        done = job_return.status.name == "COMPLETED"
        outcome = job_return.return_value if done else getattr(job_return, "_return_value", None)
        outcome = getattr(outcome, "outcome", outcome)
        if outcome is None or not hasattr(outcome, "status"):
            return
        number = OmegaConf.select(config, "hydra.job.num", default=None)
        if self.state.plan is not None and number in self.state.plan.baseline:
            self.state.added.add(len(self.state.outcomes))
        self.state.outcomes.append(outcome)
        if config.hydra.mode is not None and config.hydra.mode.name == "MULTIRUN":
            print(self.state.progress_line(), flush=True)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        state = self.state
        if state.context is not None:
            close_parent(state.uri, state.context.parent_run_id, {s: state.count(s) for s in STATUSES})
        print(state.table(), flush=True)
        set_sweep(None)
        if state.outcomes and state.exit_code():
            finished = state.count("finished") + state.count("already_finished")
            if finished:  # (the added baseline's: said, or exit 1 would read as a contradiction)
                print("[sweep] none of the requested configurations finished (only the baseline the sweep added "
                      "did): exit status 1", flush=True)
            # The sweep's exit status, said here: Hydra returns nothing of a multirun to the
            # caller of main(), and this instance is where the outcomes are.
            raise SystemExit(state.exit_code())
