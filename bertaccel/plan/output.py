"""The plan as tables: predictions, the thesis' score on them (Table 5.4 before anything runs),
the configurations no weight strategy could make best, as text, Markdown, CSV and plots.

Occupancy cannot be predicted: every row lacks it, and report/scoring.py scores a row missing
a metric over the metrics it has, the weights of those scaled up to the strategy's total. With
occupancy missing from every row the scale is the same for all rows of a strategy.
"""
from __future__ import annotations

import csv
import io
from typing import Dict, List, Optional, Sequence, Tuple

from ..report.scoring import STRATEGIES, Row, Scored, score_rows
from .pricing import Prediction

DOMINANCE = ("train_time_s", "cost_usd", "energy_kwh")  # T, C, E: what the plan predicts of the score
OCCUPANCY_NOTE = ("occupancy_pct is not predicted (it is measured while a run runs): every row is scored over time, "
                  "cost and energy, their weights scaled up to the strategy's total, as report/scoring.py scores "
                  "any row missing a metric")


def _f(v: Optional[float], spec: str) -> str:
    return "null" if v is None else format(v, spec)


def label(p: Prediction, several_hardware: bool) -> str:
    return f"{p.name} @ {p.hardware}" if several_hardware else p.name


def score_rows_of(preds: Sequence[Prediction], several_hardware: bool) -> List[Row]:
    return [Row(label(p, several_hardware), p.train_time_s, p.cost_usd, p.energy_kwh, None, None, p.hardware,
                p.precision, extra={**{c: p.why[k] for c, k in (("time_s", "train_time_s"), ("cost_usd", "cost_usd"),
                                                                 ("energy_kwh", "energy_kwh")) if k in p.why},
                                    "occupancy_pct": "not predicted", "accuracy": "not predicted"})
            for p in preds]


def dominated(preds: Sequence[Prediction]) -> Dict[int, Tuple[int, List[str]]]:
    """Row -> (a row that dominates it, the metrics compared). B dominates A when B is no worse in
    each of time, cost and energy and better in one. Compared over the metrics predicted for
    every row; a row without a time is neither pruned nor prunes. With occupancy unknown for all,
    a dominated row scores worse than its dominator under every non-negative weighting (max-
    normalizing divides both by the same column maximum), so no strategy makes it best."""
    known = [i for i, p in enumerate(preds) if p.train_time_s is not None]
    metrics = [m for m in DOMINANCE if all(preds[i].get(m) is not None for i in known)]
    # each known row's value of each metric compared (all predicted, by the choice of metrics)
    values = {i: [v for m in metrics if (v := preds[i].get(m)) is not None] for i in known}
    out = {}
    for i in known:
        a = values[i]
        for j in known:
            b = values[j]
            if i != j and all(y <= x for x, y in zip(a, b)) and any(y < x for x, y in zip(a, b)):
                out[i] = (j, metrics)
                break
    return out


Table = Tuple[str, str, List[str], List[List[str]]]


def prediction_table(preds: Sequence[Prediction], several_hardware: bool) -> Table:
    rows = []
    for i, p in enumerate(preds):
        w = p.work
        rows.append([str(i), label(p, several_hardware), str(p.num_gpus),
                     "null" if w is None else f"{w.epochs} x {w.train_rows}",
                     "null" if w is None or w.optimizer_steps is None else str(w.optimizer_steps),
                     "null" if w is None else str(w.tokens.padded_tokens),
                     "null" if w is None else _f(w.model_flops / 1e12, ".4g"),
                     _f(p.achieved_tflops_per_gpu, ".4g"), _f(p.mfu, ".3f"), _f(p.step_time_ms, ".4g"),
                     _f(p.train_time_s, ".4g"), _f(p.cost_usd, ".4g"), _f(p.energy_kwh, ".4g"), p.basis,
                     p.power_basis if p.energy_kwh is not None or p.train_time_s is not None else ""])
    return ("Predicted time, cost and energy (before running)",
            "train_time_s = model_flops / achieved FLOP/s; step_time_ms = train_time_s / steps (mean); cost_usd = "
            "train_time_s / 3600 x price x gpus; energy_kwh = power x gpus x train_time_s; basis = the runs the rate "
            "came from, or the profile",
            ["#", "run", "gpus", "epochs x rows", "steps", "padded tokens", "model TFLOP", "TFLOP/s per GPU", "mfu",
             "step_time_ms", "train_time_s", "cost_usd", "energy_kwh", "basis", "power basis"], rows)


