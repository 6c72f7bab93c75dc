"""hydra-submitit-launcher with bertaccel's sweep bookkeeping: `hydra/launcher=slurm` (a SLURM
cluster; presets slurm_gpu, slurm_ddp) and `hydra/launcher=local_jobs` (the same jobs as
processes of this machine).

bertaccel/conf/hydra/launcher/{slurm,local_jobs}.yaml extend the plugin's submitit_slurm and
submitit_local with these classes, so the plugin's options and documentation hold as they are
(the plugin's own entries, run without this, are refused by bertaccel.runs.progress). What a job does in its process is the plugin's (`__call__`: Hydra's run_job around the
run); what this adds is on the submitting side, where the sweep's frame (runs/progress.py's
callback: parent run, "run k of N" lines, summary, exit status) lives:

- Before anything is submitted, every configuration is checked here: checks.validate, and its
  GPU count against the GPUs its job asks for. A bad one is recorded failed with its reason,
  and a configuration whose earlier run means it is not run again (resume by config_hash) gets
  that outcome, both here, through Hydra's run_job as the bertaccel launcher would: a queue slot
  is never spent on a job that would only say so.
- The launcher options are read per job (slurm_ddp asks for gpus_per_node=${num_gpus}, which a
  sweep over num_gpus varies); jobs that ask for the same resources go as one submitit array.
- Outcomes are taken as jobs end (submitit.helpers.as_completed) and handed to the sweep's
  callback here; in the job's process the callback stays silent (runs/progress.py).
- A job that ends without a result (scancel, the time limit, a node failure, SIGKILL) is no
  outcome of its configuration: its MLflow run, left "running", is marked interrupted with what
  submitit said, and the same sweep command runs it again (record/sweep.py previous_outcome).
"""
# No `from __future__ import annotations` (see bertaccel_launcher.py). bertaccel's own modules
# are imported lazily (all but the Hydra adapter, which imports nothing at its import): Hydra imports every plugin module of the environment at start-up, for any app.
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from hydra.core.singleton import Singleton
from hydra_plugins.hydra_submitit_launcher import config as plugin_config
from hydra_plugins.hydra_submitit_launcher import submitit_launcher as plugin
from omegaconf import DictConfig, OmegaConf, open_dict

# (bertaccel/__init__ and the adapter import nothing heavy: Hydra's names are asked for lazily)
from bertaccel.hydra_adapter import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals

if TYPE_CHECKING:  # (at run time bertaccel's own modules are imported lazily: see above)
    from bertaccel.config import RunConfig

log = logging.getLogger(__name__)

# Options given to submitit.AutoExecutor itself rather than to update_parameters (as the plugin does).
EXECUTOR_INIT_KEYS = ("submitit_folder", "max_num_timeout")


def resources_problem(cfg: DictConfig, params: Dict[str, Any]) -> Optional[str]:
    """Why this configuration cannot run in the job these launcher options describe, or None.
    A run starts its own num_gpus ranks on one node (bertaccel/runs/launch.py), as it does locally."""
    if int(params.get("tasks_per_node") or 1) != 1 or int(params.get("nodes") or 1) != 1:
        return (f"hydra.launcher.tasks_per_node={params.get('tasks_per_node')} nodes={params.get('nodes')}: "
                "give 1 and 1 (a run starts its own num_gpus ranks inside its one job)")
    # one task: its GPUs are the node's or the task's, whichever the options name
    key = "gpus_per_node" if params.get("gpus_per_node") is not None else "gpus_per_task"
    gpus = params.get(key)
    if gpus is not None and cfg.train.device != "cpu" and int(cfg.num_gpus) > int(gpus):
        return (f"num_gpus={cfg.num_gpus} but its job asks for {key}={gpus}; use "
                "hydra/launcher=slurm_ddp (a job's GPUs follow num_gpus) or num_gpus<=" + str(gpus))
    return None


def _last_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[-1] if lines else ''}"


class _TypedTask:
    """bertaccel.run's task for a job whose config the submitting process typed (as the bertaccel
    launcher's _task): a class, not a closure, so that a job checkpointed for requeue (the plugin's
    checkpoint pickles the launcher) still pickles."""

    def __init__(self, typed: "RunConfig") -> None:
        self.typed = typed

    def __call__(self, cfg: DictConfig) -> Any:
        from hydra.core.hydra_config import HydraConfig

        from bertaccel.run import job_info, run_one

        return run_one(cfg, job_info(HydraConfig.get()), typed=self.typed)


