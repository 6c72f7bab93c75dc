"""The screenshots of docs/first-report.md: the report of two real sweeps, cropped to its sections.

    python benchmarks/report_screenshots.py [--out docs/img/first-report] [--only card|grid]
    python benchmarks/report_screenshots.py --check     # only: is every cropped section in the reports?

Each store is a real sweep on one H200 (tests/data/): `card` is the README's sweep (four runs and
the default job as baseline), `grid` the thesis grid with sweep.repeats=3 (72 runs). The report is
made by the real CLI (`python -m bertaccel.report`), opened in headless Chromium 800 px wide at
2 device pixels per CSS pixel (the docs show it about 750 px wide: text stays near its own size),
and each shot is one `<section>` of it, found by the start of its heading, or one element inside it.
A heading the report no longer has is an error, so a renamed section cannot leave a stale picture.
Needs Chromium and its driver (Debian: apt-get install chromium chromium-driver) and Pillow.
"""
from __future__ import annotations

import argparse
import gzip
import io
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "img" / "first-report"
WIDTH_PX = 800  # the window, in CSS pixels
SCALE = 2  # device pixels per CSS pixel: sharp text once the docs shrink the picture to ~750 px
HEIGHT_PX = 6000  # taller than any cropped section, so no shot is cut at the window's edge
MAX_BYTES = 300_000  # a docs page of eight shots stays light (the answers, ten columns wide, are the largest)
PAD_PX = 16  # white margin around each crop, in device pixels


@dataclass(frozen=True)
class Store:
    path: Path
    sweep: str


STORES: Dict[str, Store] = {
    "card": Store(ROOT / "tests" / "data" / "h200_card_sweep.db.gz", "config-b32a167b41"),
    "grid": Store(ROOT / "docs" / "results" / "stores" / "h200-thesis-grid-repeats.db.gz", "thesis_grid-bf4de72724"),
}


@dataclass(frozen=True)
class Shot:
    store: str
    heading: str  # the start of the section's <h2> text; exactly one section may match
    file: str
    part: Optional[str] = None  # a CSS selector inside the section: crop to its first match
    width: int = WIDTH_PX
    scale: int = SCALE


SHOTS: List[Shot] = [
    # The answer's table has ten columns: a laptop's width, not a phone's.
    Shot("card", "The answer: which configuration to adopt", "card-answer.png", width=1100),
    Shot("card", "Pareto front over time, cost, energy and accuracy (runs)", "card-pareto.png"),
    # The weight map is a 1,100 px raster: taken whole (a wider window) at its own pixels.
    Shot("card", "Weight sensitivity", "card-weight-map.png", part="figure", width=1200, scale=1),
    Shot("grid", "The answer: which configuration to adopt", "grid-answer.png", width=1100),
    Shot("grid", "The effect of each axis", "grid-effects.png"),
    Shot("grid", "Best configuration per strategy", "grid-repeats.png"),
    Shot("grid", "Pareto front over time, cost, energy and accuracy (configurations", "grid-pareto.png"),
    # 72 runs: the table is too long to show; its plot is the picture.
    Shot("grid", "Pareto front over time, cost, energy and accuracy (runs)", "grid-pareto-plot.png", part="figure"),
    Shot("grid", "Weight sensitivity", "grid-weight-map.png", part="figure", width=1200, scale=1),
]


class _Headings(HTMLParser):
    """The text of every <h2> or <h3> (an appendix section's) that opens a <section> of the report."""

    def __init__(self) -> None:
        super().__init__()
        self.found: List[str] = []
        self._in_h2 = False

    def handle_starttag(self, tag, attrs):
        if tag in ("h2", "h3"):
            self._in_h2 = True
            self.found.append("")

    def handle_endtag(self, tag):
        if tag in ("h2", "h3"):
            self._in_h2 = False

    def handle_data(self, data):
        if self._in_h2:
            self.found[-1] += data


def headings(html: str) -> List[str]:
    parser = _Headings()
    parser.feed(html)
    return [h.strip() for h in parser.found]


def missing(html: str, store: str) -> List[str]:
    """The shots of `store` whose heading starts no section, or more than one, of this report."""
    found = headings(html)
    return [s.heading for s in SHOTS if s.store == store and sum(h.startswith(s.heading) for h in found) != 1]


