"""User pages speak to a user: no issue numbers or team talk, and no term used before it is explained.

A new user reading the docs met "issue 47's speed goals", "the design card's sweep" (never
explained) and MFU, GPM, occupancy, launch-bound, cu_seqlens used long before (or without) any
explanation. docs/glossary.md explains them; each user page links a term to its entry where the
page first uses it (a link in the prose, a table or a list; headings, code, and the text of a
link to somewhere else do not count as a use).

User pages: docs/**/*.md and README.md, except the lab notebook (docs/lab/: a dated record of
measurements, which names the issues it was made for) and the pages generated from code
(GENERATED: their words come from the code that writes them). docs/contributing.md and
docs/architecture.md speak to contributors, but carry no issue numbers either.
Fast: the sources only, no build.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

from test_docs_rendered import FENCE, LIST_ITEM, ROOT

DOCS = ROOT / "docs"
GLOSSARY = DOCS / "glossary.md"
# Pages written by code: a link added by hand would go at the next regeneration.
GENERATED = {"reference/config.md", "results/at-a-glance.md"}

# Each enforced glossary entry (its anchor in docs/glossary.md) and the words that use it. Terms
# in capitals match as written; the others in any case. The glossary may hold more entries
# (configuration, warm-up) that common words name, not enforced.
TERMS: Dict[str, str] = {
    "interval": r"95 ?% (?:Student-t )?intervals?",
    "accuracy-floor": r"(?i:accuracy floor)",
    "amp": r"\bAMP\b|(?i:\bautocast\b|\bmixed precision\b)",
    "baseline": r"(?i:\bbaselines?\b)",
    "break-even": r"(?i:\bbreak-even\b)",
    "cuda-graph": r"\bCUDA[- ]graphs?\b|(?i:\bstep graphs?\b)",
    "packed-tokens": r"\bcu_seqlens\b|\bvarlen\b|(?i:\bpacked (?:real )?tokens\b)",
    "gemm": r"\bGEMMs?\b",
    "gpm": r"\bGPM\b",
    "launch-bound": r"(?i:\blaunch-bound\b|\bhost-bound\b)",
    "lightseq": r"\bLightSeq\b",
    "like-for-like": r"(?i:\blike[- ]for[- ]like\b)",
    "mfu": r"\bMFU\b",
    "nvml": r"\bNVML\b",
    "occupancy": r"(?i:\boccupancy\b)",
    "parent-run": r"(?i:\bparent run\b)",
    "pareto-front": r"\bPareto(?: front)?\b",
    "pue": r"\bPUE\b",
    "repeats": r"(?i:\brepeats\b)",
    "readmes-sweep": r"(?i:\bthe README's sweep\b)",
    "sm-activity": r"\bSM activ(?:e|ity)\b",
    "strategy": r"(?i:\bstrateg(?:y|ies)\b)",
    "tf32": r"\bTF32\b",
    "thesis": r"(?i:\bthe thesis\b)",
}
PATTERNS = {anchor: re.compile(words) for anchor, words in TERMS.items()}

# Team talk: an issue number, the team's name for the README's sweep.
TEAM_TALK = [
    (re.compile(r"(?i)\bissues? #?\d+|(?<![\w&/])#\d{1,4}\b(?![-\w])"), "an issue number"),
    (re.compile(r"(?i)\bdesign card\b"), "'design card' (say: the README's sweep)"),
]


def user_pages() -> List[Path]:
    pages = [p for p in sorted(DOCS.rglob("*.md")) if "lab" not in p.relative_to(DOCS).parts
             and "stores" not in p.parts and p != GLOSSARY
             and p.relative_to(DOCS).as_posix() not in GENERATED]
    assert len(pages) > 15, pages
    return pages + [ROOT / "README.md"]


def dedent_containers(lines: List[str]) -> Tuple[List[str], List[int]]:
    """The lines with the bodies of admonitions and content tabs (`!!! note`, `??? note`,
    `=== "GPU"`, their content indented by 4) moved left by 4, as Markdown reads them; and how
    many columns each line lost, to map a column back to the source."""
    lost = [0] * len(lines)
    out = list(lines)
    for _ in range(3):  # a container in a container in a container, at most
        body = False
        for i, line in enumerate(out):
            if re.match(r"^(?:!!!|\?\?\?\+?|===)\s", line):
                body = True
            elif body and (not line.strip() or line.startswith("    ")):
                if line.strip():
                    out[i], lost[i] = line[4:], lost[i] + 4
            else:
                body = False
    return out, lost


def prose_blocks(lines: List[str]) -> Iterator[List[int]]:
    """Runs of consecutive prose lines (0-based indices), code, headings and front matter left
    out: fenced code, indented code (4 spaces in, not under a list item), `#` headings, HTML
    lines, admonition and tab titles."""
    fence, front = None, bool(lines) and lines[0].strip() == "---"
    block: List[int] = []
    in_list, previous_blank = False, True
    for i, line in enumerate(lines):
        if front:
            front = i == 0 or line.strip() != "---"
            continue
        opener = FENCE.match(line)
        if fence is not None:
            fence = None if opener and opener.group(1) == fence else fence
            continue
        prose = bool(line.strip())
        if opener:
            fence, prose = opener.group(1), False
        elif previous_blank and not in_list and line.startswith("    "):
            prose = False  # an indented code block
        elif re.match(r"^\s*(?:#{1,6}\s|<|!!!|\?\?\?|===)", line):
            prose = False
        if prose:
            block.append(i)
        elif block:
            yield block
            block = []
        if line.strip():
            in_list = bool(LIST_ITEM.match(line)) or (in_list and (line.startswith(" ")
                                                                  or not previous_blank))
        previous_blank = not line.strip()
    if block:
        yield block


CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^()\s]*(?:\([^()\s]*\))?[^()\s]*)"
                  r"(?:\s+\"[^\"]*\")?\)")
# Not the page's own words: HTML tags, attribute lists, URLs, and quotations ("A tie: ... leads
# under every strategy": the report's or the console's words, quoted as they print).
FIGURE_BLOCK = re.compile(r"<!-- figure: [^>]*-->.*?<!-- /figure -->", re.S)
MASKED = re.compile(r"<[^>\n]+>|\{[:#][^}\n]*\}|https?://\S+|\"[^\"]{1,600}\"")


@dataclass
class Use:
    anchor: str
    line: int     # 0-based, in the page's lines
    column: int   # in the source line
    text: str
    linked: bool  # a link to the glossary entry


def term_uses(page: Path) -> Iterator[Use]:
    """Every use of a glossary term in a page's prose, and every link to a glossary entry, in
    the page's order."""
    # A generated figure block (bertaccel/report/docs_figures.py) is the code's text, rewritten on
    # every regeneration: a link put in it by hand would be lost, so it is not a use.
    text = FIGURE_BLOCK.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), page.read_text(encoding="utf-8"))
    source = text.splitlines()
    lines, lost = dedent_containers(source)
    for block in prose_blocks(lines):
        text = "\n".join(lines[i] for i in block)
        starts = [0]
        for i in block[:-1]:
            starts.append(starts[-1] + len(lines[i]) + 1)
        work = list(text)
        found: List[Tuple[int, str, str, bool]] = []  # (offset, anchor, text, linked)

        def mask(start: int, end: int) -> None:
            for k in range(start, end):
                if work[k] != "\n":
                    work[k] = "\0"

        for m in CODE_SPAN.finditer(text):  # a code span naming a term by itself is a use
            for anchor, pattern in PATTERNS.items():
                if pattern.fullmatch(m.group(2).strip()):
                    found.append((m.start(), anchor, m.group(0), False))
            mask(m.start(), m.end())
        masked_text = "".join(work)
        for m in LINK.finditer(masked_text):
            target = text[m.start(2):m.end(2)]
            if "glossary.md#" in target and not m.group(0).startswith("!"):
                found.append((m.start(), target.split("#", 1)[1], text[m.start():m.end()], True))
            found[:] = [f for f in found if not (m.start() <= f[0] < m.end()) or f[3]]
            mask(m.start(), m.end())
        for m in MASKED.finditer("".join(work)):
            mask(m.start(), m.end())
        prose = "".join(work)
        for anchor, pattern in PATTERNS.items():
            for m in pattern.finditer(prose):
                found.append((m.start(), anchor, m.group(0), False))
        for offset, anchor, words, linked in sorted(found, key=lambda f: f[0]):
            row = max(k for k, s in enumerate(starts) if s <= offset)
            line = block[row]
            yield Use(anchor, line, offset - starts[row] + lost[line], words, linked)


