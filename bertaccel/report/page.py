"""The report as Markdown and as one self-contained HTML file, in layout.py's order: a table of
contents, the answer (headline, table, warnings, chart), the effect of each axis and the notes
open; every other section a fold the contents open; the single runs and the runs' names in an
appendix. In the HTML a figure with an SVG is inlined as SVG (hover tooltips, svg.py), else as a
base64 PNG; the Markdown links PNGs."""
from __future__ import annotations

import base64
import html
import re
from typing import Dict, List, Tuple

from .html_table import CSS, html_table
from .layout import APPENDIX_TITLE, Section, anchor, placed
from .render import Report, Table
from .summary import TITLE as ANSWER_TITLE

NOTES = "Notes on these runs"
OTHER_PLOTS = "Other plots"
# Following a link of the contents opens the fold it points into (a closed <details> would hide it).
OPEN_TARGET = ("<script>function openTarget(){var t=document.getElementById(location.hash.slice(1));"
               "if(!t)return;var d=t.tagName==='DETAILS'?t:t.querySelector('details');if(d)d.open=true;"
               "t.scrollIntoView();}window.addEventListener('hashchange',openTarget);openTarget();</script>")
PAGE_CSS = ("nav.toc{background:#f6f6f6;padding:6px 14px;margin:1em 0;font-size:13px}nav.toc>ol{margin:4px 0;columns:3}"
            "summary{cursor:pointer}summary h2{display:inline}details{margin:0.8em 0}")


def _left(p: Dict) -> str:
    return f" ({p['left_out']} run(s) without both values left out)" if p["left_out"] else ""


def _repeated(rep: Report) -> bool:
    return rep.answer is not None and rep.answer.verdict.repeated


def _sections(rep: Report) -> Tuple[List[Tuple[str, str, Section]], List[Dict]]:
    """[(id, title, section)] in order, with the notes after the open sections; the figures no table claims."""
    sections, rest = placed(rep.tables, rep.plots, _repeated(rep))
    out = []
    for k, sec in enumerate(sections):
        out.append((anchor(sec.title, k), sec.title, sec))
    return out, rest


def contents(rep: Report) -> List[Tuple[str, str, bool]]:
    """(id, title, in the appendix) of every section, as the contents list them."""
    sections, rest = _sections(rep)
    out, noted = [], False
    for sid, title, sec in sections:
        if not sec.open and not noted and rep.notes:
            out.append(("notes", NOTES, False))
            noted = True
        out.append((sid, title, sec.appendix))
    if rep.notes and not noted:
        out.append(("notes", NOTES, False))
    if rest:
        out.append(("other-plots", OTHER_PLOTS, False))
    return out


def _slug(title: str) -> str:
    """The anchor Markdown renderers give a heading (lower case, punctuation dropped, spaces as '-')."""
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title.lower()))


def _md_table(table: Table, level: str = "##") -> List[str]:
    title, note, headers, rows = table
    out = [f"{level} {title}", ""] + ([note, ""] if note else [])
    out.append("| " + " | ".join(headers) + " |")
    out.append("|" + "---|" * len(headers))
    out += ["| " + " | ".join(str(c).replace("|", "/") for c in row) + " |" for row in rows]
    return out + [""]


def _md_figures(plots: List[Dict], plot_dir: str) -> List[str]:
    return [line for p in plots for line in (f"![{p['title']}]({plot_dir}/{p['stem']}.png){_left(p)}", "")]


def to_markdown(rep: Report, plot_dir: str = "plots") -> str:
    out = [f"# {rep.title}", "", f"Source: {rep.source}", "", "Contents:", ""]
    for _, title, appendix in contents(rep):
        out.append(f"{'    ' if appendix else ''}- [{title}](#{_slug(title)})")
    out.append("")
    sections, rest = _sections(rep)
    noted = appendix = False
    for _, title, sec in sections:
        if not sec.open and not noted and rep.notes:
            out += [f"## {NOTES}", ""] + [f"- {n}" for n in rep.notes] + [""]
            noted = True
        if sec.appendix and not appendix:
            out += [f"## {APPENDIX_TITLE}", ""]
            appendix = True
        if title == ANSWER_TITLE:
            # (the labels' line in the lead's paragraph)
            out += [f"## {title}", "", f"**{rep.lead[0]}** " + " ".join(rep.lead[1:] + [rep.labels.line()]).strip(), ""]
            out += _md_table(sec.table)[2:]
            out += [f"> {w}\n>" for w in rep.lead_warnings] + ([""] if rep.lead_warnings else [])
        else:
            out += _md_table(sec.table, "###" if sec.appendix else "##")
        out += _md_figures(sec.plots, plot_dir)
    if rep.notes and not noted:
        out += [f"## {NOTES}", ""] + [f"- {n}" for n in rep.notes] + [""]
    if rest:
        out += [f"## {OTHER_PLOTS}", ""] + _md_figures(rest, plot_dir)
    return "\n".join(out)


