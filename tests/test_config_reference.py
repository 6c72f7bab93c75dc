"""docs/reference/config.md is generated from the code (bertaccel/options/reference.py): these
tests fail when the committed page is not what the code generates now (an option, a key, a
default, a range or a check changed without regenerating), and show that the comparison can fail
by changing conf/ the way a user does: an option added on a search path, a default changed and an
option removed in a copy of conf/. Then what a reader needs of it: the most used settings on
top, each leading to its section; papers cited by title (linked to the table of them), never by
the number a reader cannot look up; every description opening with what the setting does; and,
in a real browser, key names on one line each and a page far shorter than the 31,000 px it was."""
from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
from typing import List

import pytest
from browser import browser  # noqa: F401  (the headless Chromium fixture)
from omegaconf import OmegaConf

from bertaccel.config import COMPILE_MODES, CONF_DIR, schema_fields
from bertaccel.options.papers import ANCHOR, PAPERS
from bertaccel.options.reference import COMMAND, MOST_USED, check_title, generate, section_checks, show
from bertaccel.options.rules import RULES

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "config.md"


@pytest.fixture(scope="module")
def page() -> str:
    return generate()


def key_line(page: str, key: str) -> str:
    """The page's line for one key (its default, type, allowed values and description)."""
    found = [line for line in page.splitlines() if f'id="{key}">{key}</code>' in line]
    assert len(found) == 1, f"{key}: {len(found)} lines"
    return found[0]


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
    added = generate(searchpath=tmp_path).splitlines()
    row = "| `bf16_plain` | bfloat16 autocast measured against fp32's MFU peak |"
    sets = "    - `bf16_plain`: `autocast_dtype: bfloat16`"
    assert row in added and sets in added
    assert row not in page and sets not in page
    assert "\n".join(added) + "\n" != PAGE.read_text()


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
    assert " = `3` " in key_line("\n".join(changed), "train.epochs")
    assert " = `1` " in key_line(page, "train.epochs")
    assert "[precision](#precision) (`bf16`)" in "\n".join(changed)
    assert "[precision](#precision) (`fp32`)" in page
    assert any(line.startswith("| `bf16` (default) |") for line in changed)
    assert any(line.startswith("| `lamb` |") for line in lines)
    assert not any(line.startswith("| `lamb` |") for line in changed)


def test_every_key_shows_its_composed_default(page, compose_cfg):
    """The Default column is the config a run composes with no overrides (Hydra's own composition)."""
    cfg = compose_cfg()
    for key, _ in schema_fields():
        value = show(OmegaConf.select(cfg, key))
        assert f"</code> = `{value}` " in key_line(page, key), key


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
    assert f"one of {modes}" in key_line(page, "compile.mode")


# --- what a reader needs of the page --------------------------------------------------------

def outside_code(text: str) -> str:
    """Text as a reader reads it, code left out: a name in code (`preset=seed001_k4`) may hold a
    paper's number, a sentence may not."""
    return re.sub(r"<code[^>]*>.*?</code>|`[^`]*`", "", text)


def numbered_citations(page: str) -> List[str]:
    """Lines citing a paper by its number ("seed 001 eq. 6"), which no reader can look up."""
    return [line[:120] for line in page.splitlines() if re.search(r"seed ?0\d\d", outside_code(line), re.I)]


def test_no_paper_is_cited_by_its_number(page):
    assert numbered_citations(page) == []


def test_each_paper_is_in_the_table_and_cited_by_its_title(page):
    """Each paper has a row (title, authors, year, what it found) under the heading the citations
    link to, and at least one option text cites it by title, linked to that table."""
    body, table = page.split("\n## Papers cited\n", 1)
    for paper in PAPERS:
        assert f"| *{paper.title}*<br>{paper.authors}; {paper.year}<br>" in table, paper.label
        assert f"[*{paper.short}*](#{ANCHOR})" in body, f"{paper.short}: cited nowhere on the page"


MOST_USED_ROW = re.compile(r"^\| \[`([^`]+)`\]\(#([^)]+)\) \| (.+) \| (.+) \|$")


def most_used_problems(page: str) -> List[str]:
    """What is wrong with the table on top: fewer than 8 or more than 12 rows, a row without
    values or effect, or a link to no section (a group's heading, a key's line)."""
    table = page.split("\n## Most used\n", 1)[1].split("\n## ", 1)[0]
    rows = [MOST_USED_ROW.match(line) for line in table.splitlines() if line.startswith("| [`")]
    problems = [] if 8 <= len(rows) <= 12 else [f"{len(rows)} rows"]
    for row in rows:
        if row is None:
            problems.append("a row not of the form | [`setting`](#setting) | values | effect |")
            continue
        setting, target, values, effect = row.groups()
        if target != setting or not values.strip() or not effect.strip():
            problems.append(f"{setting}: target {target!r}, values {values!r}, effect {effect!r}")
        if f"\n## {target}\n" not in page and f'id="{target}"' not in page:
            problems.append(f"{setting}: no section #{target} on the page")
    return problems