def unexplained(page: Path) -> List[Use]:
    """Each term's first use on the page where it is not a link to its glossary entry."""
    first: Dict[str, Use] = {}
    for use in term_uses(page):
        first.setdefault(use.anchor, use)
    return [use for use in first.values() if not use.linked]


def glossary_anchors() -> List[str]:
    return re.findall(r"^## .*\{#([\w-]+)\}\s*$", GLOSSARY.read_text(encoding="utf-8"), re.M)


def test_every_enforced_term_has_an_entry() -> None:
    missing = sorted(set(TERMS) - set(glossary_anchors()))
    assert not missing, f"docs/glossary.md has no entry {{#...}} for: {missing}"


def test_a_term_is_linked_at_its_first_use_on_the_sample() -> None:
    """The rule on a sample page: code, headings and other links are not uses; the first use
    must be the glossary link."""
    import tempfile

    sample = ["# MFU in a heading", "", "Read `mfu` and [the MFU page](measurements.md) first.",
              "", "```", "MFU in code", "```", "", "| col | the [MFU](glossary.md#mfu) |",
              "", "Then GPM, and", "[GPM](glossary.md#gpm) too; AMP as a code span `AMP`.", "",
              'The report says "the baseline is ..."; quoted, not a use.', "",
              "=== \"tab\"", "", "    A [baseline](glossary.md#baseline), then the baseline."]
    with tempfile.TemporaryDirectory() as folder:
        page = Path(folder) / "sample.md"
        page.write_text("\n".join(sample), encoding="utf-8")
        uses = [(u.anchor, u.line + 1, u.column, u.linked) for u in term_uses(page)]
        bad = [(u.anchor, u.line + 1, u.column) for u in unexplained(page)]
    assert uses == [("mfu", 9, 12, True), ("gpm", 11, 5, False), ("gpm", 12, 0, True),
                    ("amp", 12, 28, False), ("amp", 12, 47, False),
                    ("baseline", 18, 6, True), ("baseline", 18, 49, False)]
    assert bad == [("gpm", 11, 5), ("amp", 12, 28)]


