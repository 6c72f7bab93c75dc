"""Where a run's start-up goes: `startup_overhead_s` (the job's start to its first training step)
split into named phases that sum to it, from marks taken in every process the run passes through.

A mark is (the phase that begins here, time.time()). The first job of a process counts from the
process's start, so its phases begin in the main process (bertaccel.run): its imports, Hydra's
composition, the sweep's MLflow parent run, Hydra's start of the sweep. Every job then has its
launch (checks, store, resume) and, with launcher=process, its run process (the fork or spawn,
multiprocessing's set-up, the imports), then the run's own phases (job.execute, train).

The main process's marks reach its first job in the run context (bertaccel/context.py
StartupMarks, tagged with the pid that took them, so a child process that inherits the context
does not read them as its own); a job's marks travel with the job (launch.Job) into its run process.

Also here, as it ends the main process's start-up: resume_collector (bertaccel.run pauses the
garbage collector for it).
"""
from __future__ import annotations

import atexit
import gc
import os
import sys
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from bertaccel.context import StartupMarks, current, update

Mark = Tuple[str, float]  # (the phase that begins here, time.time())

# The main process (bertaccel.run), in order: its first job's phases only.
MAIN_IMPORTS = "main process: interpreter start and imports"
MAIN_COMPOSE = "main process: Hydra composes the config"
MAIN_PARENT_RUN = "main process: the sweep's MLflow parent run (store checked, run opened)"
MAIN_SWEEP_START = "main process: Hydra starts the sweep (sweeper, launcher, the job's directory and logging)"
# A first job whose process has no such marks (a submitit job's own process).
PROCESS_START = "process start to the job's start (interpreter, imports, Hydra)"
# Every job, first or later (a later job's start-up counts from its job start).
JOB_START = "main process: the job's start (runs_at_once: Hydra's job set-up, free GPUs)"
LAUNCH_CHECKS = "main process: the run's checks, store repair, hub probe"
LAUNCH_RESUME = "main process: earlier runs of this config (resume)"
# launcher=process: the run's own process.
PROCESS_FORK = "run process: waiting for the forkserver's preload (the part not overlapped)"
PROCESS_FORKED = "run process: the fork (the server ready)"
PROCESS_SPAWN = "run process: spawned"
PROCESS_SETUP = "run process: multiprocessing's set-up (the main module run again, the job unpickled)"
PROCESS_IMPORTS = "run process: imports (torch, bertaccel.runs.job), the job's config"
# Without marks before the run's code (job.execute called directly, e.g. benchmarks/vs_hf).
UNMARKED = "process start-up and imports (job start to the run's code)"


def process_started_at(pid: Optional[int] = None) -> float:
    """When a process started, as time.time() to the clock tick (10 ms). psutil's create_time adds
    the boot time in whole seconds (/proc/stat btime), so it reads up to 1 s early (0.84 s on the
    box this was written on): a first run's start-up counted a second it never spent. On Linux the
    boot time comes from CLOCK_BOOTTIME instead (the clock /proc's start times count on)."""
    try:
        with open(f"/proc/{pid or 'self'}/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        booted_at = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
        return booted_at + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, AttributeError, ValueError, IndexError):  # not Linux: psutil's reading
        import psutil

        return float(psutil.Process(pid).create_time())


def fork_marks(started_at: float) -> List[Mark]:
    """A forkserver child's marks from its server: the fork's phase begins once the server had
    imported its preload (runs/preload.py's LOADED_AT, inherited through the fork), so the
    first run's wait on that preload and the fork itself are apart. Nothing when this process
    was not forked from a server with the preload (spawn, inline)."""
    loaded_at = getattr(sys.modules.get("bertaccel.runs.preload"), "LOADED_AT", None)
    return [] if loaded_at is None else [(PROCESS_FORKED, min(loaded_at, started_at))]


def resume_collector() -> None:
    """bertaccel.run pauses the garbage collector for the main process's start-up (its imports,
    Hydra's, MLflow's SQL store, the first checks' torch._dynamo: a heap that only grows, whose
    collections cost a sixth of it). Once the first run's checks are done (launch.launch; the
    submitit launchers once theirs are), what the start-up made is frozen (it lives as long as
    the process: no collection walks it again) and the collector resumes, before any run
    allocates in this process (launcher=inline) or the sweep's bookkeeping does. A no-op when
    the collector runs (it is off only when bertaccel.run paused it)."""
    if not gc.isenabled():
        gc.freeze()
        # At exit the heap is let go as before: a frozen one is never collected, and Triton's
        # bindings (nanobind) then print ~30 lines of "leaked" objects under the command's output.
        atexit.register(gc.unfreeze)
        gc.enable()