def wait_table(preds: Sequence[Prediction], sweep_wall_s: Optional[float]) -> Table:
    """What a user waits for, per run of this machine's rows, in launch order (plan/wall.py)."""
    rows = []
    for i, p in enumerate(preds):
        if p.run_wall_s is None and p.startup_overhead_s is None and p.warmup_s is None and "run_wall_s" in p.why \
                and "own hardware only" in p.why["run_wall_s"]:
            continue
        rows.append([str(i), label(p, False), _f(p.startup_overhead_s, ".3g"), _f(p.warmup_s, ".3g"),
                     _f(p.train_time_s, ".3g"), _f(p.eval_time_s, ".3g"), _f(p.run_wall_s, ".3g"),
                     "; ".join(f"{k}: {v}" for k, v in p.wait_basis.items())
                     or next((v for v in p.why.values()), "")])
    total = "null: a run's wall is not predicted" if sweep_wall_s is None else f"{sweep_wall_s:.1f} s"
    return ("What you wait for (predicted)",
            f"startup_overhead_s = process start to the first step, the warm-up included; run_wall_s = start-up + "
            f"train + evaluation + the record; the sweep's wall time (runs one after another): {total}",
            ["#", "run", "startup_overhead_s", "warmup_s", "train_time_s", "eval_time_s", "run_wall_s", "basis"], rows)


def score_table(preds: Sequence[Prediction], scored: Scored, several_hardware: bool) -> Table:
    names = list(scored.strategies)
    rows = []
    for i, p in enumerate(preds):
        cells = [str(i), label(p, several_hardware)]
        for s in names:
            v = _f(scored.scores[s][i], ".3f")
            cells.append(f"**{v}**" if scored.best[s] == i else v)
        rows.append(cells)
    return ("Predicted scores (thesis Table 5.4 form, predicted)", "bold = best per strategy; " + OCCUPANCY_NOTE,
            ["#", "run"] + names, rows)


def prune_table(preds: Sequence[Prediction], several_hardware: bool) -> Table:
    dom = dominated(preds)
    rows = [[str(i), label(preds[i], several_hardware), f"#{j} {label(preds[j], several_hardware)}",
             ", ".join(m for m in metrics)] for i, (j, metrics) in sorted(dom.items())]
    return ("Pruned: no weight strategy can make these best (predicted)",
            "dominated = another configuration is predicted no worse in each of the compared metrics and better "
            "in one; occupancy is unknown before running and left out for every row (a measured occupancy could "
            "still favour a pruned configuration)", ["#", "run", "dominated by", "compared on"], rows)


def best_lines(preds: Sequence[Prediction], scored: Scored, several_hardware: bool) -> List[str]:
    return [f"{name:18s} best: {label(preds[b], several_hardware) if b is not None else 'none predicted'}"
            for name, _, b in scored.best_lines()]


def score(preds: Sequence[Prediction], several_hardware: bool) -> Scored:
    return score_rows(score_rows_of(preds, several_hardware), STRATEGIES)


def text(table: Table) -> str:
    """A fixed-width table for the terminal."""
    title, note, headers, rows = table
    widths = [max(len(str(r[c])) for r in [headers] + rows) for c in range(len(headers))]
    lines = [f"== {title} ==", "  ".join(h.ljust(w) for h, w in zip(headers, widths))]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def markdown(tables: Sequence[Table], notes: Sequence[str], title: str) -> str:
    out = [f"# {title}", ""] + [f"- {n}" for n in notes] + ([""] if notes else [])
    for t, note, headers, rows in tables:
        out += [f"## {t}", ""] + ([note, ""] if note else [])
        out.append("| " + " | ".join(headers) + " |")
        out.append("|" + "---|" * len(headers))
        out += ["| " + " | ".join(str(c).replace("|", "/") for c in r) + " |" for r in rows]
        out.append("")
    return "\n".join(out)