def test_terms_are_linked_to_the_glossary_at_first_use() -> None:
    """Every user page links each glossary term at its first use (run with -vv for the list)."""
    problems = []
    for page in user_pages():
        lines = page.read_text(encoding="utf-8").splitlines()
        link = os.path.relpath(GLOSSARY, page.parent).replace(os.sep, "/")
        for use in unexplained(page):
            problems.append(f"{page.relative_to(ROOT)}:{use.line + 1}: '{use.text}' before it "
                            f"links to the glossary: [{use.text}]({link}#{use.anchor})  "
                            f"| {lines[use.line].strip()[:70]}")
    assert not problems, (f"{len(problems)} terms used before their glossary link:\n"
                          + "\n".join(problems))


def test_no_team_talk_in_user_pages() -> None:
    """No issue numbers or 'design card' in a user page (contributing.md and architecture.md
    included); the lab notebook is a dated record and keeps them."""
    problems = []
    for page in user_pages():
        lines, _ = dedent_containers(page.read_text(encoding="utf-8").splitlines())
        for block in prose_blocks(lines):
            for i in block:
                prose = CODE_SPAN.sub("", lines[i])  # a command's output may say `#0 : ...`
                for pattern, what in TEAM_TALK:
                    for m in pattern.finditer(prose):
                        problems.append(f"{page.relative_to(ROOT)}:{i + 1}: {what}: "
                                        f"{lines[i].strip()[:90]!r}")
    assert not problems, "team talk in user pages:\n" + "\n".join(problems)


def test_team_talk_found_on_a_sample() -> None:
    found = [what for text in ("Neither of issue 47's speed goals", "fixed in #47.",
                               "the design card's sweep", "see Issues #12")
             for pattern, what in TEAM_TALK if pattern.search(text)]
    assert len(found) == 4, found
    clean = ["[link](page.md#47-heading)", "a C# tool", "&#8212;",
             "issue the command"]
    assert not [t for t in clean for pattern, _ in TEAM_TALK if pattern.search(t)]
