"""One voice: on every committed store (docs/results/stores/manifest.yaml lists them all, the
tests' own store included), the console's lines, the answer table, the best-per-strategy table,
the MLflow parent run's description and the results-at-a-glance page name the same winner per
strategy, with the same speed and accuracy change. Each surface is read back as a user sees it
(the console's stdout, report.md, the parent run's description tag in the store, the committed
page) and parsed on its own, so a surface that ranks or rounds anything itself shows up here.

The glance page compares against the manifest's baseline (the report's --baseline, where the
entry names one); the sweep's own description is made without one, as a sweep makes it: each is
compared with the console of the same command.
"""
from __future__ import annotations

import gzip
import re
import shutil
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from bertaccel.record.relocate import relocate
from bertaccel.context import SweepContext
from bertaccel.report.glance import MANIFEST, PAGE, ROOT, load_manifest
from bertaccel.report.scoring import STRATEGIES
from bertaccel.report.sweep_report import DESCRIPTION_TAG, attach_report
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

ENTRIES = load_manifest(MANIFEST)
Said = Dict[str, Tuple[str, str, str]]  # strategy -> (winner, speed, accuracy change)


def _strategies(label: str) -> List[str]:
    label = label.strip()
    return list(STRATEGIES) if label == f"all {len(STRATEGIES)} strategies" else label.split(", ")


def _speed(text: str) -> str:
    """The speed phrase of a cell or of a console line: '1.30x slower', 'as fast (1.00x)', or 'null'."""
    m = re.search(r"\d+\.\d\dx (?:faster|slower)|as fast \(1\.00x\)", text)
    return m.group(0) if m else "null"


def _pts(text: str) -> str:
    m = re.search(r"[+-]\d+\.\d\d pts", text)
    return m.group(0) if m else "null"


def _table(md: str, title: str) -> List[List[str]]:
    section = md.split(f"## {title}")[1].split("\n## ")[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| ") and "---" not in line]
    return rows[1:]  # (the header)


def _console(stdout: str) -> Said:
    lines = stdout.splitlines()
    out: Said = {}
    for k, line in enumerate(lines):
        m = re.match(r"^(\S.*?) best: (.+)$", line)
        if m:
            change = lines[k + 1] if k + 1 < len(lines) and lines[k + 1].startswith("    ") else ""
            for s in _strategies(m.group(1)):
                out[s] = (m.group(2), _speed(change), _pts(change))
    return out


def _answer_table(md: str) -> Said:
    out: Said = {}
    for row in _table(md, "The answer: which configuration to adopt"):
        for s in _strategies(row[0]):
            out[s] = (row[1], _speed(row[2]), _pts(row[5]))
    return out


def _best_table(md: str) -> Dict[str, str]:
    return {s: row[1] for row in _table(md, "Best configuration per strategy") for s in _strategies(row[0])}


def _description(text: str) -> Said:
    """The parent run's description as the MLflow UI shows it: a bullet per line of strategies,
    its details indented under it."""
    out: Said = {}
    lines = text.splitlines()
    for k, line in enumerate(lines):
        m = re.match(r"^- (.*?) best: (.+)$", line)
        if m:
            change = lines[k + 1] if k + 1 < len(lines) else ""
            for s in _strategies(m.group(1)):
                out[s] = (m.group(2), _speed(change), _pts(change))
    return out


def _glance(page: str, store: str) -> Said:
    section = page.split(f"- Store: `{store}`")[1].split("\n### ")[0].split("\n## ")[0]
    out: Said = {}
    table = section.split("**The answer**")[1].split("What each setting buys")[0]
    for line in table.splitlines():
        if not line.startswith("| ") or "---" in line or line.startswith("| strategy"):
            continue
        c = [x.strip() for x in line.strip().strip("|").split("|")]
        for s in _strategies(c[0]):
            out[s] = (c[1], _speed(c[2]), _pts(c[3]))
    return out


def _report(uri: str, sweep: str, out: Path, baseline=None) -> Tuple[str, str]:
    p = warm_cli.run([sys.executable, "-m", "bertaccel.report", "--uri", uri, "--sweep", sweep, "--out", str(out)]
                     + (["--baseline", baseline] if baseline else []), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout, (out / "report.md").read_text()


def _store_copy(entry, tmp_path: Path) -> str:
    """The committed store unpacked, its artifacts pointed beside it (they name the measuring
    machine's folders), as a user opening it would have them (record/relocate.py)."""
    db = tmp_path / "store.db"
    with gzip.open(ROOT / entry.store) as src, db.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    relocate(db, everything=True)
    return f"sqlite:///{db}"


@pytest.mark.slow
@pytest.mark.parametrize("entry", ENTRIES, ids=[Path(e.store).name for e in ENTRIES])
def test_every_surface_names_the_same_winner_with_the_same_numbers(entry, tmp_path):
    uri = _store_copy(entry, tmp_path)
    # The sweep's own report, as it attaches it to its parent run: its description, the console
    # and the report of the same command (no --baseline, as a sweep makes it).
    stdout, md = _report(uri, entry.sweep, tmp_path / "rep")
    console, answer, best = _console(stdout), _answer_table(md), _best_table(md)
    assert sorted(console) == sorted(STRATEGIES), stdout
    assert console == answer, (stdout, md[:3000])
    assert best == {s: w for s, (w, _, _) in answer.items()}
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    parent = client.search_runs([client.get_experiment_by_name("bertaccel").experiment_id],
                                f"tags.sweep_id = '{entry.sweep}' and tags.`bertaccel.role` = 'sweep'")[0]
    said = attach_report(SweepContext(entry.sweep, parent.info.run_id, uri=uri), "bertaccel")
    assert said.startswith("report of"), said
    description = client.get_run(parent.info.run_id).data.tags[DESCRIPTION_TAG]
    assert _description(description) == console, description
    # The glance page (committed, regenerated by test_glance when stale) against the console of
    # the manifest's command, with its baseline.
    if entry.baseline:
        stdout, md = _report(uri, entry.sweep, tmp_path / "rep-baseline", entry.baseline)
        console = _console(stdout)
        assert console == _answer_table(md)
    assert _glance(PAGE.read_text(), entry.store) == console


def test_the_parsers_see_a_difference():
    """The comparison above can fail: a surface that says another winner or another number is
    told apart (the same lines, one figure changed)."""
    lines = ("all 7 strategies   best: fp32 / triton\n    1.20x faster, -12.3 % energy, -0.10 pts accuracy against "
             "'defaults'\n    runner-up: x\n    how sure: y")
    one = _console(lines)
    assert one["balance"] == ("fp32 / triton", "1.20x faster", "-0.10 pts")
    assert _console(lines.replace("1.20x faster", "1.19x faster")) != one
    assert _console(lines.replace("fp32 / triton", "fp32 / xformers")) != one
