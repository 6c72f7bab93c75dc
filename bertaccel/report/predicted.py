"""Predicted vs measured: what bertaccel.plan predicted for each run when it started (the
metrics predicted_<name>, logged by bertaccel/plan/hook.py from the store as it stood before the
run) beside what the run measured, the error of each, and the median absolute error.

    error % = (predicted - measured) / measured x 100   (signed: > 0 = predicted too slow / dear)
The median absolute error of train_time_s is given over every predicted run and over those
predicted from similar runs (basis "runs: ..."), the case the plan's goal (<= 15 %) is about.

It is the report's appendix (layout.py puts it last): a check of the planner, not of the runs.
Each row names its prediction's basis (calibrated from which runs, a probe, or a hardware
profile's default MFU) and warns beside one made from a cold profile: no run like it had been
measured, so its time is a peak FLOP rate at a guessed utilisation, tens of percent off or worse.
"""
from __future__ import annotations

import statistics
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, TypedDict

from .figures import png_bytes
from .scoring import Row

COMPARED = ("train_time_s", "step_time_ms", "cost_usd", "energy_kwh")
# What a user waited for: the prediction's name -> how the run measured it (calibrate.run_waits's keys).
WAITS = (("warmup_s", "compile_time_s"), ("startup_overhead_s", "startup_overhead_s"), ("eval_time_s", "eval_time_s"),
         ("run_wall_s", "run_wall_s"))
GOAL_PCT = 15.0
APPENDIX = "Appendix: predicted vs measured"  # the start of this module's tables' titles (layout.py)
COLD = "cold profile: expect tens of % off or worse (not in the goal)"
COLD_NOTE = ("a cold profile's prediction: no run like it had been measured before it, so its time is the hardware "
             "profile's peak FLOP rate at a default MFU; the first runs of a sweep on new hardware get one")
WALL_GOAL_PCT = 20.0


def measured(basis: str) -> bool:
    """A prediction calibrated by measurement (similar runs, or a probe of the configuration), not a
    profile's default MFU: the case the plan's goal is about."""
    return "runs:" in basis or "probe" in basis


def error_pct(predicted: Optional[float], measured: Optional[float]) -> Optional[float]:
    if predicted is None or measured is None or measured == 0:
        return None
    return (predicted - measured) / measured * 100


def _f(v: Optional[float], spec: str) -> str:
    return "null" if v is None else format(v, spec)


def median_abs(errors: Sequence[Optional[float]]) -> Optional[float]:
    known = [abs(e) for e in errors if e is not None]
    return statistics.median(known) if known else None


def comparison(rows: Sequence[Row], runs: Mapping[str, Any]) -> Tuple[List[List[str]], Dict[str, Any]]:
    """Table cells per row and the summary {median_all, median_from_runs, predicted, unpredicted}.
    runs: run id -> MLflow run (its metrics and tags)."""
    cells, all_err, from_runs, missing = [], [], [], {}
    for r in rows:
        run = runs.get(r.run_id)
        if run is None:
            continue
        m, tags = run.data.metrics, run.data.tags
        basis = tags.get("prediction_basis", "not predicted: the run logged no prediction (older than bertaccel.plan)")
        if m.get("predicted_train_time_s") is None:
            missing[r.name] = basis
            continue
        row = [r.name]
        for col in COMPARED:
            p, x = m.get(f"predicted_{col}"), m.get(col)
            e = error_pct(p, x)
            row += [_f(p, ".4g"), _f(x, ".4g"), _f(e, "+.1f")]
            if col == "train_time_s":
                all_err.append(e)
                if measured(basis):
                    from_runs.append(e)
        cells.append(row + [basis])
    return cells, {"median_all": median_abs(all_err), "median_from_runs": median_abs(from_runs),
                   "predicted": len(cells), "from_runs": len(from_runs), "unpredicted": missing}


