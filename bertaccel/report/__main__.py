"""python -m bertaccel.report: Markdown + self-contained HTML report of a sweep or a CSV, leading
with the answer (the winner per strategy against a baseline, render.py / summary.py).

    python -m bertaccel.report --experiment bertaccel [--sweep SWEEP_ID] [--uri sqlite:///mlflow.db]
    python -m bertaccel.report --csv results.csv
    options: --weights mine=0.4,0.4,0.1,0.1 (repeatable)  --accuracy-floor 0.85|off  --baseline RUN_NAME
             --time train|total  --project-epochs N  --out report/
             --occupancy-metric occupancy|sm_active|tensor_active  --target-accuracy 0.88
"""
from __future__ import annotations

import sys

if __name__ == "__main__":
    from .stop import while_starting

    while_starting()  # Ctrl-C during the imports below: one line (report/stop.py)

import argparse  # noqa: E402 (after the start-up signal handlers)
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from . import floor, load_rows
from .args import OneLineParser, name_problem
from .baseline import choose_baselines, named_row
from .data import OPTIONAL_COLUMNS, Column, ReportInputError, parse_weights
from .extend import extend
from .folder import check_folder, write_folder
from .gate import warning
from .labels import relabel
from .occupancy import DEFAULT_OCCUPANCY_METRIC, OCCUPANCY_METRICS, o_column, with_occupancy_metric
from .plots import all_plots
from .predicted import add_to_report as add_predicted
from .page import to_html, to_markdown
from .render import build, unequal_work
from .scoring import STRATEGIES
from .headline import answer_text
from .summary import decided
from .search_front import add_to_report as add_search_front
from .stop import held, run
from .sweep_state import refuse_unfinished, still_running
from .timing import DEFAULT_TIME_MODE, TIME_MODES, time_view

# The numbers of the command line, checked as a CSV's are: finite and in range.
ACCURACY_FLOOR = Column("--accuracy-floor", "test accuracy as a fraction, 0.85 for 85% (or off: no floor)", low=0,
                        high=1)
TARGET_ACCURACY = Column("--target-accuracy", "test accuracy as a fraction, e.g. 0.88 for 88%", low=0, low_open=True,
                         high=1)
PROJECT_EPOCHS = Column("--project-epochs", "epochs to project every run to", kind="count")


def _args(argv=None) -> argparse.Namespace:
    ap = OneLineParser(prog="python -m bertaccel.report",
                       description="Weighted scoring report (thesis section 5.1) of MLflow runs or a CSV.")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--experiment", default="bertaccel", help="MLflow experiment (default bertaccel)")
    src.add_argument("--csv", help="CSV with columns name,time_s,cost_usd,energy_kwh,occupancy_pct,accuracy "
                                   f"[,{','.join(OPTIONAL_COLUMNS)}]; empty cell = not measured")
    ap.add_argument("--uri", default="sqlite:///mlflow.db", help="MLflow tracking URI")
    ap.add_argument("--sweep", help="only the runs of this sweep id (tag sweep_id)")
    ap.add_argument("--weights", action="append", default=[], metavar="[NAME=]W1,W2,W3,W4[,W5]",
                    help="extra strategy: weights of time, cost, energy, occupancy, and optionally carbon (co2e_kg)")
    ap.add_argument("--accuracy-floor", metavar="A|off",
                    help="runs below it are scored but never 'best' (a fraction, 0.85 for 85%%); default: 1 point "
                         "below the best test accuracy (report/floor.py); off: no floor")
    ap.add_argument("--baseline", help="run name (or MLflow run id) the answer and the baseline table compare "
                                       "against; default: the run on the config groups' defaults, else the slowest")
    ap.add_argument("--time", choices=TIME_MODES, default=DEFAULT_TIME_MODE,
                    help="T of the score: train = train_time_s, the training windows (default, the thesis' T); "
                         "total = compile_time_s + train_time_s, with cost scaled to match")
    ap.add_argument("--project-epochs", metavar="N",
                    help="score every run projected to N epochs of its full train split "
                         "(steps x step_time_ms; energy, cost at the run's average rate)")
    ap.add_argument("--occupancy-metric", choices=tuple(OCCUPANCY_METRICS), default=DEFAULT_OCCUPANCY_METRIC,
                    help="what plays O in the score: occupancy (occupancy_pct, the thesis' O, default), sm_active "
                         "(sm_active_pct) or tensor_active (tensor_active_pct); on Hopper occupancy stays ~13%% "
                         "even for a saturated GEMM while SM activity is ~91%%")
    ap.add_argument("--target-accuracy", metavar="A",
                    help="add the time, energy and cost at which each run first reached test accuracy A "
                         "(a fraction; from per-epoch accuracy and training windows)")
    ap.add_argument("--out", default="report", help="output folder (report.md, report.html, plots/)")
    return ap.parse_args(argv)


def _check_store(uri: str) -> None:
    """Before reading: a store that does not exist, is not an MLflow store or cannot be reached is
    one line, and nothing is written (MLflow would create tables in any sqlite:/// path it is
    given, an empty file or another program's database included, or retry a dead server for
    minutes)."""
    from bertaccel.store import store_problem

    why = store_problem(uri, create=False)
    if why:
        hint = ("; start the tracking server or give another store, e.g. --uri sqlite:///mlflow.db"
                if "unreachable" in why else " (the report reads a store, it creates none)")
        raise ReportInputError(f"--uri {uri}: {why}{hint}")


