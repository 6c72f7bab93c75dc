"""The docs' measured figures cannot drift (bertaccel/report/docs_figures.py): every
<!-- figure: KEY --> block in a user page is its KEY's one computation from a committed store or a
real command, a page that shows a figure has its block, and a figure on two pages is the same.

The pages' blocks are checked against the stores and the commands (the sweep resumed on the
README's store, the report, the plan) by the CLI, run once on a copy of the pages."""
from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from bertaccel.report import docs_figures as df
from bertaccel.report.docs_figures import BLOCK, FIGURES, PLACES, fill, problems, read_pages
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

ROOT = Path(__file__).resolve().parents[1]
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
def checked(tmp_path_factory):
    """The CLI's --check on a copy of the pages with one block made stale: every figure computed
    once (from the committed stores, and by running the commands that make the others), as a user
    or CI runs it. A second computation in this process cost the suite about 45 s."""
    tmp = tmp_path_factory.mktemp("pages")
    for page in read_pages(ROOT):
        (tmp / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / page, tmp / page)
    guide = (tmp / "docs" / "getting-started.md").read_text()
    (tmp / "docs" / "getting-started.md").write_text(guide.replace("test_accuracy=0.8962", "test_accuracy=0.8931"))
    return warm_cli.run([sys.executable, "-m", "bertaccel.report.docs_figures", "--check", "--root", str(tmp)],
                        env=ENV, capture_output=True, text=True, timeout=600, cwd=tmp)


def _blocks():
    """The pages' blocks: {(page, key): text}."""
    return {(page, m.group(1)): m.group(2) for page, text in read_pages(ROOT).items() for m in BLOCK.finditer(text)}


@pytest.mark.slow
def test_the_pages_hold_what_the_stores_and_commands_give_and_check_names_the_one_stale_block(checked):
    """Exit 1 naming the changed block and nothing else: every other block on every page (those made
    by commands included) is its figure's current computation, and no figure is stated otherwise on
    another page."""
    lines = checked.stderr.splitlines()
    assert checked.returncode == 1 and len(lines) == 2, checked.stderr
    assert lines[0].startswith("docs/getting-started.md: figure 'card-default-line' is stale"), checked.stderr
    assert lines[1].startswith(f"fix: {df.COMMAND}"), checked.stderr


@pytest.mark.slow
def test_the_h100_sweep_and_the_thesis_grid_read_the_same_everywhere(checked):
    """The pairs that once disagreed: the H100 sweep's train times (9.1/6.3/6.2/4.9 s, its store)
    and the grid's data path (imdb_small/, the path its store recorded). (The blocks are the
    stores' figures: the check above.)"""
    assert checked.returncode == 1 and checked.stderr.count("\n") == 2, checked.stderr
    blocks = {key: text for (_, key), text in _blocks().items()}
    h100 = blocks["h100-card-table"].strip()
    assert [row.split(" | ")[2] for row in h100.splitlines()[4:]] == ["9.1", "6.3", "6.2", "4.9"], h100
    assert "imdb_small/train.csv.gz" in blocks["grid-command"]
    for page, text in read_pages(ROOT).items():
        assert "dataset.train_path=imdb/" not in text, page
    # The options page lists every precision the registry has, as the generated reference does.
    reference = (ROOT / "docs" / "reference" / "config.md").read_text()
    listed = re.search(r"^\| \[`precision`\]\(#precision\) \| (.*?) \|", reference, re.M).group(1)
    assert [w.strip("` ") for w in listed.replace("(default)", "").split(",")] == \
        [w.split()[0] for w in blocks["options-precision"].strip().split(", ")]


def test_the_guide_and_the_readme_show_the_sweep_the_plan_gives():
    """The sweep the guide and the README show is the plan's run list, the added baseline with it."""
    blocks = _blocks()
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