def make_report(name: str, work: Path) -> Path:
    """The report of one store by the real CLI; the path of its report.html."""
    store = STORES[name]
    db = work / f"{name}.db"
    db.write_bytes(gzip.decompress(store.path.read_bytes()))
    out = work / f"{name}-report"
    proc = subprocess.run([sys.executable, "-m", "bertaccel.report", "--sweep", store.sweep,
                           "--uri", f"sqlite:///{db}", "--out", str(out)],
                          capture_output=True, text=True, cwd=work)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"report_screenshots: the report of {store.path.name} failed: {last}")
    return out / "report.html"


def _browser():
    """Headless Chromium; each shot sets its window's width and scale (shoot)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not (chromium and driver):
        raise SystemExit("report_screenshots: Chromium or chromedriver is not on PATH; "
                         "install them (apt-get install chromium chromium-driver)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    # --no-sandbox: Chromium's sandbox refuses to run as root (CI, containers).
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
                f"--window-size={WIDTH_PX},{HEIGHT_PX}"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(executable_path=driver), options=opts)


def _compact(png: bytes) -> bytes:
    """A white margin, then 64 colours (fewer while that is over MAX_BYTES): a screenshot of text
    and flat charts loses nothing visible and shrinks 3-5 times."""
    from PIL import Image, ImageOps

    img = ImageOps.expand(Image.open(io.BytesIO(png)).convert("RGB"), border=PAD_PX, fill="white")
    for colors in (64, 32, 16):
        buf = io.BytesIO()
        img.quantize(colors=colors, method=Image.Quantize.MEDIANCUT).save(buf, format="PNG", optimize=True)
        if buf.tell() <= MAX_BYTES:
            break
    return buf.getvalue()


def shoot(html: Path, shots: List[Shot], out: Path, driver) -> List[Path]:
    from selenium.webdriver.common.by import By

    driver.get(html.as_uri())
    # Every fold open, as a reader who clicked it sees the section.
    driver.execute_script("document.querySelectorAll('details').forEach(d => d.open = true)")
    sections = {s.find_element(By.CSS_SELECTOR, "h2, h3").text.strip(): s
                for s in driver.find_elements(By.CSS_SELECTOR, "body > section")}
    written = []
    for shot in shots:
        # The window as a screen of that width and pixel density shows it (the layout reflows).
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
            "width": shot.width, "height": HEIGHT_PX, "deviceScaleFactor": shot.scale, "mobile": False})
        (element,) = [s for h, s in sections.items() if h.startswith(shot.heading)]
        if shot.part:
            element = element.find_element(By.CSS_SELECTOR, shot.part)
        wide, tall = driver.execute_script("return [arguments[0].scrollWidth > arguments[0].clientWidth + 1,"
                                           " arguments[0].getBoundingClientRect().height]", element)
        if wide or tall > HEIGHT_PX:
            raise SystemExit(f"report_screenshots: {shot.file}: the section does not fit {shot.width}x{HEIGHT_PX} px;"
                             " crop to a part of it (Shot.part)")
        png = _compact(element.screenshot_as_png)
        if len(png) > MAX_BYTES:
            raise SystemExit(f"report_screenshots: {shot.file} is {len(png):,} bytes (over {MAX_BYTES:,});"
                             " crop to a part of the section (Shot.part)")
        path = out / shot.file
        path.write_bytes(png)
        written.append(path)
    return written


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT, help=f"where the PNGs go (default {OUT.relative_to(ROOT)})")
    ap.add_argument("--only", choices=sorted(STORES), help="one store's shots only")
    ap.add_argument("--check", action="store_true", help="make the reports and check their sections; no browser")
    ap.add_argument("--keep", type=Path, help="write the reports here (default: a temporary folder)")
    args = ap.parse_args(argv)
    names = [args.only] if args.only else list(STORES)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        reports = {name: make_report(name, work) for name in names}
        for name, html in reports.items():
            gone = missing(html.read_text(), name)
            if gone:
                raise SystemExit(f"report_screenshots: the {name} report has no one section headed "
                                 f"{gone[0]!r}: update SHOTS in benchmarks/report_screenshots.py")
            print(f"{name}: {sum(s.store == name for s in SHOTS)} sections found in {html}")
        if args.check:
            return 0
        args.out.mkdir(parents=True, exist_ok=True)
        driver = _browser()
        try:
            for name, html in reports.items():
                for path in shoot(html, [s for s in SHOTS if s.store == name], args.out, driver):
                    print(f"{path} ({path.stat().st_size:,} bytes)")
        finally:
            driver.quit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
