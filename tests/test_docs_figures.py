"""The docs' measured figures cannot drift (bertaccel/report/docs_figures.py): every
<!-- figure: KEY --> block in a user page is its KEY's one computation from a committed store or a
real command, a page that shows a figure has its block, and a figure on two pages is the same.

The pages' blocks are checked against the stores here; the blocks made by running commands (the
sweep resumed on the README's store, the report, the plan) in the slow test that runs the CLI."""
from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from bertaccel.report import docs_figures as df
from bertaccel.report.docs_figures import BLOCK, FIGURES, PLACES, compute, fill, problems, read_pages
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

ROOT = Path(__file__).resolve().parents[1]
# The figures a command makes (a process each): checked by the CLI test below.
COMMANDS = ("card-sweep", "card-report-best", "card-plan", "card-plan-range")
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def test_a_stale_block_a_missing_one_and_two_pages_that_disagree_are_each_named():
    values = {"speed": "1.02x", "table": "| a |\n|---|\n| 1 |"}
    fresh = f"The encoder is {fill('<!-- figure: speed -->?<!-- /figure -->', values)} as fast."
    assert fresh == "The encoder is <!-- figure: speed -->1.02x<!-- /figure --> as fast."
    assert problems({"a.md": fresh, "b.md": fresh}, values) == []
    # The same figure stated differently on a second page: that page is named, the first is not.
    other = fresh.replace("1.02x", "1.10x")
    (said,) = problems({"a.md": fresh, "b.md": other}, values)
    assert said.startswith("b.md: figure 'speed' is stale: shows '1.10x', the source gives '1.02x'"), said
    # A block of several lines stands on lines of its own, so Markdown reads the table after the comment.
    block = fill("<!-- figure: table -->x<!-- /figure -->", values)
    assert block == "<!-- figure: table -->\n\n| a |\n|---|\n| 1 |\n\n<!-- /figure -->"
    assert problems({"a.md": block}, values) == []
    (said,) = problems({"a.md": "<!-- figure: speeed -->1.02x<!-- /figure -->"}, values)
    assert said.startswith("a.md: figure 'speeed' is no figure this generator knows"), said
    # A page PLACES gives a figure to, with the block gone (the number typed back): missing.
    page, key = "docs/results/index.md", "grid-effects"
    assert page in PLACES[key]
    said = problems({page: "| precision | fp16 vs fp32 | 0.78x |"}, {key: "x"})
    assert f"{page}: no block <!-- figure: {key} --> (this page shows that figure)" in said


def test_every_figure_has_its_places_and_every_place_is_a_user_page():
    assert set(FIGURES) == set(PLACES)
    user = {str(p.relative_to(ROOT)) for p in df.pages(ROOT)}
    assert not any("docs/lab/" in p or "docs/reference/" in p for p in user)
    for key, where in PLACES.items():
        assert where and set(where) <= user, (key, where)


@pytest.fixture(scope="module")
def from_stores():
    """Every figure but those a command makes, computed once from the committed stores."""
    return compute([k for k in FIGURES if k not in COMMANDS])


@pytest.mark.slow
def test_the_pages_hold_what_the_stores_give(from_stores):
    """Fails on a page whose figure is stale, missing, or stated otherwise on another page."""
    texts = read_pages(ROOT)
    said = [line for line in problems(texts, from_stores)
            if not any(f"figure '{k}'" in line for k in COMMANDS) and "no figure this generator knows" not in line]
    assert said == [], "\n".join(said + [f"fix: {df.COMMAND}"])


@pytest.mark.slow
def test_the_h100_sweep_and_the_thesis_grid_read_the_same_everywhere(from_stores):
    """The pairs that once disagreed: the H100 sweep's train times (9.1/6.3/6.2/4.9 s, its store)
    and the grid's data path (imdb_small/, the path its store recorded)."""
    h100 = from_stores["h100-card-table"]
    assert [row.split(" | ")[2] for row in h100.splitlines()[4:]] == ["9.1", "6.3", "6.2", "4.9"], h100
    assert "imdb_small/train.csv.gz" in from_stores["grid-command"]
    for page, text in read_pages(ROOT).items():
        assert "dataset.train_path=imdb/" not in text, page
    # The options page lists every precision the registry has, as the generated reference does.
    reference = (ROOT / "docs" / "reference" / "config.md").read_text()
    listed = re.search(r"^\| \[`precision`\]\(#precision\) \| (.*?) \|", reference, re.M).group(1)
    assert [w.strip("` ") for w in listed.replace("(default)", "").split(",")] == \
        [w.split()[0] for w in from_stores["options-precision"].split(", ")]


@pytest.mark.slow
def test_check_names_the_one_stale_block_and_the_guide_shows_the_sweep_the_plan_gives(tmp_path):
    """The CLI on a copy of the pages with one block changed: exit 1 naming that block and nothing
    else, so every other block (those made by commands included) is the current code's. The sweep
    the guide and the README show is the plan's run list, the added baseline with it."""
    for page in read_pages(ROOT):
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / page, tmp_path / page)
    guide = (tmp_path / "docs" / "getting-started.md").read_text()
    (tmp_path / "docs" / "getting-started.md").write_text(guide.replace("test_accuracy=0.8962", "test_accuracy=0.8931"))
    p = warm_cli.run([sys.executable, "-m", "bertaccel.report.docs_figures", "--check", "--root", str(tmp_path)],
                     env=ENV, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    lines = p.stderr.splitlines()
    assert p.returncode == 1 and len(lines) == 2, p.stderr
    assert lines[0].startswith("docs/getting-started.md: figure 'card-default-line' is stale"), p.stderr
    assert lines[1].startswith(f"fix: {df.COMMAND}"), p.stderr

    blocks = {(page, m.group(1)): m.group(2) for page, text in read_pages(ROOT).items() for m in BLOCK.finditer(text)}
    sweep = blocks[("docs/getting-started.md", "card-sweep")]
    assert sweep == blocks[("README.md", "card-sweep")]
    ran = re.findall(r"^\d+\s+(\S+)\s+already_finished\s", sweep, re.M)
    planned = re.findall(r"^\d+\s+(\S+)\s+1\s+1 x 6000\s", blocks[("docs/getting-started.md", "card-plan")], re.M)
    assert ran == planned and len(ran) == 5 and ran[-1] == "defaults", (ran, planned)
    assert f"[sweep] {len(planned)} runs; sweep id config-b32a167b41" in sweep
    assert "[sweep] baseline added: the config groups' defaults" in sweep


@pytest.mark.slow
def test_a_root_without_the_pages_is_one_line(tmp_path):
    p = warm_cli.run([sys.executable, "-m", "bertaccel.report.docs_figures", "--check", "--root", str(tmp_path)],
                     env=ENV, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == "", p
    assert p.stderr.count("\n") == 1 and p.stderr.startswith(f"error: --root {tmp_path}: no README.md"), p.stderr