def test_the_most_used_settings_are_on_top_and_lead_to_their_sections(page):
    assert page.index("\n## Most used\n") < page.index("\n## precision\n")
    assert most_used_problems(page) == []
    shown = [MOST_USED_ROW.match(line).group(1) for line in page.split("\n## Most used\n", 1)[1].splitlines()
             if line.startswith("| [`")]
    assert shown == [setting for setting, _ in MOST_USED]


def test_a_most_used_link_to_nowhere_is_caught(page):
    """The check above can fail: the train block's batch_size line gone, its row leads nowhere."""
    broken = page.replace(' id="train.batch_size"', "")
    assert most_used_problems(broken) == ["train.batch_size: no section #train.batch_size on the page"]


# A description that opens with a caveat or a scope instead of what the setting does.
CAVEAT_WORDS = ("hydra", "note", "beware", "warning", "caveat", "careful", "however", "but ", "not ",
                "only", "unlike", "used by")
SCOPE_FIRST = re.compile(r"^[\w.=]+ only\b", re.I)  # "fused only. ...", "Multirun only: ..."


def descriptions(page: str) -> List[tuple]:
    """(name, description) of every section (the paragraph under its heading) and every key (the
    text after its type and allowed values)."""
    out = []
    for block in page.split("\n## ")[1:]:
        name, _, rest = block.partition("\n\n")
        if name not in ("Most used", "Papers cited"):
            out.append((name, rest.split("\n", 1)[0]))
    for line in page.splitlines():
        key = re.search(r'class="cfg-key" id="([^"]+)"', line)
        if key:
            out.append((key.group(1), line.split("</span>", 1)[1]))
    return out


def opens_with_caveat(text: str) -> bool:
    """True when the first sentence is missing, opens with a caveat word or a scope, or is about
    Hydra (how the tool parses a setting is said after what the setting does)."""
    first = re.split(r"(?<=[.!?])\s", text.strip(), maxsplit=1)[0]
    return (not first or first.lower().startswith(CAVEAT_WORDS) or bool(SCOPE_FIRST.match(first))
            or bool(re.search(r"\bHydra\b", first)))


def test_every_description_opens_with_what_the_setting_does(page):
    said = descriptions(page)
    assert len(said) > len(list(schema_fields()))  # (every key, and every section)
    assert [(name, text[:80]) for name, text in said if opens_with_caveat(text)] == []


def test_a_description_opening_with_a_caveat_is_caught():
    """What the accumulation key said before: the Hydra quirk first, and an empty key."""
    quirk = ("accumulation and num_gpus are plain integers rather than folders of options: Hydra "
             "rejects a group option whose name parses as an int. Micro-batches per optimizer step.")
    assert opens_with_caveat(quirk) and opens_with_caveat("Hydra rejects it.")
    assert opens_with_caveat("fused only. packed: the layers run on real tokens") and opens_with_caveat(" ")
    assert not opens_with_caveat("Micro-batches per optimizer step: an integer, or adaptive.")


@pytest.mark.slow
def test_in_a_browser_keys_stay_on_one_line_and_the_page_is_short(browser, tmp_path):
    """The committed page built with the site's own settings (mkdocs.yml inherited: theme,
    extensions, the stylesheet) and opened in headless Chromium, 1400 px wide, every fold open:
    no key and no option name is broken across lines. Folded, the page is under half the
    31,382 px the one-table-per-section layout measured."""
    pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
    docs = tmp_path / "docs"
    (docs / "reference").mkdir(parents=True)
    shutil.copy(PAGE, docs / "reference" / "config.md")
    shutil.copytree(ROOT / "docs" / "stylesheets", docs / "stylesheets")
    config = tmp_path / "mkdocs.yml"
    config.write_text(f"INHERIT: {ROOT / 'mkdocs.yml'}\ndocs_dir: {docs}\nstrict: false\n"
                      "nav:\n  - reference/config.md\n")
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--quiet", "--config-file", str(config),
                           "--site-dir", str(site)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert done.returncode == 0, done.stderr
    browser.get((site / "reference" / "config" / "index.html").as_uri())
    height, broken, keys = browser.execute_script("""
        const height = document.body.scrollHeight;
        document.querySelectorAll('details').forEach(d => { d.open = true; });
        const names = [...document.querySelectorAll('article code.cfg-key, article td:first-child code')];
        return [height, names.filter(c => c.getClientRects().length > 1).map(c => c.textContent),
                document.querySelectorAll('article code.cfg-key').length];""")
    assert broken == []
    assert keys == len(list(schema_fields()))
    assert height < 31_382 / 2, f"{height} px"
