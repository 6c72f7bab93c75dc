"""The baseline a sweep added, left untrained when there is nothing to compare it with.

The baseline (runs/sweep_jobs.py) is there for the report's speed-ups: each configuration against
what the user runs today. When every other configuration of the sweep is known, at planning, not to
train here (skipped: this machine cannot run it, or the hub it needs is unreachable; or refused as
bad input), no speed-up can come of it, and training it is minutes of waiting for nothing (the
design card's sweep on a CPU: four configurations that need a GPU, and a four-minute baseline). The
sweep's plan says so in one line, and the launcher records the baseline skipped with that reason
instead of training it (runs/launch.py; record/run_record.py record_untrained). When one other
configuration may run, the baseline trains as before.

Asked only where the sweep's runs run on this machine (its devices are theirs: runs/sweep_plan.py
LOCAL_LAUNCHERS). The machine checks (options/hardware.py skip_reason: the run's own, at its turn)
are asked here only off a GPU: on a GPU some of them run a kernel, and the sweep's own process
makes no CUDA context (the runs have the GPU); there every configuration stays a candidate.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Set, cast


def untrained_reason(baseline: Set[int], jobs: Sequence[Any]) -> Optional[str]:
    """Why the baseline the sweep added is not trained (one line), or None: it trains (no baseline
    was added, or another configuration may run here). baseline: the added jobs' indices; jobs: the
    sweep's distinct configurations as planned (runs/sweep_plan.py PlannedJob)."""
    if not baseline:
        return None
    others = [j for j in jobs if j.idx not in baseline]
    why = []
    for job in others:  # (in order, up to the first that may run: on a GPU that is the first)
        kind = _not_run(job)
        if kind is None:
            return None
        why.append(kind)
    if not why:
        return None
    how = "skipped" if "refused" not in why else "refused" if set(why) == {"refused"} else "skipped or refused"
    where = ""
    if set(why) == {"machine"}:  # (asked off a GPU only: no GPU here, or the runs asked for the CPU)
        import torch

        where = " (train.device=cpu)" if torch.cuda.is_available() else " (no GPU)"
    every = "the other configuration" if len(others) == 1 else f"every other configuration ({len(others)})"
    return (f"baseline not trained: {every} of this sweep is {how} on this machine{where}, so there is nothing "
            "to compare it with (it trains when one of them can run)")


def _not_run(job: Any) -> Optional[str]:
    """Why the job will not train here, known before its turn: "refused" (bad input), "hub" (the hub
    it needs is unreachable: launch.py skips it before its process starts), "machine" (a machine
    check, off a GPU); None: it may train."""
    if job.refusal is not None:
        return "refused"
    if job.run is None:  # (not typed by the plan: nothing known of it, so it may train)
        return None
    from bertaccel.runs.hub import hub_skip_reason

    if hub_skip_reason(job.run) is not None:
        return "hub"
    from bertaccel.options.hardware import probe, resolve_device, skip_reason

    device = resolve_device(job.run.train.device)
    if device.type == "cuda" or skip_reason(job.run, device, probe()) is None:
        return None
    return "machine"


def untrained_after_resume(plan: Any, uri: str, experiment: str) -> Optional[str]:
    """plan.untrained, or None where the store has a finished run of another configuration of the
    sweep that the sweep takes instead of running it (sweep.resume, the default): that run is one
    to compare the baseline with (the README's sweep run again on a GPU's store, on a CPU)."""
    from omegaconf import OmegaConf

    from bertaccel.record.run_record import logged_config
    from bertaccel.record.tracking import legacy_config_hashes, search_runs

    for job in plan.distinct():
        if job.idx in plan.baseline or job.run is None or not job.run.sweep.resume:
            continue
        resolved = cast(Dict[str, Any], OmegaConf.to_container(logged_config(job.run), resolve=True))
        for h in dict.fromkeys([job.config_hash, *legacy_config_hashes(resolved)]):
            if search_runs(uri, experiment, f"tags.config_hash = '{h}' and tags.status = 'finished'"):
                return None
    reason: Optional[str] = plan.untrained  # (the plan: runs/sweep_plan.py SweepPlan, which imports this module)
    return reason
