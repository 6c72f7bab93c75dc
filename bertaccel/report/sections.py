"""The report's tables on how sure it is: repeats with intervals and ties, the Pareto front, the
best run per hardware, the weight-space shares and the time to a target accuracy. Each table
that ranks runs together carries the comparability gate's warning for its rows (gate.py)."""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence

from .gate import with_warning
from .pareto import OBJECTIVES, pareto, row_points
from .repeats import GROUP_METRICS, LEVEL, Interval, RepeatStats, run_label, t_interval
from .scoring import Row
from .verdict import Verdict
from .target import Reach
from .weights import STEPS, WeightMap

Table = tuple  # (title, note, headers, rows of cells), as render.py
SPECS = {"time_s": ".2f", "cost_usd": ".4g", "energy_kwh": ".5f", "occupancy_pct": ".2f", "accuracy": ".4f"}
GROUPING = ("runs that differ only in train.seed are one configuration (MLflow: tag config_key_noseed, else the "
            "params without train.seed, and runs that read other rows apart, labelled [their data's digest]; "
            "CSV: the group column, else the name)")


def _f(v: Optional[float], spec: str) -> str:
    return "null" if v is None else format(v, spec)


def _null(column: str, why: str) -> str:
    """'energy_kwh null: RAPL unavailable' (a logged reason often starts with 'null:' itself)."""
    return f"{column} {why}" if why.startswith("null") else f"{column} null: {why}"


def interval_cell(iv: Interval, spec: str, runs: int) -> str:
    """'12.30 [11.95, 12.65]'; one value: '12.30 (n=1)'; fewer values than runs: '(2 of 3)'."""
    if iv.mean is None:
        return f"null ({iv.why})"
    cell = format(iv.mean, spec)
    cell += f" [{iv.low:{spec}}, {iv.high:{spec}}]" if iv.low is not None else " (n=1)"
    return cell + (f" ({iv.n} of {runs})" if iv.n < runs else "")


def repeat_tables(rows: Sequence[Row], st: RepeatStats, lab: Callable[[str], str], o_label: str) -> List[Table]:
    groups = st.groups
    pct = f"{LEVEL:.0%}"
    cells = []
    for k, g in enumerate(groups):
        cells.append([g.label, str(len(g.members)), ",".join(g.seeds)]
                     + [interval_cell(st.metrics[m][k], SPECS[m], len(g.members)) for m in GROUP_METRICS])
    labels = [lab(m) if m != "occupancy_pct" else o_label for m in GROUP_METRICS]
    out = [(f"Repeats: mean and {pct} interval per configuration",
            with_warning(f"{GROUPING}; mean [{pct} t-interval: mean ± t(0.975, n-1) x s / sqrt(n)]; n=1: no interval "
                         "(one run); '(2 of 3)': the metric is null in the other runs; few runs give wide intervals (t(0.975, 1) "
                         "= 12.7 for two), not clipped to the metric's range", rows),
            ["configuration", "runs", "seeds"] + labels, cells)]
    return out


def pareto_tables(rows: Sequence[Row], st: RepeatStats, lab: Callable[[str], str]) -> List[Table]:
    points, why = row_points(rows)
    sets = [("runs", [run_label(r, st.repeated) for r in rows], points, why, rows)]
    if st.repeated:
        gp = [{c: st.metrics[c][k].mean for c, _ in OBJECTIVES} for k in range(len(st.groups))]
        gwhy = [{c: st.metrics[c][k].why for c, _ in OBJECTIVES} for k in range(len(st.groups))]
        sets.append(("configurations, means of their runs", [g.label for g in st.groups], gp, gwhy, rows))
    out = []
    for what, names, pts, nulls, ranked in sets:
        front = pareto(pts, nulls)
        cells = []
        for i, (name, p) in enumerate(zip(names, pts)):
            if i in front.left_out:
                verdict = f"left out: {front.left_out[i]}"
            elif i in front.dominated_by:
                verdict = "no: beaten by " + ", ".join(_beaten_by(names, ranked, what, i, j)
                                                       for j in front.dominated_by[i][:4])
            else:
                verdict = "**yes**"
            cells.append([name] + [_f(p[c], SPECS[c]) for c, _ in OBJECTIVES] + [verdict])
        dropped = "; ".join(f"{c} left out of the comparison ({w})" for c, w in front.dropped.items())
        note = ("on the front = no other point is at least as good on every objective and better on one "
                f"(time, cost, energy lower, accuracy higher); compared on {', '.join(front.objectives) or 'nothing'}"
                + (f"; {dropped}" if dropped else "") + "; a point missing a compared objective is left out, "
                "not compared on fewer")
        out.append((f"Pareto front over time, cost, energy and accuracy ({what})", with_warning(note, ranked),
                    [what.split(",")[0]] + [lab(c) for c, _ in OBJECTIVES] + ["on the front"], cells))
    return out


