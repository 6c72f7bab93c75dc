"""bertaccel's Hydra launcher: the basic launcher's job order and bookkeeping, plus
`launcher.runs_at_once=G` to run G configurations of a sweep at a time, each in processes of
its own (launcher.name=process) and, on a GPU host, on GPUs of its own.

Hydra finds launchers only in the `hydra_plugins` package, hence this module's place; the run
itself is bertaccel's (bertaccel.run.run_one). conf/config.yaml selects it
(`override hydra/launcher: bertaccel`).

Why threads around Hydra's run_job: the job set-up (the HydraConfig singleton, the job's
output directory and logging, the callbacks) is process-global and not thread-safe, so it runs
under one lock; only the run itself (which waits on its worker processes) runs concurrently.
Every callback, SweepProgress's "run k of N" line among them, is therefore called in this
process and one at a time, whatever G is.
"""
# No `from __future__ import annotations`: Hydra executes plugin modules outside sys.modules,
# where dataclasses cannot resolve string annotations.
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

from bertaccel.hydra_adapter import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from bertaccel.option import user_path

log = logging.getLogger(__name__)


@dataclass
class BertaccelLauncherConf:
    _target_: str = "hydra_plugins.bertaccel_launcher.bertaccel_launcher.BertaccelLauncher"


ConfigStore.instance().store(group="hydra/launcher", name="bertaccel", node=BertaccelLauncherConf,
                             provider="bertaccel")


