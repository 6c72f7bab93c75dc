"""Ctrl-C (SIGINT) and SIGTERM end the current run as `interrupted`: one line, exit 130 / 143."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from bertaccel.record.tracking import search_runs
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

# Every test here starts a real process (the CLI, a script, a server) or trains: slow (docs/contributing.md).
pytestmark = pytest.mark.slow

# Long enough to be still training when the signal comes (the tiny model on the CPU).
LONG = ["model=tiny", "train.device=cpu", "dataset.train_subset=4000", "dataset.test_subset=64",
        "train.batch_size=8", "train.max_steps_per_epoch=100000", "train.epochs=50"]


def _start(tmp_path, args, session=False):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cmd = [sys.executable, "-m", "bertaccel.run", *args, f"tracking.uri={store}", f"cache_dir={tmp_path / 'cache'}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = warm_cli.popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                          start_new_session=session)  # session: a process group of its own, as a terminal's
    return proc, store


def _said(err):
    """stderr without what a run writes there anyway: the progress bar, MLflow's store set-up."""
    return [line for line in err.splitlines() if line.strip() and not re.match(r"^epoch \d+/\d+:", line)
            and "INFO mlflow.store.db.utils" not in line]


def _wait_running(proc, store, limit_s=240):
    """Until the run exists in the store as RUNNING and has logged a training step (lr series)."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        if os.path.exists(store[len("sqlite:///"):]):
            try:
                runs = [r for r in search_runs(store, "bertaccel") if r.data.tags.get("bertaccel.role") != "sweep"]
            except Exception:  # noqa: BLE001 - the store may be half-created
                runs = []
            if runs and runs[0].info.status == "RUNNING":
                time.sleep(3)  # into the training loop
                return runs[0]
        time.sleep(0.5)
    raise AssertionError("the run never started")


@pytest.mark.parametrize("sig,code,name", [(signal.SIGINT, 130, "SIGINT"), (signal.SIGTERM, 143, "SIGTERM")])
def test_signal_ends_a_single_run_as_interrupted(tmp_path, sig, code, name):
    proc, store = _start(tmp_path, LONG)
    run = _wait_running(proc, store)
    proc.send_signal(sig)  # the parent only: it must stop its worker itself
    _, err = proc.communicate(timeout=120)
    lines = _said(err)
    assert proc.returncode == code, err[-3000:]
    assert len(lines) == 1 and "interrupted" in lines[0] and name in lines[0], err[-3000:]
    r = MlflowClient(tracking_uri=store).get_run(run.info.run_id)
    assert r.info.status == "KILLED"
    assert r.data.tags["status"] == "interrupted"
    assert r.data.tags["reason"] == f"interrupted by {name}"


def test_sigint_to_the_process_group_ends_a_sweep_and_its_parent(tmp_path):
    proc, store = _start(tmp_path, ["-m", *LONG, "train.seed=1,2"], session=True)
    run = _wait_running(proc, store)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal: the sweep and its run's worker
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    lines = _said(err)
    assert len(lines) == 1 and lines[0].startswith("interrupted by SIGINT: run "), err[-3000:]
    assert "the same command resumes it" in lines[0]
    client = MlflowClient(tracking_uri=store)
    r = client.get_run(run.info.run_id)
    assert r.info.status == "KILLED" and r.data.tags["status"] == "interrupted"
    (parent,) = [p for p in search_runs(store, "bertaccel") if p.data.tags.get("bertaccel.role") == "sweep"]
    assert parent.info.status == "KILLED" and parent.data.tags["status"] == "interrupted"
    assert len(search_runs(store, "bertaccel")) == 2  # the second configuration never started


DEFERRED = """
import os, signal
from bertaccel.runs import interrupt
interrupt.install()
body = []
try:
    with interrupt.deferred():
        os.kill(os.getpid(), signal.SIGINT)
        body.append("ran to its end")
    print("not raised")
except interrupt.Interrupted as e:
    print(f"{e} after the section, which {body[0]}")
"""


def test_a_signal_inside_a_deferred_section_is_raised_when_it_ends():
    """validate()'s OmegaConf conversion runs in interrupt.deferred(): an Interrupted raised inside
    OmegaConf's flag-restoring `finally` blocks came out as an AttributeError (read as bad input,
    exit 2) or vanished under a hasattr (the sweep ran on). A signal there is raised at the end."""
    r = subprocess.run([sys.executable, "-c", DEFERRED], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "interrupted by SIGINT after the section, which ran to its end"


SWALLOWED = """
import os, signal, time
from bertaccel.runs import interrupt
interrupt.in_worker()
class Finalized:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        total = 0
        for i in range(100000):  # the handler runs here, inside the finalizer
            total += i
try:
    item = Finalized()
    del item
    time.sleep(3)
    print("still running")
finally:
    print("unwound", flush=True)  # where a worker gives back what it holds (a store's lock, a half-built store)
"""


def test_a_workers_sigterm_inside_a_finalizer_still_exits_it_quietly():
    """Seen in CI: the launcher's SIGTERM reached a worker inside SQLAlchemy's weakref callback;
    the SystemExit raised there cannot propagate, Python printed 'Exception ignored in ...' with a
    traceback (the interrupted sweep's one line broke) and the worker ran on. Now it exits with
    128 + SIGTERM, prints nothing of its own, and unwinds: the code it was running gets the exit
    where it propagates, so its `finally` blocks run (an immediate os._exit left a store being
    built half-made, with its lock file, in CI)."""
    p = subprocess.run([sys.executable, "-c", SWALLOWED], capture_output=True, text=True, timeout=60)
    assert (p.returncode, p.stdout, p.stderr) == (128 + signal.SIGTERM, "unwound\n", "")