def _beaten_by(names: Sequence[str], rows: Sequence[Row], what: str, i: int, j: int) -> str:
    """Who beat point i: with repeats, a run of its own configuration is said to be one."""
    if what == "runs" and rows[i].group and rows[i].group == rows[j].group:
        return f"{names[j]}, another repeat of its configuration"
    return names[j]


def hardware_table(rows: Sequence[Row], v: Verdict) -> Optional[Table]:
    """Thesis Table 4.16's last section: per hardware, the eligible configuration of lowest mean
    score under each strategy (the verdict's scores and floor, among that hardware's
    configurations). None when all runs share one hardware."""
    kinds = sorted({r.hardware or "unknown" for r in rows})
    if len(kinds) < 2:
        return None
    names = list(v.calls)
    cells = []
    for h in kinds:
        mine = [k for k, g in enumerate(v.groups) if (rows[g.members[0]].hardware or "unknown") == h]
        row = [h]
        for s in names:
            cand = [(v.stats.scores[s][k].mean, k) for k in mine if v.stats.scores[s][k].mean is not None
                    and v.eligible[k]]
            row.append(f"{v.name(min(cand)[1])} ({min(cand)[0]:.3f})" if cand else "none eligible")
        row.append(with_warning("", [rows[i] for k in mine for i in v.groups[k].members]))
        cells.append(row)
    return ("Best configuration per hardware (thesis Table 4.16 form)",
            with_warning("per hardware, the configuration with the lowest mean score under each strategy among that "
                         "hardware's (scores and accuracy floor as in the answer); the note column warns when one "
                         "hardware's runs are not like for like", rows),
            ["hardware"] + names + ["note"], cells)


def weights_table(rows: Sequence[Row], wm: WeightMap) -> Table:
    n = len(wm.points)
    cells = []
    for k in sorted(wm.won, key=lambda k: -wm.won[k]):
        c = wm.centroid(k)
        assert c is not None  # k won some points alone: they have a mean
        cells.append([wm.labels[k], str(wm.won[k]), f"{wm.share(wm.won[k]):.1%}",
                      "(" + ", ".join(f"{x:.2f}" for x in c) + ")"])
    for tie, count in sorted(wm.ties.items(), key=lambda t: -t[1]):
        cells.append(["tie: " + " = ".join(wm.labels[k] for k in tie), str(count), f"{wm.share(count):.1%}", ""])
    if wm.unscored:
        cells.append(["no score (only unmeasured metrics weighted)", str(wm.unscored), f"{wm.share(wm.unscored):.1%}",
                      ""])
    for k, why in wm.left_out.items():
        cells.append([wm.labels[k], "0", "0.0%", f"does not compete: {why}"])
    never = [wm.labels[k] for k in range(len(wm.labels)) if k not in wm.won and k not in wm.left_out]
    note = (f"every (w1, w2, w3, w4) >= 0 summing to 1 in steps of 1/{STEPS} ({n} points, the thesis' seven "
            "strategies among them); at each, the configuration with the lowest score (mean over its runs) wins; "
            "share = points won alone / all points; centroid = the mean weights where it wins alone"
            + (f"; never lowest alone: {', '.join(never[:8])}" + (f" and {len(never) - 8} more" if len(never) > 8
                                                                   else "") if never else ""))
    return ("Weight sensitivity: share of weight space each configuration wins (thesis Table 5.4 generalized)",
            with_warning(note, rows), ["configuration", "points won", "share", "centroid (w1, w2, w3, w4)"], cells)


