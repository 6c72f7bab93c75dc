"""A report table as HTML that fits the page: the page's CSS, and each cell's wrapping, alignment and
tooltip (a run label's MLflow names, labels.py)."""
from __future__ import annotations

import html
import re
from typing import Dict, List, Optional

Table = tuple  # (title, note, headers, rows of cells), as render.py


# Tables fit the page (1,200 px): a header or a text cell wraps at its spaces, and a long word after
# a comma, '_' or '=' (<wbr>: strategy names, MLflow run names); a number (class n) never breaks and
# stands to the right, text to the left.
CSS = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto}table{border-collapse:collapse;"
       "margin-bottom:1.5em;max-width:100%}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;"
       "text-align:right;overflow-wrap:break-word}td.n{white-space:nowrap}td:not(.n){text-align:left}"
       "td:first-child,th:first-child{text-align:left}.note{color:#555}"
       ".lead{font-size:1.15em}.labels{color:#333}.warning{background:#fff4e5;border-left:4px solid #e67e22;"
       "padding:6px 10px;margin:6px 0}figure{margin:0 0 1.5em 0}svg{max-width:100%}svg .mark:hover{opacity:0.7}")
NUMBER = re.compile(r"[-+]?(\d[\d.,eE+-]*|null)( ?%| pts|x)?")
_RUNS_SUFFIX = re.compile(r" \(\d+ runs\)$")
_WBR = str.maketrans({c: c + "<wbr>" for c in ",_="})
_SPECIAL = re.compile(r"[&<>\"']")


def _cell(c: str, titles: Dict[str, str]) -> str:
    """One <td>: bold where marked '**', class n for a number, the MLflow name(s) of a run label as its title."""
    e = _escape
    bold = c.startswith("**") and c.endswith("**")
    text = c[2:-2] if bold else c
    attrs = " class='n'" if NUMBER.fullmatch(text) else ""
    full = titles.get(_RUNS_SUFFIX.sub("", text))
    if full:
        attrs += f" title='{e(full)}'"
    return f"<td{attrs}><b>{_breakable(text)}</b></td>" if bold else f"<td{attrs}>{_breakable(text)}</td>"


def _breakable(text: str) -> str:
    """Escaped, with a line break allowed after each ',', '_' and '=' (where a long word may wrap)."""
    return _escape(text).translate(_WBR)  # (escaping adds none of the three)


def _escape(text: str) -> str:
    """html.escape, skipped for text with nothing to escape (most cells: a table of 10,000 runs
    has ~400,000, and html.escape is five str.replace calls each)."""
    return html.escape(text) if _SPECIAL.search(text) else text


def html_table(table: Table, titles: Optional[Dict[str, str]] = None) -> List[str]:
    e = html.escape
    _, note, headers, rows = table
    out = [f"<p class='note'>{e(note)}</p>"] if note else []
    out.append("<table><tr>" + "".join(f"<th>{_breakable(h)}</th>" for h in headers) + "</tr>")
    for row in rows:
        out.append("<tr>" + "".join(_cell(str(c), titles or {}) for c in row) + "</tr>")
    return out + ["</table>"]
