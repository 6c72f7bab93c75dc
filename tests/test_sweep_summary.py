"""A sweep's summary and parent run say what finished; a resumed row keeps the earlier results."""
from __future__ import annotations

import re
import sys

import pytest

from conftest import TINY

from bertaccel.record.tracking import search_runs
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

# Every test here starts a real process (the CLI, a script, a server) or trains: slow (docs/contributing.md).
pytestmark = pytest.mark.slow

ONE = ["-m", "train.seed=1", *TINY, "train.max_steps_per_epoch=2"]


def _row(stdout, status):
    (line,) = [line for line in stdout.splitlines() if re.match(rf"^0\s+\S+\s+{status}\s", line)]
    return line.split()


def test_an_already_finished_row_shows_the_earlier_runs_accuracy_and_time(cli):
    first = cli(ONE)
    assert first.returncode == 0, first.stderr[-2000:]
    again = cli(ONE)
    assert again.returncode == 0, again.stderr[-2000:]
    before, after = _row(first.stdout, "finished"), _row(again.stdout, "already_finished")
    assert after[3:5] == before[3:5] and after[3] != "-"  # test_accuracy, train_time_s


def test_a_sweep_where_nothing_finished_says_so_and_the_report_says_why(cli):
    # float16 needs a GPU; no fp32 baseline added, which would finish
    r = cli(["-m", "precision=fp16", *TINY, "train.max_steps_per_epoch=2", "sweep.baseline=false"])
    assert r.returncode == 1
    (parent,) = [p for p in search_runs(cli.store, "bertaccel") if p.data.tags.get("bertaccel.role") == "sweep"]
    assert parent.data.tags["status"] == "finished (0 of 1 runs finished)"
    rep = warm_cli.run([sys.executable, "-m", "bertaccel.report", "--uri", cli.store,
                        "--sweep", parent.data.tags["sweep_id"], "--out", str(cli.dir / "report")],
                       cwd=cli.dir, capture_output=True, text=True, timeout=300)
    assert rep.returncode != 0
    assert "no finished runs in sweep" in rep.stderr and ": 1 skipped (e.g. " in rep.stderr, rep.stderr[-2000:]
