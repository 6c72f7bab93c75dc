"""The report's content: the answer (summary.py, headline.py) and the tables, as a Report that
page.py writes as Markdown and as one self-contained HTML file, in layout.py's order."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from .baseline import Baselines
from .change import change, pts_text, speed_text
from .effects import effects_tables
from .repeats import run_label
from .scoring import METRICS, Row, Scored, full_weights
from .labels import Labels
from .plots import single_price
from .headline import answer_table, headline
from .scores_tables import best_table, run_scores_table, scores_table
from .summary import Answer
from .verdict import Verdict
from .summary_chart import answer_chart
from .timing import Basis, TimeView

Table = tuple  # (title, note, headers, rows of cells)


def _f(v: Optional[float], spec: str = ".3f") -> str:
    return "null" if v is None else format(v, spec)


def pts(delta: Optional[float]) -> str:
    """An accuracy change (a fraction) in percentage points, the report's one unit for it: '+0.25 pts'."""
    return "null" if delta is None else f"{delta * 100:+.2f} pts"


@dataclass
class Report:
    title: str
    source: str
    notes: List[str] = field(default_factory=list)
    tables: List[Table] = field(default_factory=list)
    plots: List[Dict] = field(default_factory=list)
    lead: List[str] = field(default_factory=list)        # the answer's sentences, above its table
    lead_warnings: List[str] = field(default_factory=list)  # what changes the answer, right below it
    labels: Labels = field(default_factory=Labels)  # the runs' short labels and their MLflow names (labels.py)
    answer: Optional[Answer] = None  # the answer every surface renders (summary.py), once built


def _steps(v: Optional[float]) -> str:
    """A break-even step count: whole steps (the compiled run is ahead after the ceiling), or never."""
    if v is None:
        return "null"
    return "never" if math.isinf(v) else str(math.ceil(v))


def _measured_on(r: Row) -> str:
    """What the run trained (its accuracy is of that), e.g. '1 ep x 128 of 120000 rows'."""
    if r.epochs is None and r.train_rows is None:
        return "unknown"
    epochs = "?" if r.epochs is None else format(r.epochs, "g")
    rows = "?" if r.train_rows is None else str(r.train_rows)
    full = "" if r.train_rows_full is None or r.train_rows == r.train_rows_full else f" of {r.train_rows_full}"
    return f"{epochs} ep x {rows}{full} rows"


def projection_table(view: TimeView, repeated: bool = False) -> Table:
    n = view.basis.project_epochs
    cells = []
    for r, p in zip(view.measured, view.projections):
        batch = "x".join("?" if v is None else str(v) for v in (r.num_gpus, r.batch_size, r.accumulation))
        filled = [r.extra[c] for c in ("accumulation", "num_gpus") if "taken as" in r.extra.get(c, "")]
        # No time = no projection at all (one reason for the three columns); else what else is missing.
        why = [p.why["time_s"]] if "time_s" in p.why else [f"{c}: {w}" for c, w in p.why.items()]
        cells.append([run_label(r, repeated), _measured_on(r), _f(r.time_s, ".2f"),
                      "null" if r.train_rows_full is None else str(r.train_rows_full),
                      batch, "null" if p.steps is None else str(p.steps), _f(r.step_time_ms, ".2f"),
                      _f(p.time_s, ".2f"), _f(p.energy_kwh, ".5f"), _f(p.cost_usd, ".4g"), _f(r.accuracy, ".4f"),
                      "; ".join(why + filled)])
    return (f"Projection to {n} epoch(s) of the full train split (projected)",
            "steps = epochs x ceil(train_rows_full / (num_gpus x batch_size x accumulation)); time_s = steps x "
            "step_time_ms / 1000; energy and cost at the run's average rate over its training windows; accuracy "
            "as measured on the run's own data ('measured on')",
            ["run", "measured on", "train_time_s (measured)", "train_rows_full", "gpus x batch x accumulation",
             "steps (projected)", "step_time_ms", "time_s (projected)", "energy_kwh (projected)",
             "cost_usd (projected)", "accuracy (measured)", "note"], cells)


