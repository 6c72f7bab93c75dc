"""A report that reads at many runs, on a real committed store (fp8 against bf16: 6 runs, two
configurations of 3 repeats, every run compiled): a table of contents that links every section,
the answer and the effects first and open, every other section a fold, the single runs in an
appendix each named with its seed, and notes that name each configuration once."""
from __future__ import annotations

import gzip
import re
import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

ROOT = Path(__file__).resolve().parent.parent
STORE = ROOT / "docs" / "results" / "stores" / "h200-fp8-minilm-imdb.db.gz"
SWEEP = "config-5e884036e6"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("layout")
    with gzip.open(STORE) as src, (tmp / "store.db").open("wb") as dst:
        shutil.copyfileobj(src, dst)
    p = warm_cli.run([sys.executable, "-m", "bertaccel.report", "--uri", f"sqlite:///{tmp / 'store.db'}", "--sweep",
                      SWEEP, "--baseline", "precision=bf16", "--out", str(tmp / "rep")],
                     capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    return (tmp / "rep" / "report.html").read_text(), (tmp / "rep" / "report.md").read_text()


def _sections(page: str):
    """(id, heading, folded) of each top-level section, in order."""
    out = []
    for m in re.finditer(r"<section id='([^']+)'>(<details><summary>)?<h([23])>(.*?)</h\3>", page):
        out.append((m.group(1), m.group(4), bool(m.group(2))))
    return out


def test_the_contents_link_every_section_and_every_link_lands(report):
    page, md = report
    toc = re.search(r"<nav class='toc'>(.*?)</nav>", page, re.S).group(1)
    links = re.findall(r"href='#([^']+)'", toc)
    ids = set(re.findall(r" id='([^']+)'", page))
    sections = _sections(page)
    assert len(sections) >= 10
    assert {sid for sid, _, _ in sections} <= set(links) and {"notes", "appendix"} <= set(links)
    assert all(link in ids for link in links), [x for x in links if x not in ids]
    assert len(links) == len(set(links))
    # The Markdown twin has its own contents, one link per heading it has.
    headings = re.findall(r"^#{2,3} (.+)$", md, re.M)
    md_links = re.findall(r"^\s*- \[(.+?)\]\(#", md, re.M)
    assert set(md_links) <= set(headings) and len(md_links) >= len(sections)


def test_the_answer_and_effects_lead_open_and_the_rest_is_folded(report):
    page, _ = report
    sections = _sections(page)
    (first, h1, fold1), (_, h2, fold2) = sections[:2]
    assert first == "answer" and h1.startswith("The answer") and h2.startswith("The effect of each axis")
    assert not fold1 and not fold2
    assert all(folded for sid, _, folded in sections[2:] if sid != "notes")  # (the notes on the data stay open)
    # The contents open a fold they point into (a closed <details> would hide the target).
    assert "function openTarget()" in page and "d.open=true" in page


def test_the_single_runs_are_in_the_appendix_each_with_its_seed(report):
    page, _ = report
    before, after = page.split("<h2 id='appendix'>", 1)
    for title in ("Scores per run", "Raw metrics", "Max-normalized"):
        assert f"<h3>{title}" in after and f"<h2>{title}" not in before, title
    raw = after.split("<h3>Raw metrics")[1].split("</table>")[0]
    names = re.findall(r"<tr><td class='n'>\d+</td><td[^>]*>([^<]+)</td>", raw)
    assert len(names) == 6 and all(re.search(r"\(seed \d+\)$", n) for n in names), names
    assert not [n for n, k in Counter(names).items() if k > 1]  # no label three times, told apart by nothing
    pareto = after.split("<h3>Pareto front over time, cost, energy and accuracy (runs)")[1].split("</table>")[0]
    for beaten in re.findall(r"no: beaten by ([^<]+)", pareto):
        assert "(seed " in beaten


def test_the_compiled_runs_note_names_each_configuration_once(report):
    page, md = report
    note = next(line for line in md.splitlines() if "compiled run(s) without an uncompiled run" in line)
    assert note.endswith("so no break-even: bf16 (3 runs), fp8 (3 runs)"), note