def _plot(rows: Sequence[Row], runs: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
    """Predicted vs measured train_time_s, one point per run, the line of a perfect prediction."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = []
    for i, r in enumerate(rows):
        run = runs.get(r.run_id)
        if run is None:
            continue
        p, x = run.data.metrics.get("predicted_train_time_s"), run.data.metrics.get("train_time_s")
        if p is not None and x is not None:
            from_runs = measured(run.data.tags.get("prediction_basis", ""))
            pts.append((i, x, p, from_runs))
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(5.6, 4.4), dpi=110)
    for flag, colour, what in ((True, "tab:blue", "from similar runs or a probe"), (False, "tab:orange", "from a default MFU (cold profile)")):
        sel = [q for q in pts if q[3] == flag]
        if sel:
            ax.scatter([q[1] for q in sel], [q[2] for q in sel], color=colour, edgecolors="black", linewidths=0.5,
                       label=what)
    for i, x, p, _ in pts:
        ax.annotate(str(i), (x, p), xytext=(4, 4), textcoords="offset points", fontsize=7)
    lo = min(min(q[1], q[2]) for q in pts)
    hi = max(max(q[1], q[2]) for q in pts)
    ax.plot([lo, hi], [lo, hi], color="grey", linewidth=1, label="predicted = measured")
    ax.fill_between([lo, hi], [lo * (1 - GOAL_PCT / 100), hi * (1 - GOAL_PCT / 100)],
                    [lo * (1 + GOAL_PCT / 100), hi * (1 + GOAL_PCT / 100)], color="grey", alpha=0.15,
                    label=f"within {GOAL_PCT:g} %")
    ax.set_xlabel("measured train_time_s")
    ax.set_ylabel("predicted train_time_s")
    ax.set_title("Predicted vs measured train time (bertaccel.plan)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return {"stem": "predicted_vs_measured", "title": "Predicted vs measured train time (labels: # of the raw table)",
            "png": png_bytes(fig), "drawn": len(pts), "left_out": len(rows) - len(pts),
            "section": APPENDIX}


def basis_kind(basis: str) -> str:
    """What a prediction was made from, in a few words (the table's 'basis' column leads with it)."""
    if "probe" in basis:
        return "calibrated by a probe of the configuration"
    if "runs:" in basis:
        return "calibrated from measured runs"
    return "a default MFU (cold profile)"


def basis_cell(basis: str, relabel: Any = str) -> str:
    """'calibrated from runs a / b (1234abcd); let go: optimizer', 'a default MFU (cold profile): profile ...'."""
    said = relabel(basis)
    if "probe" not in basis and said.startswith("runs: "):
        return "calibrated from runs " + said.removeprefix("runs: ")
    return f"{basis_kind(basis)}: {said}"


def compact(cells: Sequence[Sequence[str]], relabel: Any = str) -> List[List[str]]:
    """comparison()'s cells as the appendix shows them, narrow enough for a page: per compared
    metric one cell 'predicted / measured (error %)', the basis named, the cold-profile warning.
    relabel: the runs' names in a basis as their labels (labels.Labels.in_text)."""
    out = []
    for row in cells:
        name, values, basis = row[0], row[1:-1], row[-1]
        warn = "" if measured(basis) else COLD
        out.append([name, basis_cell(basis, relabel), warn] + triples(values))
    return out


def triples(values: Sequence[str]) -> List[str]:
    """[predicted, measured, error %, ...] -> ['predicted / measured (error %)', ...]: one column per
    quantity instead of three (the appendix's tables fit a page)."""
    return [f"{values[k]} / {values[k + 1]}" + ("" if values[k + 2] == "null" else f" ({values[k + 2]}%)")
            for k in range(0, len(values), 3)]


def add_to_report(rep: Any, uri: str, experiment: str, rows: Sequence[Row]) -> None:
    """The report's hook: a table (and a plot) when any of the rows' runs logged a prediction."""
    from bertaccel.record.tracking import search_runs

    runs = {r.info.run_id: r for r in search_runs(uri, experiment, "tags.status = 'finished'")}
    cells, s = comparison(rows, runs)
    if not cells:
        return
    labels = getattr(rep, "labels", None)
    relabel = labels.in_text if labels is not None else str
    shown = compact(cells, relabel)
    headers = ["run", "basis", "warning"] + [f"{c}: predicted / measured (error)" for c in COMPARED]
    goal = ("" if s["median_from_runs"] is None else
            f"; goal <= {GOAL_PCT:g} %: {'met' if s['median_from_runs'] <= GOAL_PCT else 'not met'}")
    note = (f"predicted by bertaccel.plan when each run started, from the finished runs then in the store; error % = "
            f"(predicted - measured) / measured x 100; step_time_ms predicted is a mean per step, measured the "
            f"median. Median |error| of train_time_s: {_f(s['median_all'], '.1f')} % over {s['predicted']} runs, "
            f"{_f(s['median_from_runs'], '.1f')} % over the {s['from_runs']} predicted from similar runs or a probe{goal}"
            + (f"; warning: {COLD_NOTE}" if any(c[2] for c in shown) else ""))
    rep.tables.append((f"{APPENDIX} (bertaccel.plan)", note, headers, shown))
    if s["unpredicted"]:
        reasons = sorted(set(s["unpredicted"].values()))
        rep.notes.append(f"{len(s['unpredicted'])} run(s) without a prediction: " + "; ".join(reasons[:3]))
    waits = wait_comparison(rows, runs)
    if waits is not None:
        rep.tables.append(waits)
    plot = _plot(rows, runs)
    if plot is not None:
        rep.plots.append(plot)


class _SweepWall(TypedDict):
    """A sweep's wall as its runs tell it: first process start, last record, the predicted sum."""
    start: float
    end: float
    predicted: float
    runs: int
    complete: bool


def wait_comparison(rows: Sequence[Row], runs: Mapping[str, Any]) -> Optional[Tuple[str, str, List[str], List[List[str]]]]:
    """What each run waited for, predicted (by a saved plan: plan/saved.py) vs measured, and each
    sweep's wall: from its first run's process start to its last run's record."""
    from bertaccel.record.readings import run_waits

    cells = []
    sweeps: Dict[str, _SweepWall] = {}
    for r in rows:
        run = runs.get(r.run_id)
        if run is None or run.data.metrics.get("predicted_run_wall_s") is None and \
                run.data.metrics.get("predicted_warmup_s") is None:
            continue
        m, got = run.data.metrics, run_waits(run)
        row = [r.name]
        for name, key in WAITS:
            p, x = m.get(f"predicted_{name}"), got.get(key)
            row += [_f(p, ".3g"), _f(x, ".3g"), _f(error_pct(p, x), "+.1f")]
        cells.append(row)
        sweep = run.data.tags.get("sweep_id")
        if sweep and "run_wall_s" in got and run.info.end_time:
            started = run.info.end_time / 1e3 - got["run_wall_s"]  # (its process or job start)
            s = sweeps.setdefault(sweep, {"start": started, "end": 0.0, "predicted": 0.0, "runs": 0, "complete": True})
            s["start"] = min(s["start"], started)
            s["end"] = max(s["end"], run.info.end_time / 1e3)
            if m.get("predicted_run_wall_s") is None or "run_wall_s" not in got:
                s["complete"] = False
            else:
                s["predicted"] += m["predicted_run_wall_s"]
            s["runs"] += 1
    if not cells:
        return None
    walls = []
    for sweep, s in sorted(sweeps.items()):
        if s["complete"]:
            wall = s["end"] - s["start"]
            e = error_pct(s["predicted"], wall)
            assert e is not None  # wall > 0: it spans at least one run's wall
            walls.append(f"sweep {sweep}: {s['runs']} runs, wall predicted {s['predicted']:.1f} s, measured {wall:.1f} s "
                         f"(first run's process start to the last run's record), error {e:+.1f} % "
                         f"(goal within {WALL_GOAL_PCT:g} %: {'met' if abs(e) <= WALL_GOAL_PCT else 'not met'})")
    headers = ["run"] + [f"{n}: predicted / measured (error)" for n, _ in WAITS]
    note = ("predicted by bertaccel.plan before the sweep; measured: warmup_s = compile_time_s, startup_overhead_s = "
            "process (or job) start to the first step, run_wall_s = that start to the run's record (MLflow end_time)"
            + ("; " + "; ".join(walls) if walls else ""))
    return (f"{APPENDIX}: what you waited for (bertaccel.plan)", note, headers,
            [[row[0]] + triples(row[1:]) for row in cells])