def break_even_table(view: TimeView) -> Table:
    rows, n = view.measured, view.basis.project_epochs
    steps_header = f"steps of the compiled run (projected, {n} ep)" if n is not None else "steps of the compiled run"
    cells = []
    for b in view.break_even:
        c = rows[b.compiled]
        run_steps = view.projections[b.compiled].steps if n is not None else c.optimizer_steps
        pays = "" if b.steps is None or run_steps is None else ("yes" if b.steps <= run_steps else "no")
        cells.append([b.config, b.compile_mode, c.compile_cache, rows[b.off].name, c.name, _f(b.step_ms_off, ".2f"),
                      _f(b.step_ms_compiled, ".2f"), _f(b.saving_ms, ".2f"), _f(b.extra_warmup_s, ".2f"),
                      _steps(b.steps), "null" if run_steps is None else str(run_steps), pays, b.why])
    return ("Break-even of compiling (measured)",
            "break-even steps = (compile_time_s compiled - compile_time_s off) / ((step_time_ms off - step_time_ms "
            "compiled) / 1000), never = the compiled step is not faster; pairs = runs of the same configuration but "
            "for the compile choice; a warm compile cache shortens the warm-up",
            ["configuration", "compile mode", "compile cache", "off run", "compiled run", "step_time_ms off",
             "step_time_ms compiled", "saving ms/step", "extra warm-up s", "break-even steps", steps_header,
             "pays off", "note"], cells)