def _checked(a: argparse.Namespace) -> Dict[str, Tuple[float, ...]]:
    """Every name and number of the command line checked, every problem said at once (a line
    each); the numbers parsed in place; returns the strategies, the thesis' and --weights'."""
    problems = [p for p in (name_problem("--csv", a.csv, "a CSV file"), name_problem("--sweep", a.sweep, "a sweep id"),
                            name_problem("--baseline", a.baseline, "a run name or id"),
                            name_problem("--experiment", a.experiment, "an MLflow experiment name"),
                            name_problem("--uri", a.uri, "a tracking URI, e.g. sqlite:///mlflow.db")) if p]
    for column in (ACCURACY_FLOOR, TARGET_ACCURACY, PROJECT_EPOCHS):
        dest = column.name.lstrip("-").replace("-", "_")
        if getattr(a, dest) is not None and getattr(a, dest) != floor.OFF:
            try:
                setattr(a, dest, column.parse(getattr(a, dest), column.name, given=True))
            except ReportInputError as e:
                problems.append(str(e))
    strategies: Dict[str, Tuple[float, ...]] = dict(STRATEGIES)
    for k, spec in enumerate(a.weights, 1):
        named = "=" in spec
        name, _, w = spec.rpartition("=")
        name = name.strip() if named else f"custom{k}"
        why = "an empty name before '='; give NAME=W1,W2,W3,W4 or the weights alone" if not name else (
            "its name holds '|', which would split the report's tables" if "|" in name else None)
        why = why or name_problem("--weights", name, "a strategy name")
        if why:
            problems.append(why if why.startswith("--weights") else f"--weights {spec}: {why}")
        elif name in strategies:  # (else it would silently replace the thesis' strategy or the earlier one)
            problems.append(f"--weights {spec}: there is already a strategy {name}; give another name")
        try:
            strategies[name] = parse_weights(w)
        except ValueError as e:
            problems.append(str(e))
    if problems:
        raise ReportInputError("\n".join(dict.fromkeys(problems)))
    return strategies


def main(argv=None, written: Optional[List[str]] = None) -> int:
    """written: what was written so far is appended to it (report/stop.py says it on Ctrl-C)."""
    written = [] if written is None else written
    a = _args(argv)
    try:
        check_folder(a.out, "report")  # before any work: a bad --out costs nothing
        strategies = _checked(a)
        require = [("compile_time_s", "--time total")] if a.time == "total" else []
        if a.project_epochs is not None:
            require += [(c, "--project-epochs") for c in ("step_time_ms", "train_rows_full", "batch_size")]
        if a.target_accuracy is not None:
            require += [(c, "--target-accuracy") for c in ("epoch_accuracy", "epoch_time_s")]
        if o_column(a.occupancy_metric) != "occupancy_pct":
            require.append((o_column(a.occupancy_metric), f"--occupancy-metric {a.occupancy_metric}"))
        if a.csv is None:
            _check_store(a.uri)
        measured = with_occupancy_metric(load_rows(a.uri, a.experiment, a.sweep, a.csv, require),
                                         a.occupancy_metric)
        labels = relabel(measured)  # a sweep's run names -> their varying values (report/labels.py)
        view = time_view(measured, a.time, a.project_epochs)
        rows = view.rows
        baseline = None
        if a.baseline is not None:
            baseline = named_row(rows, a.baseline, labels.ids_of(a.baseline))  # (two configurations: refused)
            if baseline is None and a.csv is None:
                refuse_unfinished(a.uri, a.experiment, a.sweep, a.baseline)  # (a failed run: said so)
            if baseline is None:
                raise ReportInputError(f"--baseline {a.baseline!r}: no run of that name or id among "
                                       f"{len(rows)} rows (e.g. {rows[0].name!r})")
    except ValueError as e:  # (ReportInputError too) one line per problem: a CSV's bad cells all at once
        print("\n".join(f"error: {line}" for line in str(e).splitlines()), file=sys.stderr)
        return 2
    scored, verdict, ans = decided(view, baseline, strategies, a.accuracy_floor)  # the decision, once
    source = f"CSV {a.csv}" if a.csv is not None else (f"MLflow {a.uri}, experiment {a.experiment}"
                                          + (f", sweep {a.sweep}" if a.sweep else ""))
    o_label = o_column(a.occupancy_metric)
    # Labelled first in a plot too full to label every point: the winners and each group's baseline.
    notable = [verdict.groups[k].members[0] for k in verdict.winners()] + list(ans.baselines.indices)
    report = build(rows, scored, ans, source, all_plots(rows, view.basis, notable), view, warning(rows), o_label,
                   labels)
    running = still_running(a.uri, a.experiment, a.sweep, measured) if a.csv is None else None
    if running:  # (its sweep still runs: the answer may change)
        report.lead_warnings.insert(0, running)
    console = extend(report, rows, scored, verdict, view.measured, a.occupancy_metric, o_label, a.target_accuracy,
                     view.basis.label)
    if a.csv is None:  # each run's own prediction beside its measurement (report/predicted.py)
        add_predicted(report, a.uri, a.experiment, measured)
        console += add_search_front(report, a.uri, a.experiment, measured, a.sweep)  # report/search_front.py
    try:
        with held():  # (a Ctrl-C meanwhile is taken once the folder is in place and recorded)
            write_folder(a.out, "report", {"report.md": to_markdown(report), "report.html": to_html(report),
                                              "answer.txt": answer_text(ans) + "\n"},
                         report.plots)
            written.append(f"the report {a.out}")
    except ValueError as e:  # --out changed since check_folder, or could not be written: nothing changed
        print(f"error: {e}", file=sys.stderr)
        return 2
    for line in answer_text(ans).splitlines():  # the answer's own lines (headline.py), as every surface says them
        print(line)
    for line in console:
        print(line)
    for note in filter(None, (running, scored.one_ranking and scored.one_ranking.reason, unequal_work(rows),
                              warning(rows))):
        print(f"note: {note}")
    print(f"report: {Path(a.out) / 'report.md'}, {Path(a.out) / 'report.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