def visible_gpus() -> List[str]:
    """The GPUs this process may hand out, as CUDA_VISIBLE_DEVICES names: the user's own
    CUDA_VISIBLE_DEVICES list if set, else every GPU NVML sees. Read without creating a CUDA
    context in the sweep's process (its runs are in other processes)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip()]
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML (a CPU host): no GPUs to hand out
        return []


class GpuPool:
    """Free GPUs; a run takes num_gpus of them and waits until that many are free."""

    def __init__(self, gpus: Sequence[str]) -> None:
        self.free = list(gpus)
        self.size = len(self.free)
        self._cond = threading.Condition()

    def take(self, n: int) -> List[str]:
        with self._cond:
            self._cond.wait_for(lambda: len(self.free) >= n)
            taken, self.free = self.free[:n], self.free[n:]
            return taken

    def give_back(self, gpus: Sequence[str]) -> None:
        with self._cond:
            self.free.extend(gpus)
            self._cond.notify_all()


class BertaccelLauncher(Launcher):
    def __init__(self) -> None:
        self.config: Optional[DictConfig] = None
        self.task_function: Optional[TaskFunction] = None
        self.hydra_context: Optional[HydraContext] = None
        self._planned: Dict[int, DictConfig] = {}  # job index -> its sweep config, composed by the sweep's frame
        self._typed: Dict[int, Any] = {}  # job index -> its config typed by the sweep's frame (a RunConfig)
        self._untrained: Dict[int, str] = {}  # job index -> why it is recorded skipped, not trained (a baseline)

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.task_function, self.hydra_context = config, task_function, hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        setup_globals()
        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        user_path(self.config.hydra.sweep.dir).mkdir(parents=True, exist_ok=True)
        from bertaccel.options.launcher import launcher_for, runs_side_by_side

        # (sweep.concurrent=N: N runs on each GPU, side by side as runs_at_once's are)
        at_once = runs_side_by_side(self.config)

        own_processes = not launcher_for(self.config.launcher.name).shares_process
        if own_processes and self.config.launcher.start_method == "forkserver":
            from bertaccel.runs.forkserver import start_forkserver

            start_forkserver()  # from this, the main thread: see its docstring
        from bertaccel.runs.progress import planned_jobs, untrained_jobs

        # A configuration given twice runs once; the sweep's frame composed each job's config
        # already (runs/sweep_plan.py): _sweep_config takes it instead of composing it again.
        planned = planned_jobs(self.hydra_context, job_overrides, initial_job_idx)
        self._planned = {idx: cfg for idx, _, cfg, _ in planned if cfg is not None}
        # (kept for a job run again: the typed config is not changed by its run, unlike a DictConfig by Hydra's job)
        self._typed = {idx: run for idx, _, _, run in planned if run is not None}
        jobs = [(idx, overrides) for idx, overrides, _, _ in planned]
        # (the added baseline, when nothing else of the sweep trains here: runs/untrained_baseline.py)
        self._untrained = untrained_jobs(self.hydra_context)
        if at_once <= 1:
            # A job whose configuration another live sweep runs now is put off in its first turn
            # and run after the others, waiting for that sweep if it must (runs/claims.py).
            from bertaccel.runs.claims import deferred, job_turn

            rets = []
            for idx, overrides in jobs:
                with job_turn(first=True):
                    rets.append(self._run(idx, overrides, self.task_function))
            for i, r in enumerate(rets):
                if deferred(r):
                    with job_turn(first=False):
                        rets[i] = self._run(*jobs[i], self.task_function)
            return rets
        return self._concurrently(jobs, at_once)

    def _sweep_config(self, idx: int, overrides: List[str]) -> DictConfig:
        log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
        cfg = self._planned.pop(idx, None)  # (taken once: a job run again is composed again)
        if cfg is None:
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        with open_dict(cfg):
            cfg.hydra.sweep.dir = str(user_path(cfg.hydra.sweep.dir))  # (Hydra makes it as given: `~` a folder)
            cfg.hydra.job.id = idx
            cfg.hydra.job.num = idx
        return cfg

    def _task(self, idx: int, task: TaskFunction) -> TaskFunction:
        """The job's task: bertaccel.run's, handed the config the sweep's frame typed, when it did
        (a grid: runs/sweep_plan.py), so that the run converts it no second time (runs/launch.py)."""
        run, untrained = self._typed.get(idx), self._untrained.get(idx)
        if run is None and untrained is None:
            return task
        from hydra.core.hydra_config import HydraConfig

        from bertaccel.run import job_info, run_one

        return lambda cfg: run_one(cfg, job_info(HydraConfig.get()), typed=run, untrained=untrained)

    def _run(self, idx: int, overrides: List[str], task: TaskFunction) -> JobReturn:
        ret = run_job(hydra_context=self.hydra_context, task_function=self._task(idx, task),
                      config=self._sweep_config(idx, overrides),
                      job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        return ret

    def _concurrently(self, jobs: List[Any], at_once: int) -> List[JobReturn]:
        from bertaccel.run import job_info, run_one
        from bertaccel.runs.claims import deferred, job_turn

        gpus = visible_gpus()
        # Each GPU is sweep.concurrent slots (1: a GPU per run); slots of different GPUs alternate,
        # so the runs spread over the GPUs before two share one.
        slots = [gpu for _ in range(int(self.config.sweep.concurrent)) for gpu in gpus]
        pool = GpuPool(slots) if gpus else None
        hydra_side = threading.Lock()  # Hydra's job set-up and tear-down: one job at a time

        def one(idx: int, overrides: List[str], first: bool = True) -> JobReturn:
            with hydra_side, job_turn(first):  # (a job put off runs again after the others: runs/claims.py)
                sweep_cfg = self._sweep_config(idx, overrides)
                info = job_info(sweep_cfg.hydra)
                need = int(sweep_cfg.num_gpus)
                typed = self._typed.get(idx)  # (the sweep's frame typed it: runs/sweep_plan.py)
                untrained = self._untrained.get(idx)  # (a baseline with nothing to compare: not trained)

                def task(cfg: DictConfig) -> Any:
                    # Entered with hydra_side held (run_job's set-up); the run itself goes
                    # without it, and the lock is held again for run_job's tear-down.
                    hydra_side.release()
                    try:
                        devices = None
                        if pool is not None:
                            if need > pool.size:
                                return run_one(cfg, info, typed=typed, untrained=untrained)  # launch refuses it: one recorded line
                            devices = pool.take(need)
                        try:
                            return run_one(cfg, info, devices=devices, typed=typed, untrained=untrained)
                        finally:
                            if devices is not None:
                                pool.give_back(devices)
                    finally:
                        hydra_side.acquire()

                ret = run_job(hydra_context=self.hydra_context, task_function=task, config=sweep_cfg,
                              job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
                configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
                return ret

        log.info(f"Launching {len(jobs)} jobs, {at_once} at a time"
                 + (f" on GPUs {','.join(gpus)}" if gpus else " (no GPUs: they share this host's CPUs)")
                 + (f", {self.config.sweep.concurrent} to a device, each timed alone over an exclusive window"
                    if int(self.config.sweep.concurrent) > 1 else ""))
        with ThreadPoolExecutor(max_workers=at_once, thread_name_prefix="bertaccel-job") as ex:
            futures = [ex.submit(one, idx, overrides) for idx, overrides in jobs]
            try:
                rets = [f.result() for f in futures]
                futures = {i: ex.submit(one, *jobs[i], False) for i, r in enumerate(rets) if deferred(r)}
                for i, f in futures.items():
                    rets[i] = f.result()
                return rets
            except BaseException:  # (a signal, a failed store: the jobs not started yet are not started)
                for f in (futures.values() if isinstance(futures, dict) else futures):
                    f.cancel()
                raise
