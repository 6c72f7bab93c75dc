"""The report as Markdown and as one self-contained HTML file (plots inlined as base64 PNG)."""
from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from .scoring import METRICS, Row, Scored

Table = tuple  # (title, note, headers, rows of cells)


def _f(v: Optional[float], spec: str = ".3f") -> str:
    return "null" if v is None else format(v, spec)


@dataclass
class Report:
    title: str
    source: str
    notes: List[str] = field(default_factory=list)
    tables: List[Table] = field(default_factory=list)
    plots: List[Dict] = field(default_factory=list)


def build(rows: Sequence[Row], scored: Scored, source: str, baseline: Optional[int],
          accuracy_floor: Optional[float], plots: List[Dict]) -> Report:
    rep = Report("bertaccel report", source)
    n = len(rows)
    for col, label in zip(METRICS, ("time", "cost", "energy", "occupancy")):
        nulls = [r for r in rows if r.get(col) is None]
        if nulls:
            reasons = sorted({r.extra.get(col, "empty in the input") for r in nulls})
            rep.notes.append(f"{label} ({col}) is null for {len(nulls)} of {n} rows: " + "; ".join(reasons[:3]))

    rep.tables.append(("Raw metrics (thesis Table 5.1 form)", "# = the point labels in the plots",
                       ["#", "run", "hardware", "precision", "time_s", "cost_usd", "energy_kwh", "occupancy_pct",
                        "accuracy"],
                       [[str(i), r.name, r.hardware, r.precision, _f(r.time_s, ".2f"), _f(r.cost_usd, ".4g"),
                         _f(r.energy_kwh, ".5f"), _f(r.occupancy_pct, ".2f"), _f(r.accuracy, ".4f")]
                        for i, r in enumerate(rows)]))
    rep.tables.append(("Max-normalized (thesis Table 5.2 form)", "each column divided by its maximum",
                       ["run", "time", "cost", "energy", "occupancy"],
                       [[r.name] + [_f(scored.normalized[i][m]) for m in METRICS] for i, r in enumerate(rows)]))
    names = list(scored.strategies)
    weights = [[s] + [format(w, "g") for w in scored.strategies[s]] for s in names]
    rep.tables.append(("Weight strategies (thesis Table 5.3 form)", "Score = w1*T + w2*C + w3*E - w4*O, lower is better",
                       ["strategy", "w1 time", "w2 cost", "w3 energy", "w4 occupancy"], weights))
    score_rows = []
    for i, r in enumerate(rows):
        cells = [r.name, _f(r.accuracy, ".4f")]
        for s in names:
            v = _f(scored.scores[s][i])
            cells.append(f"**{v}**" if scored.best[s] == i else v)
        cells.append("" if scored.eligible[i] else f"excluded: {scored.ineligible_reason[i]}")
        score_rows.append(cells)
    floor_note = f"; accuracy floor {accuracy_floor}" if accuracy_floor is not None else ""
    rep.tables.append(("Scores (thesis Table 5.4 form)", f"bold = best per strategy{floor_note}",
                       ["run", "accuracy"] + names + ["note"], score_rows))
    rep.tables.append(("Best configuration per strategy", "",
                       ["strategy", "best run", "score", "accuracy"],
                       [[s, rows[b].name if b is not None else "none eligible",
                         _f(scored.scores[s][b]) if b is not None else "", _f(rows[b].accuracy, ".4f") if b is not None else ""]
                        for s, b in scored.best.items()]))
    if scored.affected:
        rep.tables.append(("Rows scored over fewer metrics", "weights of the present metrics scaled up to the "
                           "strategy's total; a missing metric is never taken as 0",
                           ["run", "left out", "why"],
                           [[rows[i].name, ", ".join(ms), "; ".join(rows[i].extra.get(m, "empty in the input") for m in ms)]
                            for i, ms in sorted(scored.affected.items())]))
    if baseline is not None:
        b = rows[baseline]
        cmp_rows = []
        for r in rows:
            speedup = b.time_s / r.time_s if b.time_s and r.time_s else None
            delta = r.accuracy - b.accuracy if r.accuracy is not None and b.accuracy is not None else None
            cmp_rows.append([r.name, _f(r.time_s, ".2f"), _f(r.accuracy, ".4f"), _f(speedup, ".3f"), _f(delta, "+.4f")])
        rep.tables.append((f"Against the baseline '{b.name}' (seed 000 Table 1 form)",
                           "speedup = baseline time / time", ["run", "time_s", "accuracy", "speedup", "accuracy change"],
                           cmp_rows))
    rep.plots = plots
    return rep


def to_markdown(rep: Report, plot_dir: str = "plots") -> str:
    out = [f"# {rep.title}", "", f"Source: {rep.source}", ""]
    out += [f"- {n}" for n in rep.notes] + ([""] if rep.notes else [])
    for title, note, headers, rows in rep.tables:
        out += [f"## {title}", ""] + ([note, ""] if note else [])
        out.append("| " + " | ".join(headers) + " |")
        out.append("|" + "---|" * len(headers))
        out += ["| " + " | ".join(str(c).replace("|", "/") for c in row) + " |" for row in rows]
        out.append("")
    out += ["## Plots", ""]
    for p in rep.plots:
        left = f" ({p['left_out']} run(s) without both values left out)" if p["left_out"] else ""
        out += [f"![{p['title']}]({plot_dir}/{p['stem']}.png){left}", ""]
    return "\n".join(out)


def to_html(rep: Report) -> str:
    e = html.escape
    out = ["<!doctype html><html><head><meta charset='utf-8'>", f"<title>{e(rep.title)}</title>",
           "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto}table{border-collapse:collapse;"
           "margin-bottom:1.5em}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:right}"
           "td:first-child,th:first-child{text-align:left}.note{color:#555}</style></head><body>",
           f"<h1>{e(rep.title)}</h1><p>Source: {e(rep.source)}</p>"]
    if rep.notes:
        out.append("<ul>" + "".join(f"<li>{e(n)}</li>" for n in rep.notes) + "</ul>")
    for title, note, headers, rows in rep.tables:
        out.append(f"<h2>{e(title)}</h2>" + (f"<p class='note'>{e(note)}</p>" if note else ""))
        out.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in headers) + "</tr>")
        for row in rows:
            cells = []
            for c in row:
                c = str(c)
                cells.append(f"<td><b>{e(c[2:-2])}</b></td>" if c.startswith("**") else f"<td>{e(c)}</td>")
            out.append("<tr>" + "".join(cells) + "</tr>")
        out.append("</table>")
    out.append("<h2>Plots</h2>")
    for p in rep.plots:
        data = base64.b64encode(p["png"]).decode()
        left = f" ({p['left_out']} run(s) without both values left out)" if p["left_out"] else ""
        out.append(f"<figure><img alt='{e(p['title'])}' src='data:image/png;base64,{data}'>"
                   f"<figcaption>{e(p['title'] + left)}</figcaption></figure>")
    out.append("</body></html>")
    return "\n".join(out)