def _and(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _samples_range(rows: Sequence[Row]) -> Optional[str]:
    """'32 to 128' when the runs' known sample counts differ, else None."""
    known = sorted({r.train_samples for r in rows if r.train_samples is not None})
    return f"{known[0]} to {known[-1]}" if len(known) > 1 else None


def unequal_work(rows: Sequence[Row]) -> Optional[str]:
    """The note that the scored runs trained different amounts, or None when they did not."""
    spread = _samples_range(rows)
    if spread is None:
        return None
    return (f"the runs trained different numbers of samples ({spread}, train_samples): their time, cost and energy, "
            "and so the scores, are of unequal work; the baseline table compares time per sample, and "
            "--project-epochs N puts every run on N epochs of its full train split")


def baseline_table(rows: Sequence[Row], bases: Baselines, verdict: Verdict, lab: Any = Basis().label,
                   sfx: str = "") -> Table:
    """Speed and accuracy change of each configuration against its like-for-like group's baseline
    configuration, means over repeats on both sides (change.py: the answer's own arithmetic), so
    the baseline's own row reads 1.00x. Runs that trained different numbers of samples are
    compared per sample."""
    spread = _samples_range(rows)
    unknown = [r for r in rows if r.train_samples is None]
    cells = []
    for k, g in enumerate(verdict.groups):
        at = bases.of(g.members[0]).index
        base_k = verdict.of_row(at) if at is not None else None
        c = change(rows, verdict.name(k), g.members, verdict.groups[base_k].members, spread is not None) \
            if base_k is not None else None
        time = verdict.stats.metrics["time_s"][k].mean
        acc = verdict.stats.metrics["accuracy"][k].mean
        samples = sorted({str(rows[i].train_samples) for i in g.members if rows[i].train_samples is not None})
        cells.append([verdict.name(k), _f(time, ".2f"), "/".join(samples) or "null", _f(acc, ".4f"),
                      "null (no baseline)" if c is None else speed_text(c.speedup, c.why.get("time_s", "")),
                      "null (no baseline)" if c is None else pts_text(c)]
                     + ([verdict.name(base_k) if base_k is not None else f"none ({bases.group(g.members[0]).label})"]
                        if bases.split else []))
    why_unknown = "; ".join(sorted({r.extra.get("train_samples", "not measured") for r in unknown}))
    mean = " (means over each configuration's repeats)" if verdict.repeated else ""
    if spread is not None:
        note = (f"speed = (baseline time / its train_samples) / (time / train_samples){mean}: the runs trained "
                f"different numbers of samples ({spread}), so time per sample is compared, not time"
                + (f"; null without train_samples ({why_unknown})" if unknown else ""))
    elif unknown:
        note = (f"speed = baseline time / time{mean}, taking the runs to have trained as much: train_samples unknown "
                f"for {len(unknown)} of {len(rows)} runs ({why_unknown})")
    else:
        note = f"speed = baseline time / time{mean}; every run trained {rows[0].train_samples} samples"
    # Table 1's form: time, speed-up and accuracy change of each configuration against one baseline (its group's).
    first = verdict.of_row(bases.indices[0])
    whom = "its group's baseline" if bases.split else f"the baseline '{verdict.name(first)}'"
    return (f"Against {whom} (as Table 1 of Profiling and Optimizing Training Performance of BERT-Base{sfx})",
            note + ("; each configuration against its like-for-like group's baseline (column 'baseline')"
                    if bases.split else ""),
            ["configuration" if verdict.repeated else "run", lab("time_s"), "train_samples", lab("accuracy"),
             "speed vs baseline", "accuracy change"] + (["baseline"] if bases.split else []), cells)


def build(rows: Sequence[Row], scored: Scored, ans: Answer, source: str, plots: List[Dict],
          view: Optional[TimeView] = None, rank_warning: str = "", o_label: str = "occupancy_pct",
          labels: Optional[Labels] = None) -> Report:
    """rows: the scored rows (view.rows when a view is given); ans: the answer and its verdict
    (summary.decided), which every table naming a winner renders; view: --time / --project-epochs / break-even, whose
    basis labels the time, cost and energy columns; rank_warning: the comparability gate's line for
    tables that rank the rows (gate.py); o_label: what plays O; labels: how the rows' names were
    shortened (labels.relabel), said under the answer."""
    basis = view.basis if view is not None else Basis()
    lab = basis.label
    # Every table of scored numbers says its basis: in the thesis form's brackets, or its own.
    sfx, own = (f", {basis.title_suffix}", f" ({basis.title_suffix})") if basis.title_suffix else ("", "")
    rep = Report("bertaccel report", source, labels=labels or Labels())
    rep.notes.extend(basis.notes())
    # Carbon is said (notes, columns) only where it is in play: a run has it or a strategy weighs it.
    carbon = any(r.co2e_kg is not None for r in rows) or any(full_weights(w)[4] > 0 for w in scored.strategies.values())
    metrics = METRICS if carbon else METRICS[:4]
    rep.notes.extend(_null_notes(rows, metrics))
    if scored.one_ranking is not None:
        rep.notes.append(scored.one_ranking.reason)
    work = unequal_work(rows)
    if work:
        rep.notes.append(work)

    bases, verdict = ans.baselines, ans.verdict  # (chosen once: every surface below reads them)
    base = bases.groups[0].baseline
    rep.answer = ans
    rep.tables.append(answer_table(ans, lab))
    rep.tables.extend(effects_tables(rows, bases.indices, lab))  # what each swept value buys (effects.py)
    repeats = (f" Changes are of means over repeats: the baseline is its configuration, '{ans.base_name}'."
               if not bases.split and base.index is not None and ans.base_name != rows[base.index].name else "")
    rep.lead = [headline(ans), f"{bases.sentence()}.{repeats}"]
    rep.lead_warnings = ans.warnings
    chart = answer_chart(ans, rows)
    if view is not None and view.basis.projected:
        rep.tables.append(projection_table(view, verdict.repeated))
    rep.tables.append(scores_table(rows, scored, verdict, lab, sfx, rank_warning))
    rep.tables.append(best_table(ans, lab, own, rank_warning))
    if verdict.repeated:
        rep.tables.append(run_scores_table(rows, scored, verdict, lab, sfx, rank_warning))
    rep.tables.append(_raw_table(rows, lab, sfx, o_label, carbon, verdict.repeated))
    rep.tables.append(_normalized_table(rows, scored, metrics, sfx, carbon, verdict.repeated))
    rep.tables.append(_weights_table(scored, metrics, carbon))
    if scored.affected:
        rep.tables.append(_fewer_metrics_table(rows, scored, own, verdict.repeated))
    if bases.indices:  # every run against its group's baseline
        rep.tables.append(baseline_table(rows, bases, verdict, lab, sfx))
    if view is not None and view.break_even:
        rep.tables.append(break_even_table(view))
    mapping = rep.labels.table()
    if mapping is not None:
        rep.tables.append(mapping)
    rate = single_price(rows)
    if rate is not None:  # (plots.all_plots left out the plots that would repeat time's)
        rep.notes.append(f"cost = time x one price ({rate * 3600:.4g} USD/h) for every run: no time-vs-cost plot, "
                         "and cost vs accuracy is the Pareto plot's time vs accuracy")
    if view is not None and view.unpaired:
        rep.notes.append(_unpaired_note(view, verdict))
    rep.plots = ([chart] if chart is not None else []) + list(plots)
    return rep


def _null_notes(rows: Sequence[Row], metrics: Sequence[str]) -> List[str]:
    """Metrics null in as many rows for the same reasons share one note: each reason said once."""
    n = len(rows)
    null_notes: Dict[tuple, List[str]] = {}
    for col, label in zip(metrics, ("time", "cost", "energy", "occupancy", "carbon")):
        nulls = [r for r in rows if r.get(col) is None]
        if nulls:
            reasons = tuple(sorted({r.extra.get(col, "empty in the input") for r in nulls}))
            null_notes.setdefault((len(nulls), reasons), []).append(f"{label} ({col})")
    return [f"{_and(cols)} {'is' if len(cols) == 1 else 'are'} null for {k} of {n} rows: " + "; ".join(reasons[:3])
            for (k, reasons), cols in null_notes.items()]


def _unpaired_note(view: TimeView, v: Verdict) -> str:
    """The compiled runs no uncompiled run of their configuration prices: each configuration once,
    with its count of runs ('bf16 (3 runs), fp8 (3 runs)')."""
    by: Dict[str, int] = {}
    for i in view.unpaired:
        k = v.of_row(i)
        by[v.groups[k].label] = by.get(v.groups[k].label, 0) + 1
    named = [f"{label} ({n} runs)" if n > 1 else label for label, n in by.items()]
    return (f"{len(view.unpaired)} compiled run(s) without an uncompiled run of the same configuration, so no "
            "break-even: " + ", ".join(named[:8]) + (f" and {len(named) - 8} more" if len(named) > 8 else ""))


def _raw_table(rows: Sequence[Row], lab: Any, sfx: str, o_label: str, carbon: bool, repeated: bool) -> Table:
    return (f"Raw metrics (thesis Table 5.1 form{sfx})", "# = the point labels in the plots",
            ["#", "run", "hardware", "precision", lab("time_s"), lab("cost_usd"), lab("energy_kwh"),
             o_label, lab("accuracy")] + (["co2e_kg"] if carbon else []),
            [[str(i), run_label(r, repeated), r.hardware, r.precision, _f(r.time_s, ".2f"), _f(r.cost_usd, ".4g"),
              _f(r.energy_kwh, ".5f"), _f(r.occupancy_pct, ".2f"), _f(r.accuracy, ".4f")]
             + ([_f(r.co2e_kg, ".3g")] if carbon else []) for i, r in enumerate(rows)])


def _normalized_table(rows: Sequence[Row], scored: Scored, metrics: Sequence[str], sfx: str, carbon: bool,
                      repeated: bool) -> Table:
    return (f"Max-normalized (thesis Table 5.2 form{sfx})", "each column divided by its maximum",
            ["run", "time", "cost", "energy", "occupancy"] + (["carbon"] if carbon else []),
            [[run_label(r, repeated)] + [_f(scored.normalized[i][m]) for m in metrics] for i, r in enumerate(rows)])


def _weights_table(scored: Scored, metrics: Sequence[str], carbon: bool) -> Table:
    weights = [[s] + [format(w, "g") for w in full_weights(scored.strategies[s])[:len(metrics)]]
               for s in scored.strategies]
    return ("Weight strategies (thesis Table 5.3 form)",
            "Score = w1*T + w2*C + w3*E - w4*O" + (" + w5*CO2e (w5 = 0: the thesis' four terms)"
                                                   if carbon else "") + ", lower is better",
            ["strategy", "w1 time", "w2 cost", "w3 energy", "w4 occupancy"] + (["w5 carbon"] if carbon else []),
            weights)


def _fewer_metrics_table(rows: Sequence[Row], scored: Scored, own: str, repeated: bool) -> Table:
    """The rows scored without some metric (scored.affected), and why."""
    n = len(rows)
    # Rows left short of the same metrics for the same reasons share one line.
    groups: Dict[tuple, List[int]] = {}
    for i, ms in sorted(scored.affected.items()):
        why = "; ".join(dict.fromkeys(rows[i].extra.get(m, "empty in the input") for m in ms))
        groups.setdefault((", ".join(ms), why), []).append(i)
    return (f"Rows scored over fewer metrics{own}",
            "weights of the present metrics scaled up to the "
            "strategy's total; a missing metric is never taken as 0",
            ["runs", "left out", "why"],
            [[f"all {n} runs" if len(idx) == n else ", ".join(run_label(rows[i], repeated) for i in idx), ms, why]
             for (ms, why), idx in groups.items()])
