"""The docs site as a reader opens it: built strictly, served from a local folder with no other
host, every page loaded in headless Chromium (tests/browser.py).

`mkdocs build --strict` catches broken links and anchors, but not what only shows in a browser:
a table a stray paragraph splits renders as raw `| model | ...` text, and a page that asks another
host for something (Google Fonts, mermaid from a CDN) shows raw diagram source or other fonts
offline, the way this tool is meant to run. This test fails on each of those, naming the page.
"""
from __future__ import annotations

import functools
import http.server
import threading
import time
from pathlib import Path
from typing import Iterator, List
from urllib.parse import urlsplit

import pytest
from docs_build import build_site
from browser import browser  # noqa: F401  (the headless Chromium fixture)

ROOT = Path(__file__).resolve().parents[1]
# Material re-renders a mermaid block after the page's load event; how long to wait for it.
MERMAID_WAIT_S = 20.0

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built as .ci/run builds it (strict), into a temporary folder."""
    return build_site(tmp_path_factory)


@pytest.fixture
def served(site: Path) -> Iterator[str]:
    """The built site over HTTP on 127.0.0.1 (the search worker and fetches need http://)."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:  # one line per request would bury a failure
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _pages(site: Path) -> List[str]:
    """Every page's path under the site, from the files mkdocs wrote (directory URLs)."""
    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html")
                   if not p.relative_to(site).parts[0].startswith("assets"))
    assert "index.html" in pages and len(pages) > 10, f"the build wrote too few pages: {pages}"
    return pages


# A paragraph the Markdown table parser did not take: it starts with a pipe, or holds a
# delimiter row (`|---|---|`, `| --- | :--: |`).
RAW_TABLE = """
return Array.from(document.querySelectorAll('article p')).map(p => p.textContent.trim())
  .filter(t => t.startsWith('|') || /\\|\\s*:?-{3,}:?\\s*\\|/.test(t)).map(t => t.slice(0, 80));
"""
# Every resource the page asked for (scripts, styles, fonts, images, fetches), failed ones too:
# Chromium keeps a Resource Timing entry for a request whose host could not be reached.
REQUESTS = "return performance.getEntriesByType('resource').map(e => e.name);"


def _rendered_mermaid(driver) -> int:
    """Diagrams Material rendered: a div.mermaid whose (closed) shadow root holds an <svg>. A
    closed shadow root is out of the page's own JS reach, so read the DOM through DevTools."""
    doc = driver.execute_cdp_cmd("DOM.getDocument", {"depth": -1, "pierce": True})["root"]

    def has_svg(node) -> bool:
        return node.get("nodeName") == "svg" or any(
            has_svg(c) for c in node.get("children", []) + node.get("shadowRoots", []))

    def count(node) -> int:
        attrs = node.get("attributes", [])
        classes = dict(zip(attrs[::2], attrs[1::2])).get("class", "").split()
        if node.get("nodeName") == "DIV" and "mermaid" in classes:
            return int(any(has_svg(r) for r in node.get("shadowRoots", [])))
        return sum(count(c) for c in node.get("children", []) + node.get("shadowRoots", [])
                   + ([node["contentDocument"]] if "contentDocument" in node else []))
    return count(doc)


def test_every_page_renders_offline(site: Path, served: str, browser) -> None:
    """Every page: no request to another host, no table left as raw text, every mermaid diagram
    drawn. One browser session for all pages, so the test stays well under a minute."""
    problems: List[str] = []
    host = urlsplit(served).netloc
    pages = _pages(site)
    for page in pages:
        diagrams = (site / page).read_text(encoding="utf-8").count('<pre class="mermaid">')
        browser.get(f"{served}/{page}")
        drawn = _rendered_mermaid(browser)
        deadline = time.monotonic() + MERMAID_WAIT_S
        while drawn < diagrams and time.monotonic() < deadline:
            time.sleep(0.25)
            drawn = _rendered_mermaid(browser)
        if drawn < diagrams:
            problems.append(f"{page}: {diagrams - drawn} of {diagrams} mermaid diagrams left as "
                            "raw source (is mermaid bundled in mkdocs.yml's extra_javascript?)")
        for text in browser.execute_script(RAW_TABLE):
            problems.append(f"{page}: a table renders as raw text: {text!r} (a paragraph or "
                            "blank line inside the table?)")
        for url in browser.execute_script(REQUESTS):
            parts = urlsplit(url)
            if parts.scheme in ("http", "https", "ws", "wss") and parts.netloc != host:
                problems.append(f"{page}: requests another host: {url}")
    print(f"{len(pages)} pages checked, {len(problems)} problems")
    assert not problems, "the docs site does not render offline:\n" + "\n".join(problems)



def test_search_ranks_the_report_first(site: Path, served: str, browser) -> None:
    """A user's question finds the page that answers it: "accuracy floor" is the report's
    setting, so a report page (its front matter's `search: boost`) ranks above the results pages
    and the Lab notebook (boost below 1), which mention the floor in passing."""
    from selenium.webdriver.common.by import By

    browser.get(f"{served}/index.html")
    browser.execute_script("document.querySelector('#__search').checked = true")
    box = browser.find_element(By.CSS_SELECTOR, "input.md-search__input")
    deadline = time.monotonic() + 20
    hits: List[str] = []
    while not hits and time.monotonic() < deadline:
        if not box.get_attribute("value"):  # typed once the search worker is ready to take it
            box.send_keys("accuracy floor")
        time.sleep(0.5)
        hits = [a.get_attribute("href") for a in
                browser.find_elements(By.CSS_SELECTOR, ".md-search-result__item > a")]
    assert hits, "the site's search gave no result for 'accuracy floor'"
    first = urlsplit(hits[0]).path
    assert first.startswith(("/report/", "/first-report/")), (
        f"'accuracy floor' ranks {first} first, above the report: {[urlsplit(h).path for h in hits[:5]]}")