CSV_HEADER = ["name", "time_s", "cost_usd", "energy_kwh", "occupancy_pct", "accuracy", "hardware", "precision",
              "step_time_ms", "num_gpus", "epochs", "train_rows", "optimizer_steps", "train_samples", "config_hash",
              "model_flops", "padded_tokens", "achieved_tflops_per_gpu", "mfu", "power_w_per_gpu", "basis",
              "power_basis", "overhead_ms_per_step", "warmup_s", "startup_overhead_s", "eval_time_s", "run_wall_s"]


def to_csv(preds: Sequence[Prediction], several_hardware: bool) -> str:
    """The report's CSV form (python -m bertaccel.report --csv reads it; occupancy and accuracy
    empty = not measured), with the plan's own columns after."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_HEADER)
    for p in preds:
        k = p.work

        def num(v: object) -> str:
            return "" if v is None else repr(float(v)) if isinstance(v, float) else str(v)
        w.writerow([label(p, several_hardware), num(p.train_time_s), num(p.cost_usd), num(p.energy_kwh), "", "",
                    p.hardware, p.precision, num(p.step_time_ms), p.num_gpus, num(k and k.epochs),
                    num(k and k.train_rows), num(k and k.optimizer_steps), num(k and k.samples), p.config_hash,
                    num(k and k.model_flops), num(k and k.tokens.padded_tokens), num(p.achieved_tflops_per_gpu),
                    num(p.mfu), num(p.power_w_per_gpu), p.basis, p.power_basis, num(p.overhead_ms_per_step),
                    num(p.warmup_s), num(p.startup_overhead_s), num(p.eval_time_s), num(p.run_wall_s)])
    return buf.getvalue()


# --- Which hardware to rent (--hardware): the thesis' Table 4.16 question, before renting -------

def _ranked(preds: Sequence[Prediction], column: str, unit: str, spec: str) -> Tuple[str, str]:
    """(the profiles from best to worst by the column, the best one), null ones last."""
    known = sorted(((p, v) for p in preds if (v := p.get(column)) is not None), key=lambda pv: pv[1])
    ranked = " < ".join(f"{p.hardware} {format(v, spec)}{unit}" for p, v in known)
    unknown = [p.hardware for p in preds if p.get(column) is None]
    if unknown:
        ranked += f"{'; ' if ranked else ''}null: {', '.join(unknown)}"
    return ranked, known[0][0].hardware if known else "none predicted"


def main_tables(preds: Sequence[Prediction], scored: Scored, several_hardware: bool) -> List[Table]:
    """The predictions, with --hardware which hardware to rent, and the scores."""
    return ([prediction_table(preds, several_hardware)] + ([hardware_table(preds)] if several_hardware else [])
            + [score_table(preds, scored, several_hardware)])


def hardware_table(preds: Sequence[Prediction]) -> Table:
    """One row per configuration: its hardware profiles ranked by predicted train_time_s and by
    cost_usd (the cheapest need not be the fastest: a faster GPU can cost more per hour than the
    time it saves)."""
    configs: Dict[Tuple[str, str], List[Prediction]] = {}
    for p in preds:
        configs.setdefault((p.name, p.config_hash), []).append(p)
    rows = []
    for n, ((name, _), ps) in enumerate(configs.items()):
        by_time, fastest = _ranked(ps, "train_time_s", " s", ".4g")
        by_cost, cheapest = _ranked(ps, "cost_usd", " USD", ".4g")
        rows.append([str(n), name, fastest, cheapest, by_time, by_cost])
    return ("Which hardware to rent (predicted, per configuration)",
            "each configuration's profiles ranked by predicted train_time_s and by cost_usd; a time moved from "
            "runs on other hardware is an estimate (its basis in the prediction table says how: the roofline of "
            "plan/roofline.py, or the peak ratio)",
            ["#", "run", "fastest", "cheapest", "by train_time_s", "by cost_usd"], rows)