def target_tables(rows: Sequence[Row], reaches: Sequence[Reach], target: float, st: RepeatStats) -> List[Table]:
    # A null energy or cost for the same reason in every run that reached the target: said once.
    reached = [x for x in reaches if x.reached]
    shared = {c: reached[0].why[c] for c in ("energy_kwh", "cost_usd")
              if reached and all(x.why.get(c) == reached[0].why.get(c) for x in reached) and c in reached[0].why}
    cells = []
    for r, x in zip(rows, reaches):
        verdict = "yes" if x.reached else "no" if x.reached is False else "unknown"
        note = x.how if x.reached is not None else x.why["time_s"]
        extra = [_null(c, w) for c, w in x.why.items() if c not in shared] if x.reached else []
        cells.append([run_label(r, st.repeated), verdict, "" if x.epoch is None else str(x.epoch), _f(x.time_s, ".2f"),
                      _f(x.energy_kwh, ".5f"), _f(x.cost_usd, ".4g"), "; ".join([note] + extra)])
    out = [(f"Time to accuracy {target} (MLPerf-style time to train)",
            with_warning("time_s = training-window seconds until the accuracy first reached the target (evaluation "
                         "between epochs not counted), interpolated linearly within the epoch it was reached in; "
                         "energy and cost at the run's average rate over its windows"
                         + "".join(f"; {_null(c, w)} for every run" for c, w in shared.items()), rows),
            ["run", "reached", "epoch", "time_s to target", "energy_kwh to target", "cost_usd to target", "how"],
            cells)]
    if st.repeated:
        cells = []
        for g in st.groups:
            got = [reaches[i] for i in g.members if reaches[i].reached]
            told = [reaches[i] for i in g.members if reaches[i].reached is not None]
            cells.append([g.label, f"{len(got)} of {len(g.members)}" + ("" if len(told) == len(g.members) else
                                                                        f" ({len(g.members) - len(told)} unknown)"),
                          interval_cell(t_interval([x.time_s for x in got if x.time_s is not None]), ".2f",  # (reached: set)
                                        len(g.members)),
                          interval_cell(t_interval([x.energy_kwh for x in got if x.energy_kwh is not None]), ".5f",
                                        len(g.members)),
                          interval_cell(t_interval([x.cost_usd for x in got if x.cost_usd is not None]), ".4g",
                                        len(g.members))])
        out.append((f"Time to accuracy {target} per configuration",
                    with_warning("means and 95% intervals over the runs that reached it", rows),
                    ["configuration", "reached in", "time_s to target", "energy_kwh to target",
                     "cost_usd to target"], cells))
    return out


def notes(o_note: str, st: RepeatStats) -> List[str]:
    out = [o_note]
    if not st.repeated:
        out.append(f"no configuration ran more than once ({GROUPING}): no intervals; repeat a sweep with "
                   "sweep.repeats=3 to get them (thesis section 5.5)")
    return out


def all_tables(rows: Sequence[Row], v: Verdict, wm: WeightMap, lab: Callable[[str], str],
               o_label: str, measured: Sequence[Row], reaches: Optional[Sequence[Reach]],
               target: Optional[float]) -> List[Table]:
    st = v.stats
    out: List[Table] = []
    if st.repeated:
        out += repeat_tables(rows, st, lab, o_label)
    out += pareto_tables(rows, st, lab)
    hw = hardware_table(rows, v)
    if hw is not None:
        out.append(hw)
    out.append(weights_table(rows, wm))
    if reaches is not None and target is not None:
        out += target_tables(measured, reaches, target, st)
    return out
