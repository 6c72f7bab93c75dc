"""Markdown that does not render: the docs read as a user reads them, not as their source does.

`mkdocs build --strict` passes a page whose list follows a paragraph line with no blank line in
between: Python-Markdown then keeps the whole list inside the paragraph, and the page shows one
long paragraph with literal ` - ` bullets (a 1,500-word one once, on the concepts page). The same
goes for `**` that did not pair, a table row a stray line turned into text, and a formula's `*`
taken for emphasis (`w1*T + w2*C` reads "w1*T + w2*C* with the middle in italics).

Two checks of one rule:
- a fast one on the sources (docs/**/*.md, README.md): a list item directly under a paragraph
  line, outside fenced code, names its file:line;
- a slow one on the built site: every page's article, parsed with the stdlib HTML parser, holds
  no literal markdown in its text (code and pre blocks aside).
"""
from __future__ import annotations

import html.parser
import re
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest
from docs_build import build_site

ROOT = Path(__file__).resolve().parents[1]


def markdown_sources() -> List[Path]:
    """The pages a user reads: every docs page (the lab notebook too) and the README."""
    pages = sorted(p for p in (ROOT / "docs").rglob("*.md") if "stores" not in p.parts)
    assert len(pages) > 20, f"found too few docs pages: {pages}"
    return pages + [ROOT / "README.md"]


# ---------------------------------------------------------------------------------------------
# The source-level check
# ---------------------------------------------------------------------------------------------

LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+\S")
FENCE = re.compile(r"^\s*(```|~~~)")
# Lines that end a paragraph on their own (a list may follow them directly): headings, table
# rows, HTML, admonitions and tabs, horizontal rules, front matter and link definitions.
NOT_PARAGRAPH = re.compile(r"^\s*(?:#{1,6}\s|\||<|!!!|\?\?\?|===|---\s*$|\*\*\*\s*$|\[[^\]]+\]:\s)")


GLUED = "a list item right under a paragraph line: put a blank line above the list"
NESTED = ("a nested list item indented less than 4 spaces past its parent's marker: Python-"
          "Markdown flattens it into the parent list; indent it (and its lines) by 4")


def list_problems(lines: List[str]) -> Iterator[Tuple[int, str]]:
    """(1-based line, what is wrong) for each list item Python-Markdown does not render as its
    source means: one directly under a paragraph line (kept in the paragraph, bullets and all;
    an item's own lines may be followed by an item: that is the list; a paragraph under an item
    after a blank line may not), and one nested by fewer than 4 spaces (flattened into its parent's list)."""
    fence = None       # the fence that opened the code block we are in, if any
    # What the line before was: blank, item, list (inside a list), blank-in-list, paragraph,
    # code (an indented code block).
    previous = "blank"
    item_indent = -1   # the marker column of the list's last item (-1: not in a list)
    front_matter = bool(lines) and lines[0].strip() == "---"
    for number, line in enumerate(lines, 1):
        if front_matter:
            front_matter = number == 1 or line.strip() != "---"
            continue
        opener = FENCE.match(line)
        if fence is not None:
            if opener and opener.group(1) == fence:
                fence = None
            continue
        if opener:
            fence = opener.group(1)
            continue
        in_list = previous in ("item", "list", "blank-in-list")
        if not line.strip():
            previous = "blank-in-list" if in_list else ("code" if previous == "code" else "blank")
            continue
        indent = len(line) - len(line.lstrip())
        if previous in ("blank", "code") and indent >= 4:
            previous = "code"  # an indented code block: four spaces in, not under a list item
            continue
        if LIST_ITEM.match(line):
            if previous == "paragraph":
                yield number, GLUED
            elif in_list and item_indent < indent < item_indent + 4:
                yield number, NESTED
            previous, item_indent = "item", indent
        elif NOT_PARAGRAPH.match(line):
            previous = "blank"
        elif previous in ("item", "list"):
            previous = "list"  # a continuation of the item (lazy, or indented)
        else:
            # A paragraph, at the top or under an item after a blank line: Python-Markdown keeps
            # an item right under either in the paragraph (`- a`, ``, `    para`, `- b`).
            previous = "paragraph"
        if previous not in ("item", "list"):
            item_indent = -1


def test_list_problems_found_on_a_sample() -> None:
    """The rule on a small sample: the glued list is found, a proper one and code are not."""
    sample = ["Guaranteed:", "- one", "  continued", "- two", "", "Text.", "", "- fine",
              "```", "x", "- in code", "```", "## Head", "- after a heading", "", "1. a",
              "   para", "", "2. b", "", "Paragraph", "1. glued", "", "Text.", "",
              "    code:", "    - in code", "", "Para", "* glued"]
    assert list(list_problems(sample)) == [(2, GLUED), (22, GLUED), (30, GLUED)]
    assert list(list_problems(["---", "hide:", "  - toc", "---", "Text", "- glued"])) == [(6, GLUED)]
    nested = ["- a", "  - two spaces", "", "- b", "    - four spaces", "    - four too", "",
              "1. c", "   - three spaces"]
    assert list(list_problems(nested)) == [(2, NESTED), (9, NESTED)]
    in_item = ["- a", "", "    para under a", "- b glued to it", "", "- c", "  lazy", "- d"]
    assert list(list_problems(in_item)) == [(4, GLUED)]


def test_lists_render_as_written() -> None:
    """Every list in the sources has a blank line above it (or follows a heading, table or other
    list item), else the built page shows it as literal bullets in one paragraph; and a nested
    list is indented by 4 spaces, else it is flattened into its parent."""
    problems = [f"{page.relative_to(ROOT)}:{number}: {why}" for page in markdown_sources()
                for number, why in list_problems(page.read_text(encoding="utf-8").splitlines())]
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------------
# The built site
# ---------------------------------------------------------------------------------------------

