"""How long the report is to read: the HTML report of a committed store, measured in headless
Chromium at 1,200 px wide, as delivered (the folds closed) and with every fold open, with its
number of sections; optionally a picture of its first screen and of its table of contents.

    python benchmarks/report_length.py                       # the thesis grid (72 runs, 3 repeats)
    python benchmarks/report_length.py --store docs/results/stores/h200-fp8-minilm-imdb.db.gz \\
        --sweep config-5e884036e6 --baseline precision=bf16 --shots /tmp/shots

Prints one table row per store: px closed, px open, sections, the first screen's share of the page.
"""
from __future__ import annotations

import argparse
import gzip
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parent.parent
GRID = ("docs/results/stores/h200-thesis-grid-repeats.db.gz", "thesis_grid-bf4de72724")
WIDTH_PX, SCREEN_PX = 1200, 900  # a laptop's window


def report(store: Path, sweep: str, baseline: Optional[str], work: Path) -> Path:
    db = work / "store.db"
    with gzip.open(store) as src, db.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    out = work / "report"
    p = subprocess.run([sys.executable, "-m", "bertaccel.report", "--uri", f"sqlite:///{db}", "--sweep", sweep,
                        "--out", str(out)] + (["--baseline", baseline] if baseline else []),
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"report_length: the report failed: {p.stderr.strip().splitlines()[-1:]}")
    return out / "report.html"


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                f"--window-size={WIDTH_PX},{SCREEN_PX}"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)


def measure(html: Path, driver, shots: Optional[Path], stem: str) -> List[str]:
    from selenium.webdriver.common.by import By

    driver.get(html.as_uri())
    height = "return document.documentElement.scrollHeight"
    closed = driver.execute_script(height)
    sections = len(driver.find_elements(By.CSS_SELECTOR, "body > section"))
    if shots is not None:
        shots.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(shots / f"{stem}-first-screen.png"))
        driver.find_element(By.CSS_SELECTOR, "nav.toc").screenshot(str(shots / f"{stem}-contents.png"))
    driver.execute_script("document.querySelectorAll('details').forEach(d => d.open = true)")
    opened = driver.execute_script(height)
    return [f"{closed:,}", f"{opened:,}", str(sections), f"{SCREEN_PX / closed:.0%}"]


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", default=GRID[0], help="a committed .db.gz (default: the thesis grid's)")
    ap.add_argument("--sweep", default=GRID[1])
    ap.add_argument("--baseline", help="the report's --baseline")
    ap.add_argument("--shots", type=Path, help="save the first screen and the contents as PNGs here")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        html = report(ROOT / a.store, a.sweep, a.baseline, Path(tmp))
        driver = browser()
        try:
            cells = measure(html, driver, a.shots, Path(a.store).name.replace(".db.gz", ""))
        finally:
            driver.quit()
    print(f"| store | px at {WIDTH_PX} px, folds closed | px, every fold open | sections | first screen |")
    print("|---|---|---|---|---|")
    print(f"| {a.store} ({a.sweep}{', --baseline ' + a.baseline if a.baseline else ''}) | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
