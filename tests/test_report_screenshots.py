"""benchmarks/report_screenshots.py: the pictures of docs/first-report.md, cropped from the report
of two real H200 sweeps (tests/data/). The committed pictures must be the ones the script makes and
the page shows; the sections it crops must still be in the report the CLI writes now (a renamed
section fails here, not silently in the docs); and the script must make readable crops."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from browser import PACKAGES, _binaries
from services import apt_install

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "report_screenshots.py"
PAGE = ROOT / "docs" / "first-report.md"
IMG = ROOT / "docs" / "img" / "first-report"


def _script():
    spec = importlib.util.spec_from_file_location("report_screenshots", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


shots = _script()


def test_every_shot_is_committed_and_on_the_page():
    page = PAGE.read_text()
    shown = set(re.findall(r"img/first-report/([\w.-]+\.png)", page))
    made = {s.file for s in shots.SHOTS}
    assert shown == made, f"the page shows {sorted(shown - made)} that the script does not make, " \
                          f"and misses {sorted(made - shown)}"
    for name in made:
        path = IMG / name
        assert path.is_file(), f"{path} is missing: run python benchmarks/report_screenshots.py"
        assert path.stat().st_size <= shots.MAX_BYTES, f"{path} is over {shots.MAX_BYTES} bytes"
    for store in shots.STORES.values():
        assert store.path.is_file(), store.path
        assert f"--sweep {store.sweep}" in page, f"the page does not show how to open the {store.sweep} report"


@pytest.mark.slow
def test_the_cropped_sections_are_in_the_reports_and_a_renamed_one_is_caught(tmp_path):
    """--check makes both reports with the real CLI and finds every cropped heading; the same
    check on a report whose effects section is renamed names that section."""
    proc = subprocess.run([sys.executable, str(SCRIPT), "--check", "--keep", str(tmp_path)], capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "card: 3 sections found" in proc.stdout and "grid: 6 sections found" in proc.stdout, proc.stdout
    html = (tmp_path / "grid-report" / "report.html").read_text()
    assert shots.missing(html, "grid") == []
    renamed = html.replace("<h2>The effect of each axis", "<h2>What each axis does")
    assert renamed != html
    assert shots.missing(renamed, "grid") == ["The effect of each axis"]


@pytest.mark.slow
def test_the_script_crops_the_card_report_at_a_readable_size(tmp_path):
    """The README sweep's three shots, by the real script in headless Chromium: each a PNG at two
    device pixels per CSS pixel (or the weight map's own pixels), under the size limit."""
    if _binaries() is None:
        why = apt_install(PACKAGES, "Chromium")
        if why is not None:
            pytest.skip(why)
    proc = subprocess.run([sys.executable, str(SCRIPT), "--only", "card", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    from PIL import Image

    card = [s for s in shots.SHOTS if s.store == "card"]
    assert sorted(p.name for p in tmp_path.glob("*.png")) == sorted(s.file for s in card)
    for shot in card:
        path = tmp_path / shot.file
        with Image.open(path) as img:
            width, height = img.size
        assert width <= shot.width * shot.scale + 2 * shots.PAD_PX
        # a section or its figure, never a sliver: the answer fills the 800 px window at 2x
        assert width >= 0.8 * shot.width * shot.scale if shot.part is None else width >= 600, (shot.file, width)
        assert height >= 300, (shot.file, height)
        assert path.stat().st_size <= shots.MAX_BYTES