# Text (outside code) that is markdown the parser did not take, each with what it means.
LITERAL = [
    (re.compile(r"\n[ \t]*(?:[-*+]|\d+[.)])[ \t]+\S"), "a list left as literal bullets in a paragraph"),
    (re.compile(r"\*\*"), "literal ** (bold that did not pair)"),
    (re.compile(r"(?m)^[ \t]*\|.*\|[ \t]*$"), "a table row left as text"),
    (re.compile(r"\|\s*:?-{3,}:?\s*\|"), "a table's delimiter row left as text"),
    (re.compile(r"\]\((?:[^)\s]+)\)"), "a link left as literal [text](target)"),
    (re.compile(r"(?m)^[ \t]*(?:!!!|\?\?\?)[ +]"), "an admonition left as text"),
    (re.compile(r"```"), "a code fence left as text"),
    (re.compile(r"\n[ \t]*#{1,6}[ \t]+\S"), "a heading left inside a paragraph"),
]
# Tags whose text is code, not prose: literal markdown is right there.
CODE = {"code", "pre", "script", "style", "kbd", "samp"}
# Tags that start a new run of inline text (emphasis inside a word is judged within one run).
BLOCK = {"p", "li", "td", "th", "h1", "h2", "h3", "h4", "h5", "h6", "div", "ul", "ol", "table",
         "tr", "blockquote", "dd", "dt", "details", "summary", "figure", "figcaption", "br"}


class ArticleText(html.parser.HTMLParser):
    """The prose of a built page's article: each text node outside code, and each <em> that
    opens or closes inside a word (`w1*T + w2*C` -> `w1<em>T + w2</em>C`: a formula's products
    taken for emphasis; emphasis in prose starts and ends at a word's edge)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.in_article = False
        self.code_depth = 0
        self.texts: List[str] = []  # each block's prose, a code span standing as one `X`
        self.prose = ""
        self.em_in_word: List[str] = []
        self.run = ""          # the inline text so far in the current block, code included
        self.em_closed = False  # an </em> just closed: the next character tells if it was mid-word

    def _new_block(self) -> None:
        if self.prose.strip():
            self.texts.append(self.prose)
        self.prose, self.run, self.em_closed = "", "", False

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag == "article":
            self.in_article = True
        if not self.in_article:
            return
        if tag in BLOCK:
            self._new_block()
        if tag in CODE:
            self.code_depth += 1
            self.prose += "X" if self.code_depth == 1 else ""
        if tag == "em" and self.run[-1:].isalnum():
            self.em_in_word.append(self.run[-40:] + "<em>")

    def handle_endtag(self, tag: str) -> None:
        if not self.in_article:
            return
        if tag == "article":
            self._new_block()
            self.in_article = False
            return
        if tag in CODE and self.code_depth:
            self.code_depth -= 1
        if tag in BLOCK:
            self._new_block()
        if tag == "em":
            self.em_closed = True

    def handle_data(self, data: str) -> None:
        if not self.in_article:
            return
        if self.em_closed and data[:1].isalnum():
            self.em_in_word.append(self.run[-40:] + "</em>" + data[:40])
        self.em_closed = False
        self.run += data
        if not self.code_depth:
            self.prose += data


def literal_markdown(page_html: str) -> List[str]:
    """What on one built page is markdown shown as text, one line per finding."""
    parser = ArticleText()
    parser.feed(page_html)
    found = [f"{why}: {' '.join(text[max(0, m.start() - 40):m.end() + 40].split())!r}"
             for text in parser.texts for pattern, why in LITERAL for m in pattern.finditer(text)]
    found += [f"emphasis inside a word (a formula's * taken for italics?): "
              f"{' '.join(s.split())!r}" for s in parser.em_in_word]
    return found


def test_literal_markdown_found_in_sample_html() -> None:
    """The HTML check on what Python-Markdown makes of each mistake, and not on code."""
    import markdown

    def render(source: str) -> str:
        return "<article>" + markdown.markdown(source, extensions=["tables"]) + "</article>"

    assert literal_markdown(render("Guaranteed:\n- one\n- two\n"))
    assert literal_markdown(render("Score = w1*T + w2*C, each over its maximum.\n"))
    assert literal_markdown(render("Text\n| a | b |\n|---|---|\n| 1 | 2 |\n"))
    assert literal_markdown(render("a **bold\n\nb** here\n"))
    fine = "Guaranteed:\n\n- one\n- *two* and **three**\n\n`w1*T + w2*C`\n\n    - code\n"
    assert literal_markdown(render(fine)) == []


@pytest.fixture(scope="module")
def built_site(tmp_path_factory) -> Path:
    """The site built strictly once for this module, into a temporary folder."""
    return build_site(tmp_path_factory)


def built_pages(site: Path) -> List[Tuple[str, str]]:
    """(path under the site, HTML) of every page mkdocs wrote, theme assets and 404 aside."""
    pages = [(p.relative_to(site).as_posix(), p.read_text(encoding="utf-8"))
             for p in sorted(site.rglob("*.html"))
             if p.relative_to(site).parts[0] not in ("assets", "404.html")]
    assert len(pages) > 20, f"the build wrote too few pages: {[p for p, _ in pages]}"
    return pages


@pytest.mark.slow
def test_built_pages_have_no_literal_markdown(built_site: Path) -> None:
    """Every built page's article: no literal bullets, `**`, table rows, links, fences or
    headings in its text, and no emphasis opened or closed inside a word."""
    problems = [f"{path}: {finding}" for path, page in built_pages(built_site)
                for finding in literal_markdown(page)]
    print(f"{len(problems)} problems")
    assert not problems, "markdown left as text on the built site:\n" + "\n".join(problems)
