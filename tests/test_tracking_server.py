"""tracking.uri=http://... against `mlflow server` on PostgreSQL: a sweep with 4 runs at a time
lands every run once, with its params, metrics and artifacts, and the report and the notebook
read the server as they read a SQLite file.

PostgreSQL comes from the Debian packages: installed here if missing (apt-get; CI runs as root),
skipped with the reason only where that cannot be done. Both servers listen on 127.0.0.1 only,
on free ports, with their data in temporary directories, and are stopped at the end.
"""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator, List, Optional

import nbformat
import pytest
from mlflow import MlflowClient
from nbclient import NotebookClient

from services import apt_install, free_port, mlflow_service

from bertaccel.record.tracking import search_runs
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

pytestmark = pytest.mark.postgres
ROOT = Path(__file__).resolve().parent.parent

# The quick study (8 configurations, what the notebook is written for), smaller, 4 at a time.
SWEEP = ["-m", "--config-name", "quick", "launcher.runs_at_once=4", "dataset.train_subset=64",
         "dataset.test_subset=32", "train.epochs=1"]
PG_USER = "postgres"  # the Debian package's system user: initdb refuses to run as root


def _pg_bin() -> Optional[Path]:
    """The directory of initdb / pg_ctl: on PATH, or where Debian puts them (not on PATH)."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name))
    return versions[-1].parent if versions else None


def _as_pg_user(cmd: List[str]) -> List[str]:
    return ["runuser", "-u", PG_USER, "--", *cmd] if os.geteuid() == 0 else cmd


def _run(cmd: List[str], **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)
    assert p.returncode == 0, f"{' '.join(cmd)} -> {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    return p


@pytest.fixture
def postgres() -> Iterator[str]:
    """A throwaway PostgreSQL cluster; yields its database URI for MLflow."""
    if _pg_bin() is None:
        why = apt_install(["postgresql"], "PostgreSQL")
        if why is not None:
            pytest.skip(why)
    bin_dir = _pg_bin()
    assert bin_dir is not None, "apt-get installed postgresql but no initdb was found"
    if os.geteuid() == 0:
        try:
            pw = pwd.getpwnam(PG_USER)
        except KeyError:
            pytest.skip(f"initdb refuses root and there is no '{PG_USER}' user to run it as")
    # Not under pytest's tmp_path: its parent directories are root's only, and the server runs
    # as the postgres user.
    data = Path(tempfile.mkdtemp(prefix="bertaccel-pg-"))
    if os.geteuid() == 0:
        os.chown(data, pw.pw_uid, pw.pw_gid)
    port = free_port()
    started = False
    try:
        _run(_as_pg_user([str(bin_dir / "initdb"), "-D", str(data / "db"), "-U", "bertaccel", "-A", "trust",
                          "--no-sync", "-E", "UTF8"]))
        # 127.0.0.1 only; the socket in the data directory (the default one may not be writable);
        # fsync off: a throwaway cluster.
        opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {data} -c fsync=off"
        _run(_as_pg_user([str(bin_dir / "pg_ctl"), "-D", str(data / "db"), "-l", str(data / "server.log"),
                          "-o", opts, "-w", "-t", "60", "start"]))
        started = True
        _run([str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "bertaccel", "mlflow"])
        # the driver named: SQLAlchemy 2.1 reads a bare postgresql:// as psycopg 3, not the test
        # extra's psycopg2-binary
        yield f"postgresql+psycopg2://bertaccel@127.0.0.1:{port}/mlflow"
    finally:
        if started:
            subprocess.run(_as_pg_user([str(bin_dir / "pg_ctl"), "-D", str(data / "db"), "-m", "fast", "-w", "stop"]),
                           capture_output=True, timeout=120)
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture
def tracking_server(postgres, tmp_path) -> Iterator[str]:
    """`mlflow server` on the PostgreSQL store, artifacts in a directory it serves; yields its URI."""
    port = free_port()
    artifacts = tmp_path / "server-artifacts"
    argv = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", postgres,
            "--artifacts-destination", str(artifacts), "--host", "127.0.0.1", "--port", str(port), "--workers", "2"]
    with mlflow_service(argv, tmp_path / "mlflow-server.log", start_timeout_s=180, stop_wait_s=30) as uri:
        yield uri


def test_a_parallel_sweep_on_a_postgresql_tracking_server(cli, tracking_server, tmp_path, monkeypatch):
    uri = tracking_server
    proc = cli(SWEEP, uri=uri)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "8 runs: finished=8 skipped=0 failed=0" in proc.stdout, proc.stdout[-3000:]

    runs = search_runs(uri, "bertaccel")
    (parent,) = [r for r in runs if r.data.tags.get("bertaccel.role") == "sweep"]
    kids = [r for r in runs if r.data.tags.get("bertaccel.role") != "sweep"]
    names = [f"accumulation={a},freezing={f},optimizer={o}" for a in (1, 2) for f in ("none", "layerwise")
             for o in ("adamw", "adamw_fused")]
    assert sorted(r.info.run_name for r in kids) == sorted(names)
    assert len({r.data.tags["config_hash"] for r in kids}) == 8  # each configuration once
    # Side by side: the first four runs overlap in time (they wrote to the server concurrently).
    first = sorted(kids, key=lambda r: r.info.start_time)[:4]
    assert max(r.info.start_time for r in first) < min(r.info.end_time for r in first)
    client = MlflowClient(tracking_uri=uri)
    for r in kids:
        optimizer = r.info.run_name.rsplit("=", 1)[1]
        assert r.info.status == "FINISHED" and r.data.tags["status"] == "finished"
        assert r.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert r.data.params["optimizer"] == optimizer and r.data.params["model"] == "tiny"
        assert 0.0 <= r.data.metrics["test_accuracy"] <= 1.0 and r.data.metrics["train_time_s"] > 0
        # the artifact went through the server into its --artifacts-destination, and comes back
        config = Path(client.download_artifacts(r.info.run_id, "config.yaml", str(tmp_path / r.info.run_id)))
        assert "train_subset: 64" in config.read_text()
    stored = list((tmp_path / "server-artifacts").rglob("config.yaml"))  # the fixture's directory
    assert len(stored) == 8
    assert parent.data.tags["status"] == "finished (8 of 8 runs finished)"

    # The report reads the server as it reads a SQLite file.
    out = tmp_path / "report"
    report = warm_cli.run([sys.executable, "-m", "bertaccel.report", "--uri", uri, "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-3000:]
    text = (out / "report.md").read_text()
    assert all(name in text for name in names), text[:3000]
    # ... and so does the notebook (it takes the store from BERTACCEL_TRACKING_URI)
    monkeypatch.setenv("BERTACCEL_TRACKING_URI", uri)
    monkeypatch.setenv("BERTACCEL_SWEEP_ID", parent.data.tags["sweep_id"])
    nb = nbformat.read(ROOT / "notebooks" / "compare_runs.ipynb", as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("8 finished runs" in o.get("text", "") for o in outputs)
