"""Portable stores: every store the docs ship opens, as the docs say (`python -m
bertaccel.report.open_store STORE.db.gz --to DIR`), with each sweep's report among its parent
run's artifacts, the files where the artifacts say; a store moved with its mlartifacts/ still
finds them; and the real MLflow UI shows the report in the parent's Artifacts tab, not "No
Artifacts Recorded". The stores recorded the measuring machine's paths (file:///tmp/w3/...)."""
from __future__ import annotations

import gzip
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from browser import browser  # noqa: F401 - the fixture
from services import free_port, mlflow_service

from bertaccel.report.glance import MANIFEST, ROOT, load_manifest
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

pytestmark = pytest.mark.slow

STORES = sorted({e.store for e in load_manifest(MANIFEST)})


def _open(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return warm_cli.run([sys.executable, "-m", "bertaccel.report.open_store", *args], cwd=cwd,
                        capture_output=True, text=True, timeout=600)


def _rows(db: Path, table: str):
    with sqlite3.connect(db) as con:
        return sorted(con.execute(f"select * from {table}").fetchall(), key=repr)


def _reports(db: Path):
    """(parent run id, the files its report artifacts name) for each sweep parent of the store."""
    from mlflow import MlflowClient
    from mlflow.utils.file_utils import local_file_uri_to_path

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = client.get_experiment_by_name("bertaccel")
    out = []
    for parent in client.search_runs([exp.experiment_id], "tags.`bertaccel.role` = 'sweep'"):
        listed = [f.path for f in client.list_artifacts(parent.info.run_id, "report")]
        root = Path(local_file_uri_to_path(client.get_run(parent.info.run_id).info.artifact_uri))
        out.append((parent.info.run_id, listed, [root / p for p in listed]))
    return out


@pytest.mark.parametrize("store", STORES, ids=[Path(s).name for s in STORES])
def test_a_committed_store_opens_with_its_reports_and_moves_with_them(store, tmp_path):
    p = _open(str(ROOT / store), "--to", "opened", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "open it: mlflow ui --backend-store-uri sqlite:///" in p.stdout and "attached to the parent run" in p.stdout
    found = _reports(tmp_path / "opened" / "mlflow.db")
    assert found
    # The runs' measurements are untouched: params, metrics and the runs' own rows as committed.
    with gzip.open(ROOT / store) as src, (tmp_path / "as-committed.db").open("wb") as dst:
        shutil.copyfileobj(src, dst)
    for table in ("params", "metrics", "latest_metrics", "inputs"):
        assert _rows(tmp_path / "as-committed.db", table) == _rows(tmp_path / "opened" / "mlflow.db", table), table
    for _, listed, files in found:
        assert "report/report.html" in listed and "report/report.md" in listed, listed
        assert all(f.exists() and str(f).startswith(str(tmp_path / "opened" / "mlartifacts")) for f in files), files
    # Moved with its mlartifacts/: opened where it is, the artifacts found again, nothing rebuilt.
    shutil.move(str(tmp_path / "opened"), str(tmp_path / "moved"))
    p = _open("moved/mlflow.db", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "attached" not in p.stdout, p.stdout
    for _, listed, files in _reports(tmp_path / "moved" / "mlflow.db"):
        assert "report/report.html" in listed and all(f.exists() and "moved" in str(f) for f in files), files


def test_bad_input_is_one_line_and_leaves_nothing(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    p = _open(str(ROOT / STORES[0]), "--to", "full", cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "not an empty folder" in p.stderr, p.stderr
    assert sorted(x.name for x in (tmp_path / "full").iterdir()) == ["keep.txt"]
    (tmp_path / "bad.db.gz").write_bytes(b"not gzip")
    p = _open("bad.db.gz", "--to", "new", cwd=tmp_path)
    assert p.returncode == 2 and "not a gzipped store" in p.stderr and not (tmp_path / "new").exists(), p.stderr
    p = _open("missing.db", cwd=tmp_path)
    assert p.returncode == 2 and "no such file" in p.stderr


def test_the_mlflow_ui_shows_a_committed_stores_report(browser, tmp_path):  # noqa: F811
    store = "docs/results/stores/h200-card-repeats.db.gz"
    p = _open(str(ROOT / store), "--to", "opened", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    db = tmp_path / "opened" / "mlflow.db"
    (parent, _, _), = _reports(db)
    argv = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", f"sqlite:///{db}", "--host", "127.0.0.1",
            "--port", str(free_port())]
    with mlflow_service(argv, tmp_path / "ui.log", start_timeout_s=120, stop_wait_s=10, cwd=tmp_path) as base:
        from test_mlflow_ui_browser import _wait_for

        browser.get(f"{base}/#/experiments/1/runs/{parent}/artifacts?workflowType=machine_learning")
        folder = _wait_for(browser, "the report folder among the parent's artifacts",
                           lambda d: next(e for e in d.find_elements("xpath", "//*[normalize-space(text())='report']")
                                          if e.is_displayed()))
        assert "No Artifacts Recorded" not in browser.find_element("tag name", "body").text
        folder.click()
        _wait_for(browser, "report.html in the parent's report folder",
                  lambda d: any(e.is_displayed() for e in
                                d.find_elements("xpath", "//*[normalize-space(text())='report.html']")))