def _html_figure(p: Dict) -> str:
    """An inline SVG (tooltips on hover) where the figure has one, else its PNG as base64."""
    e = html.escape
    caption = f"<figcaption>{e(p['title'] + _left(p))}</figcaption>"
    if p.get("svg"):
        return f"<figure class='chart' id='figure-{e(p['stem'])}'>{p['svg']}{caption}</figure>"
    data = base64.b64encode(p["png"]).decode()
    return f"<figure id='figure-{e(p['stem'])}'><img alt='{e(p['title'])}' src='data:image/png;base64,{data}'>{caption}</figure>"


def _html_toc(rep: Report) -> str:
    e = html.escape
    items: List[str] = []
    appendix: List[str] = []
    for sid, title, in_appendix in contents(rep):
        (appendix if in_appendix else items).append(f"<li><a href='#{e(sid)}'>{e(title)}</a></li>")
    if appendix:
        items.append(f"<li><a href='#appendix'>{e(APPENDIX_TITLE)}</a><ol>" + "".join(appendix) + "</ol></li>")
    return "<nav class='toc'><b>Contents</b><ol>" + "".join(items) + "</ol></nav>"


def _html_notes(rep: Report) -> str:
    e = html.escape
    return (f"<section id='notes'><h2>{NOTES}</h2><ul>" + "".join(f"<li>{e(n)}</li>" for n in rep.notes)
            + "</ul></section>")


def _html_section(rep: Report, sid: str, title: str, sec: Section, titles: Dict[str, str]) -> List[str]:
    e = html.escape
    body: List[str] = []
    if title == ANSWER_TITLE:
        body.append(f"<p class='lead'><b>{e(rep.lead[0])}</b> " + e(" ".join(rep.lead[1:])) + "</p>")
        if rep.labels.line():
            body.append(f"<p class='labels'>{e(rep.labels.line())}</p>")
    body += html_table(sec.table, titles)
    if title == ANSWER_TITLE:
        body += [f"<p class='warning'>{e(w)}</p>" for w in rep.lead_warnings]
    body += [_html_figure(p) for p in sec.plots]
    tag = "h3" if sec.appendix else "h2"
    if sec.open:
        return [f"<section id='{sid}'><{tag}>{e(title)}</{tag}>", *body, "</section>"]
    return [f"<section id='{sid}'><details><summary><{tag}>{e(title)}</{tag}></summary>", *body,
            "</details></section>"]


def to_html(rep: Report) -> str:
    e = html.escape
    out = ["<!doctype html><html><head><meta charset='utf-8'>", f"<title>{e(rep.title)}</title>",
           f"<style>{CSS}{PAGE_CSS}</style></head><body>", f"<h1>{e(rep.title)}</h1><p>Source: {e(rep.source)}</p>",
           _html_toc(rep)]
    sections, rest = _sections(rep)
    titles = rep.labels.titles()
    noted = appendix = False
    for sid, title, sec in sections:
        if not sec.open and not noted and rep.notes:
            out.append(_html_notes(rep))
            noted = True
        if sec.appendix and not appendix:
            out.append(f"<h2 id='appendix'>{e(APPENDIX_TITLE)}</h2>")
            appendix = True
        out += _html_section(rep, sid, title, sec, titles)
    if rep.notes and not noted:
        out.append(_html_notes(rep))
    if rest:
        out.append(f"<section id='other-plots'><details><summary><h2>{OTHER_PLOTS}</h2></summary>"
                   + "".join(_html_figure(p) for p in rest) + "</details></section>")
    out.append(OPEN_TARGET)
    out.append("</body></html>")
    return "\n".join(out)
