"""What a store says beyond its finished runs, where the report needs it: a --baseline that names a
run that did not finish (it cannot be one, and the user is told why rather than "no such run"),
and a sweep still running while the report is made (its answer may change: said at its top)."""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

from .data import ReportInputError


def _runs(uri: str, experiment: str, sweep_id: Optional[str], flt: str = "") -> List[Any]:
    """The runs of the experiment (or of one sweep, with its parent) matching an MLflow filter."""
    from bertaccel.record.sweep import in_sweep
    from bertaccel.record.tracking import search_runs

    runs = search_runs(uri, experiment, flt)
    if sweep_id:
        runs = [r for r in runs if in_sweep(r, sweep_id) or r.data.tags.get("sweep_id") == sweep_id]
    return runs


def refuse_unfinished(uri: str, experiment: str, sweep_id: Optional[str], name: str) -> None:
    """Raise the one line for a --baseline that names runs that did not finish (failed, skipped,
    interrupted, still running); nothing when it names no run at all."""
    named = [r for r in _runs(uri, experiment, sweep_id) if name in (r.info.run_name, r.info.run_id)
             and r.data.tags.get("bertaccel.role") != "sweep" and r.data.tags.get("status") != "finished"]
    if not named:
        return
    r = named[0]
    status = r.data.tags.get("status") or r.info.status.lower()
    reason = r.data.tags.get("reason", "")
    why = f" ({reason[:200]})" if reason else ""
    raise ReportInputError(f"--baseline {name!r} names a {status} run, {r.info.run_id}{why}: only a finished run can "
                           "be a baseline; give a finished run's name or id, or leave --baseline out")


def _alive(tags: Any) -> bool:
    """Whether a run or a sweep's parent marked running has a process that still runs (another
    host's counts as running: it cannot be told; one killed with -9 does not)."""
    from bertaccel.record.sweep import PROCESSES_TAG, process_alive

    if tags.get("bertaccel.role") == "sweep":
        keys = [(k.split(":") + ["", ""])[:3] for k in tags.get(PROCESSES_TAG, "").split()]
        return any(process_alive(*k) is not False for k in keys)
    return process_alive(tags.get("host"), tags.get("pid"), tags.get("pid_started_at")) is not False


def still_running(uri: str, experiment: str, sweep_id: Optional[str], rows: Sequence[Any]) -> Optional[str]:
    """The warning for a report made while its sweep (or a run of the experiment) still runs, or
    None. rows: the finished runs the report read (its counts are the store's now)."""
    runs = _runs(uri, experiment, sweep_id, "tags.status = 'running'")  # (a cheap query: few runs run)
    parents = [r for r in runs if r.data.tags.get("bertaccel.role") == "sweep" and _alive(r.data.tags)]
    lines = []
    for p in parents:
        sid = p.data.tags.get("sweep_id", "")
        done = sum(r.sweep == sid for r in rows)
        total = p.data.params.get("sweep_configurations")
        of = f"{done} of {total} runs finished" if total else f"{done} runs finished so far"
        lines.append(f"this sweep{'' if sweep_id else ' ' + sid} is still running: {of}; the answer may change")
    in_parents = {p.data.tags.get("sweep_id") for p in parents}
    alone = [r for r in runs if r.data.tags.get("bertaccel.role") != "sweep"
             and r.data.tags.get("sweep_id") not in in_parents and _alive(r.data.tags)]
    if alone:
        lines.append(f"{len(alone)} run(s) of this {'sweep' if sweep_id else 'experiment'} still running "
                     f"({', '.join(r.info.run_name or r.info.run_id for r in alone[:3])}); the answer may change")
    return "WARNING, " + "; ".join(lines) if lines else None