def mark_main(phase: str) -> None:
    """The main process reached `phase` (kept for its first job, job_marks)."""
    update(startup=StartupMarks(os.getpid(), (*_main_marks(), (phase, time.time()))))


def _main_marks() -> List[Mark]:
    """This process's marks so far (none from a parent whose context it inherited)."""
    held = current().startup
    return list(held.marks) if held is not None and held.pid == os.getpid() else []


def job_marks(started_at: float, first_of_process: bool) -> List[Mark]:
    """A job's marks as it starts (run.job_info): the first job of a process from the process's
    start with the main process's marks, a later job from now."""
    now = time.time()
    if not first_of_process:
        return [(JOB_START, now)]
    main = [(p, t) for p, t in _main_marks() if started_at <= t <= now]
    return [(MAIN_IMPORTS if main else PROCESS_START, started_at), *main, (JOB_START, now)]


def stamp(marks: Sequence[Mark], phase: str) -> List[Mark]:
    """marks with `phase` beginning now."""
    return [*marks, (phase, time.time())]


def before_run(marks: Sequence[Mark], started_at: float, entered: float) -> List[Tuple[str, float]]:
    """The phases from the job's start to the run's code (job.execute entered), seconds each,
    summing to entered - started_at. Marks read on other clocks (a process's start, to the clock
    tick) are held between their neighbours, so no phase is negative."""
    if not marks:
        return [(UNMARKED, entered - started_at)]
    points = [started_at]
    for _, t in marks[1:]:
        points.append(min(max(t, points[-1]), entered))
    points.append(entered)
    return [(phase, points[i + 1] - points[i]) for i, (phase, _) in enumerate(marks)]


def startup_phases(before: Sequence[Mark], marks: Mapping[str, float], started_at: float,
                   result: Any) -> Dict[str, float]:
    """Where startup_overhead_s went, in order (seconds, summing to it): what a user waits for
    before the first step, and which part each lever (forkserver, caches, warm-up) can touch.
    before: the marks up to the run's code; marks: job.execute's; result: train()'s."""
    # train(): the model to the device and CUDA's start-up, then the warm-up (compile_time_s),
    # the optimizer and the epoch's set-up (telemetry threads, clocks), then the first batch.
    set_up = result.first_window_opened_at - result.device_ready_at - result.compile_time_s
    fitted = marks.get("batch fitted", marks["model built"])
    phases = [
        *before_run(before, started_at, marks["entered"]),
        ("checks, device, hardware profile", marks["checked"] - marks["entered"]),
        ("dataset read (CSV parse or its cache)", marks["data read"] - marks["checked"]),
        ("MLflow: earlier run of this config (resume)", marks["looked up"] - marks["data read"]),
        ("MLflow run opened", marks["run opened"] - marks["looked up"]),
        ("tokenizer, tokenize (or token cache read)", marks["tokenized"] - marks["run opened"]),
        ("model build", marks["model built"] - marks["tokenized"]),
        # (only a train.batch_size=auto run has the search)
        ("train.batch_size=auto search (batch_search_time_s)", fitted - marks["model built"]),
        ("prediction of this run from the store (bertaccel.plan)", marks["predicted"] - fitted),
        ("data loaders, telemetry collectors", marks["train called"] - marks["predicted"]),
        ("model to device, CUDA and cuBLAS start-up", result.device_ready_at - marks["train called"]),
        ("warm-up: compile / CUDA graphs / DDP first steps (compile_time_s)", result.compile_time_s),
        ("optimizer, telemetry start, epoch set-up", set_up),
        ("first batch (data loader start)", result.first_step_started_at - result.first_window_opened_at),
    ]
    if "batch fitted" not in marks:
        phases = [p for p in phases if not p[0].startswith("train.batch_size=auto")]
    return _rounded(phases)


def _rounded(phases: Sequence[Tuple[str, float]]) -> Dict[str, float]:
    """Each phase to the millisecond, rounded on the running total: the rounded phases still sum
    to the total within 0.5 ms however many there are."""
    out: Dict[str, float] = {}
    total, shown = 0.0, 0.0
    for phase, seconds in phases:
        total += seconds
        step = round(round(total, 3) - shown, 3)
        shown = round(shown + step, 3)
        out[phase] = round(out.get(phase, 0.0) + step, 3)
    return out
