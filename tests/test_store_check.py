"""A tracking store that cannot be used is one line and exit 2 before any work, for runs and the report."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import TINY
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

# Every test here starts a real process (the CLI, a script, a server) or trains: slow (docs/contributing.md).
pytestmark = pytest.mark.slow

# Port 9 (discard) has no listener here: the connection is refused. Without the check MLflow
# retries for minutes, so the subprocess timeout (not a timing assert) is what a regression hits.
UNREACHABLE = "http://127.0.0.1:9/"


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


def test_unreachable_tracking_server_is_one_line_before_any_work(cli):
    r = cli([*TINY, "train.max_steps_per_epoch=2"], uri=UNREACHABLE, timeout=60)
    assert r.returncode == 2, r.stderr[-3000:]
    line = _one_line(r.stderr)
    assert line.startswith(f"error: tracking.uri={UNREACHABLE}: unreachable"), line
    assert "tracking.uri=sqlite:///mlflow.db" in line and "mlflow server" in line
    assert not (cli.dir / "cache").exists()  # nothing tokenized, nothing trained


def test_sweep_with_unreachable_tracking_server_is_one_line(cli):
    r = cli(["-m", *TINY, "train.seed=1,2", "train.max_steps_per_epoch=2"], uri=UNREACHABLE, timeout=60)
    assert r.returncode == 2, r.stderr[-3000:]
    assert _one_line(r.stderr).startswith(f"error: tracking.uri={UNREACHABLE}: unreachable")


def _report(tmp_path, uri: str) -> subprocess.CompletedProcess:
    return warm_cli.run([sys.executable, "-m", "bertaccel.report", "--uri", uri, "--out", "report"],
                        cwd=tmp_path, capture_output=True, text=True, timeout=60, env=dict(os.environ))


def test_report_refuses_a_sqlite_store_that_does_not_exist(tmp_path):
    r = _report(tmp_path, "sqlite:///nonexist.db")
    assert r.returncode == 2, r.stderr[-3000:]
    line = _one_line(r.stderr)
    assert line.startswith("error: --uri sqlite:///nonexist.db:") and "does not exist" in line, line
    assert list(tmp_path.iterdir()) == []  # no empty database (or lock file) left behind


def test_report_with_unreachable_tracking_server_is_one_line(tmp_path):
    r = _report(tmp_path, UNREACHABLE)
    assert r.returncode == 2, r.stderr[-3000:]
    assert _one_line(r.stderr).startswith(f"error: --uri {UNREACHABLE}: unreachable")
