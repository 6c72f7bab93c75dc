"""docs/reference/config.md is generated from the code (bertaccel/options/reference.py): these
tests fail when the committed page is not what the code generates now (an option, a key, a
default, a range or a check changed without regenerating), and show that the comparison can fail
by changing conf/ the way a user does: an option added on a search path, a default changed and an
option removed in a copy of conf/."""
from __future__ import annotations

import pathlib
import shutil

import pytest
from omegaconf import OmegaConf

from bertaccel.config import COMPILE_MODES, CONF_DIR, schema_fields
from bertaccel.options.reference import COMMAND, check_title, generate, section_checks, show
from bertaccel.options.rules import RULES

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "config.md"


@pytest.fixture(scope="module")
def page() -> str:
    return generate()


def test_the_committed_page_is_what_the_code_generates(page):
    if PAGE.read_text() != page:
        pytest.fail(f"docs/reference/config.md is out of date; regenerate it: {COMMAND}", pytrace=False)


@pytest.mark.slow
def test_an_option_added_on_a_search_path_appears(page, tmp_path):
    """A new precision as a user adds one (a YAML file on hydra.searchpath): its row says what it
    is and what it sets against the default option, so the committed page no longer matches."""
    (tmp_path / "precision").mkdir()
    (tmp_path / "precision" / "bf16_plain.yaml").write_text(
        "# bfloat16 autocast measured against fp32's MFU peak\n"
        "name: bf16_plain\nautocast_dtype: bfloat16\nloss_scaling: false\nmfu_peak: fp32\n")
    added = generate(searchpath=tmp_path)
    row = ("| `bf16_plain` | bfloat16 autocast measured against fp32's MFU peak | "
           "`name: bf16_plain`<br>`autocast_dtype: bfloat16` |")
    assert row in added.splitlines()
    assert row not in page
    assert added != PAGE.read_text()


@pytest.mark.slow
def test_a_changed_default_and_a_removed_option_change_the_page(page, tmp_path):
    """In a copy of conf/: train.epochs' default 1 -> 3, the default precision fp32 -> bf16, and
    optimizer=lamb removed; each shows on the page."""
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    main = conf / "config.yaml"
    text = main.read_text()
    assert "  - precision: fp32\n" in text and "\nhydra:\n" in text  # (what this test edits is there)
    # (config.yaml sets no leaf itself: the schema's default is the default, and a value set here wins)
    main.write_text(text.replace("  - precision: fp32\n", "  - precision: bf16\n")
                    .replace("\nhydra:\n", "\ntrain:\n  epochs: 3\n\nhydra:\n"))
    (conf / "optimizer" / "lamb.yaml").unlink()
    changed = generate(conf_dir=conf).splitlines()
    lines = page.splitlines()
    assert "| `train.epochs` | int | `3` | &gt; 0 |   |" in changed
    assert "| `train.epochs` | int | `1` | &gt; 0 |   |" in lines
    assert "| [precision](#precision) | group | `bf16` |" in changed
    assert any(line.startswith("| `bf16` (default) |") for line in changed)
    assert any(line.startswith("| `lamb` |") for line in lines)
    assert not any(line.startswith("| `lamb` |") for line in changed)


def test_every_key_shows_its_composed_default(page, compose_cfg):
    """The Default column is the config a run composes with no overrides (Hydra's own composition)."""
    cfg = compose_cfg()
    lines = page.splitlines()
    for key, _ in schema_fields():
        value = show(OmegaConf.select(cfg, key))
        assert any(line.startswith(f"| `{key}` | ") and f"| `{value}` |" in line for line in lines), key


def test_every_check_and_its_allowed_values_are_on_the_page(page):
    """Each registered option's checks (its own, its machine check, its later ones) and each rule
    between sections are listed, and the values a check tests a key against are read from the
    check's code (compile.mode: config.COMPILE_MODES)."""
    for checks in section_checks().values():
        for check in checks:
            assert f"- `{check_title(check)}`: " in page, check
    for rule in RULES:
        assert f"- rule `{rule.name}` (reads {', '.join(rule.reads)}): " in page, rule.name
    modes = ", ".join(f"`{m}`" for m in COMPILE_MODES)
    assert any(line.startswith("| `compile.mode` |") and f"one of {modes}" in line for line in page.splitlines())