class _BertaccelSubmitit:
    """The submitting side for both executors (mixed in before the plugin's class)."""
    POLL_S = 1.0

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        returns: Dict[int, JobReturn] = {}
        groups: Dict[str, List[Tuple[int, List[str], DictConfig, Dict[str, Any], Optional["RunConfig"]]]] = {}
        from bertaccel.runs.progress import planned_jobs

        for idx, overrides, _, typed in planned_jobs(self.hydra_context, job_overrides, initial_job_idx):  # (a repeat: once)
            sweep_cfg = self._sweep_config(idx, overrides)
            params = OmegaConf.to_container(sweep_cfg.hydra.launcher, resolve=True)
            params.pop("_target_", None)
            here = self._answer_here(sweep_cfg, params, typed)
            if here is not None:
                returns[idx] = self._run_here(sweep_cfg, here)
            else:
                groups.setdefault(repr(sorted(params.items())), []).append((idx, overrides, sweep_cfg, params, typed))
        from bertaccel.runs.startup import resume_collector

        resume_collector()  # (checked: the submitting process's start-up is over; bertaccel.run paused it)
        submitted = []
        for members in groups.values():
            executor = self._executor(members[0][3])
            # (the plugin's arguments, then the job's RunConfig as typed here: see __call__)
            args = [(o, "hydra.sweep.dir", idx, f"job_id_for_{idx}", Singleton.get_state(), typed)
                    for idx, o, _, _, typed in members]
            for (idx, _, sweep_cfg, _, _), job in zip(members, executor.map_array(self, *zip(*args))):
                submitted.append((job, idx, sweep_cfg))
        if submitted:
            log.info(f"Submitted {len(submitted)} {self._EXECUTOR} job(s) "
                     f"({', '.join(job.job_id for job, _, _ in submitted)}); logs in "
                     f"{self.params['submitit_folder'].replace('%j', '<job id>')}")
        self._collect(submitted, returns)
        return [returns[idx] for idx in sorted(returns)]

    def __call__(self, sweep_overrides: List[str], job_dir_key: str, job_num: int, job_id: str,
                 singleton_state: Dict[type, Singleton], typed: Optional["RunConfig"] = None) -> JobReturn:
        """The job, in its own process: the plugin's (Hydra's run_job around the run), with
        bertaccel.run's task handed typed, the job's RunConfig as the submitting process typed it
        (runs/sweep_plan.py), pickled with the job's arguments: the job converts it no second
        time (runs/checked.py). None (no grid plan typed it): bertaccel.run's task as it is."""
        if typed is None:
            return super().__call__(sweep_overrides, job_dir_key, job_num, job_id, singleton_state)
        task = self.task_function
        self.task_function = _TypedTask(typed)
        try:
            return super().__call__(sweep_overrides, job_dir_key, job_num, job_id, singleton_state)
        finally:
            self.task_function = task

    def _sweep_config(self, idx: int, overrides: List[str]) -> DictConfig:
        log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        with open_dict(cfg):
            cfg.hydra.job.id = f"job_id_for_{idx}"
            cfg.hydra.job.num = idx
        return cfg

    def _answer_here(self, sweep_cfg: DictConfig, params: Dict[str, Any],
                     typed: Any = None) -> Optional[Callable[[Any], Any]]:
        """A task that gives this configuration's outcome without submitting it, or None (submit).
        typed: its config as the sweep's frame typed it (runs/sweep_plan.py): the checks that left
        are asked alone, nothing converted again."""
        from bertaccel.config import ConfigError
        from bertaccel.options.checks import ask_later, validate
        from bertaccel.runs.checked import LEFT_TO_THE_RUNS
        from bertaccel.run import job_info
        from bertaccel.record.run_record import record_bad_input, resumed
        from bertaccel.runs.sweep_plan import task_config

        cfg = task_config(sweep_cfg)
        info = job_info(sweep_cfg.hydra)
        try:
            if typed is None:
                validate(cfg)
            else:
                ask_later(typed, LEFT_TO_THE_RUNS)
            problem = resources_problem(cfg, params)
        except ConfigError as e:
            problem = str(e)
        if problem is not None:
            def refuse(task_cfg: DictConfig) -> Any:
                print(f"error in run {info.name}: {problem}", file=sys.stderr, flush=True)
                return record_bad_input(task_cfg, info.choices, info.name, f"bad input: {problem}")
            return refuse
        earlier = resumed(cfg, info.name)
        return None if earlier is None else (lambda task_cfg: earlier)

    def _run_here(self, sweep_cfg: DictConfig, task: Callable[[Any], Any]) -> JobReturn:
        ret = run_job(hydra_context=self.hydra_context, task_function=task, config=sweep_cfg,
                      job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        return ret

    def _executor(self, params: Dict[str, Any]) -> Any:
        """A submitit executor for jobs with these options, named as the plugin names them:
        the options common to all executors as they are, the others prefixed `<executor>_`."""
        import submitit

        rest = {k: v for k, v in params.items() if k not in EXECUTOR_INIT_KEYS}
        init = {f"{self._EXECUTOR}_max_num_timeout": params["max_num_timeout"]} if "max_num_timeout" in params else {}
        executor = submitit.AutoExecutor(folder=params["submitit_folder"], cluster=self._EXECUTOR, **init)
        common = set(OmegaConf.structured(plugin_config.BaseQueueConf).keys())
        executor.update_parameters(**{k if k in common else f"{self._EXECUTOR}_{k}": v for k, v in rest.items()})
        return executor

    def _collect(self, submitted: List[Tuple[Any, int, DictConfig]], returns: Dict[int, JobReturn]) -> None:
        """Each job's JobReturn as it ends, handed to the sweep's callback in this process.
        Ctrl-C / SIGTERM here (bertaccel.runs.interrupt): the jobs still queued or running are
        cancelled and their runs marked interrupted, as a local sweep stops its current run."""
        import submitit

        from bertaccel.runs.interrupt import Interrupted
        from bertaccel.runs.progress import SweepProgress

        where = {id(job): (idx, sweep_cfg) for job, idx, sweep_cfg in submitted}
        pending = {id(job): job for job, _, _ in submitted}
        frames = [c for c in self.hydra_context.callbacks.callbacks if isinstance(c, SweepProgress)]
        try:
            for job in submitit.helpers.as_completed(list(pending.values()), poll_frequency=self.POLL_S):
                del pending[id(job)]
                idx, sweep_cfg = where[id(job)]
                error = job.exception()
                if error is None:
                    ret = job.results()[0]
                else:
                    ret = self._ended_without_result(
                        sweep_cfg, f"its {self._EXECUTOR} job {job.job_id} ended without a result ({_last_line(error)})")
                returns[idx] = ret
                for frame in frames:
                    frame.on_job_end(config=sweep_cfg, job_return=ret)
        except Interrupted as e:
            marked = []
            for job in pending.values():
                job.cancel(check=False)
                ret = self._ended_without_result(where[id(job)][1], f"{e.reason} (its {self._EXECUTOR} job "
                                                                    f"{job.job_id} was cancelled)")
                marked.append(ret.return_value)
            # for run.cli's one line: which runs it closed
            e.run_name = ", ".join(o.run_name for o in marked) or None
            e.run_id = ", ".join(o.run_id for o in marked if o.run_id) or None
            raise

    def _ended_without_result(self, sweep_cfg: DictConfig, reason: str) -> JobReturn:
        """A job killed from outside (not an outcome of its configuration): its run, if it opened
        one, is marked interrupted, which the same sweep command runs again."""
        from bertaccel.run import job_info
        from bertaccel.record.run_record import Outcome, cfg_hash
        from bertaccel.context import current as run_context
        from bertaccel.runs.sweep_plan import task_config
        from bertaccel.record.tracking import finish_run, search_runs

        cfg = task_config(sweep_cfg)
        info = job_info(sweep_cfg.hydra)
        log.warning(f"run {info.name}: {reason}")
        found = f"tags.config_hash = '{cfg_hash(cfg)}' and tags.status = 'running'"
        sweep = run_context().sweep
        if sweep is not None:
            found += f" and tags.sweep_id = '{sweep.sweep_id}'"
        runs = search_runs(cfg.tracking.uri, cfg.tracking.experiment, found)
        for run in runs:
            finish_run(cfg.tracking.uri, run.info.run_id, "interrupted", reason)
        outcome = Outcome("interrupted", info.name, reason, runs[-1].info.run_id if runs else None)
        ret = JobReturn(overrides=list(sweep_cfg.hydra.overrides.task), cfg=cfg, hydra_cfg=sweep_cfg,
                        working_dir=str(Path(str(sweep_cfg.hydra.sweep.dir)) / str(sweep_cfg.hydra.sweep.subdir)),
                        task_name=sweep_cfg.hydra.job.name, status=JobStatus.COMPLETED)
        ret.return_value = outcome
        return ret


class BertaccelSlurmLauncher(_BertaccelSubmitit, plugin.SlurmLauncher):
    POLL_S = 15.0  # each look asks SLURM (sacct): not more often than a person would


class BertaccelLocalLauncher(_BertaccelSubmitit, plugin.LocalLauncher):
    POLL_S = 0.5
