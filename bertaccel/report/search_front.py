"""The Pareto front a multi-objective search found (hydra/sweeper=optuna_pareto, bertaccel/options/search.py).

A search sweep's parent run carries its sampler and objectives (search.parent_tags). Its trials
are ordinary runs of the sweep, so the report's tables already hold them; this adds, per search
among the report's runs, the front over the search's own objectives and directions (MLflow
metric names, read from each run as the sampler read them), marked, with a plot of a minimized
objective against a maximized one. The front is of what the search trained, not of the grid it did
not run (benchmarks/search_vs_grid.py compares the two); a trial that resumed a configuration
another sweep had trained is that sweep's run and is not listed here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from .data import tag_equals
from .figures import png_bytes
from .pareto import Front, pareto
from .scoring import Row


@dataclass
class SearchFront:
    sweep_id: str
    sampler: str
    seed: str
    n_trials: str
    objectives: List[str]
    directions: List[str]                   # "minimize" / "maximize", one per objective
    names: List[str] = field(default_factory=list)           # configurations trained (its runs), in start order
    values: List[Dict[str, Optional[float]]] = field(default_factory=list)
    front: Front = field(default_factory=lambda: Front([]))

    @property
    def on_front(self) -> List[str]:
        return [self.names[i] for i in self.front.on_front]


def find(uri: str, experiment: str, rows: Sequence[Row], sweep_id: Optional[str] = None) -> List[SearchFront]:
    """The searches whose trials are among rows (or the one sweep_id names), each with its front."""
    from bertaccel.record.tracking import search_runs

    ids = {r.run_id for r in rows}
    found = []
    for parent in search_runs(uri, experiment, "tags.`bertaccel.role` = 'sweep'"):
        tags = parent.data.tags
        if "search.objectives" not in tags or (sweep_id and tags.get("sweep_id") != sweep_id):
            continue
        runs = [r for r in search_runs(uri, experiment, tag_equals("sweep_id", tags["sweep_id"], "sweep id"))
                if r.info.run_id in ids]
        if not runs:
            continue
        runs.sort(key=lambda r: r.info.start_time or 0)
        objectives, directions = tags["search.objectives"].split(","), tags["search.directions"].split(",")
        s = SearchFront(tags["sweep_id"], tags.get("search.sampler", "?"), tags.get("search.sampler_seed", "?"),
                        tags.get("search.n_trials", "?"), objectives, directions)
        why = []
        for r in runs:
            s.names.append(r.info.run_name or r.info.run_id)
            s.values.append({m: r.data.metrics.get(m) for m in objectives})
            why.append({m: r.data.tags.get(f"{m}_source", "not logged") for m in objectives})
        s.front = pareto(s.values, why, [(m, "min" if d == "minimize" else "max")
                                         for m, d in zip(objectives, directions)])
        found.append(s)
    return found


def front_plot(s: SearchFront) -> Optional[Dict[str, Any]]:
    """The trials on a minimized objective against a maximized one (time vs accuracy, say), the
    front found marked; with more than two objectives the marked points are the front over all of
    them, so no line joins them in this projection."""
    if len(s.front.objectives) < 2:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dirs = dict(zip(s.objectives, s.directions))
    used = s.front.objectives
    lows, highs = [m for m in used if dirs[m] == "minimize"], [m for m in used if dirs[m] == "maximize"]
    x, y = (lows[0], highs[0]) if lows and highs else (used[0], used[1])
    pts = [(a, b, i) for i, (a, b) in enumerate((v[x], v[y]) for v in s.values) if a is not None and b is not None]
    on = sorted((p for p in pts if p[2] in s.front.on_front), key=lambda p: p[0])
    fig, ax = plt.subplots(figsize=(5.6, 4.4), dpi=110)
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], color="lightgray", edgecolors="black", linewidths=0.4,
               label="configurations trained")
    ax.plot([p[0] for p in on], [p[1] for p in on], "o-" if len(used) == 2 else "o", color="tab:red",
            label="front found" if len(used) == 2 else f"front found over all {len(used)} objectives")
    for p in on:
        ax.annotate(str(p[2] + 1), (p[0], p[1]), xytext=(4, 4), textcoords="offset points", fontsize=7)
    ax.set_xlabel(f"{x} ({dirs[x]})")
    ax.set_ylabel(f"{y} ({dirs[y]})")
    ax.set_title(f"Search {s.sweep_id}: {s.sampler}, seed {s.seed}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return {"stem": f"search_front_{s.sweep_id}", "title": f"Front found by search {s.sweep_id} "
            f"(labels: run # of its table; other objectives compared but not drawn)" if len(s.front.objectives) > 2
            else f"Front found by search {s.sweep_id} (labels: run # of its table)",
            "png": png_bytes(fig), "drawn": len(pts), "left_out": len(s.values) - len(pts),
            "section": f"Search {s.sweep_id}:"}


def _cell(v: Optional[float]) -> str:
    return "null" if v is None else format(v, ".4g")


def add_to_report(rep: Any, uri: str, experiment: str, rows: Sequence[Row], sweep_id: Optional[str] = None) -> List[str]:
    """A table and a plot per search among the rows; the console lines that name each front."""
    lines = []
    for s in find(uri, experiment, rows, sweep_id):
        dropped = "".join(f"; {m} not compared ({why})" for m, why in s.front.dropped.items())
        note = (f"{s.sampler} (sampler seed {s.seed}, n_trials {s.n_trials}) trained {len(s.names)} configurations; "
                f"the front over {', '.join(f'{m} ({d})' for m, d in zip(s.objectives, s.directions))} is "
                f"{len(s.front.on_front)} of them (*). It is the front of what the search tried, not of the grid "
                f"it did not run{dropped}")
        cells = []
        for i, (name, v) in enumerate(zip(s.names, s.values)):
            mark = ("*" if i in s.front.on_front else
                    s.front.left_out.get(i) or _dominated(s.front, i))
            cells.append([str(i + 1), name] + [_cell(v[m]) for m in s.objectives] + [mark])
        rep.tables.append((f"Search {s.sweep_id}: the Pareto front it found", note,
                           ["run #", "configuration"] + s.objectives + ["front"], cells))
        plot = front_plot(s)
        if plot is not None:
            rep.plots.append(plot)
        lines.append(f"search {s.sweep_id} ({s.sampler}): {len(s.front.on_front)} of {len(s.names)} trained "
                     f"configurations on its front: {'; '.join(s.on_front)}")
    return lines


def _dominated(front, i: int) -> str:
    """'dominated by 1, 4' (run numbers), and 'and more' when the front kept only the first."""
    shown = front.dominated_by.get(i, [])
    return "dominated by " + ", ".join(str(j + 1) for j in shown) + (" and more" if i in front.more_dominators else "")
