"""Nothing lost, round 4 (issue 59, item 7): Ctrl-C is one line at every moment of a sweep's start,
Hydra's own config reads included, and output to a closed pipe ends quietly.

The SIGINT is sent by the process to itself at chosen points of its start (a probe, PROBE below,
runs `python -m bertaccel.run` with one function of Hydra, OmegaConf or bertaccel wrapped so that
the signal is sent when a given line of it runs): the same points every time, where a timer
would land somewhere else on each machine. Real sweeps of the tiny model on the CPU, real stores."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bertaccel.record.tracking import search_runs
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

pytestmark = pytest.mark.slow

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
SWEEP = ["-m", "model=tiny", "train.device=cpu", "dataset.train_subset=32", "dataset.test_subset=16",
         "train.batch_size=16", "train.seed=1,2"]

# argv: the function (its file's path ending, ":", its qualified name), the text of the line at
# which SIGINT is sent, its occurrence (counted from the arming function's first call), the arming
# function (same form, or - for the start), then the command's own argv. Functions are matched by
# their code, not patched: Hydra's plugin scan loads its modules again, a patched class is not the
# one it uses. The probe's functions live in a namespace of their own (not __main__, which is the
# command's): to the code under test the probe is a library, not the command.
PROBE = r'''
import linecache, os, runpy, signal, sys

def probe(argv):
    target, needle, occurrence, arm = argv[0], argv[1], int(argv[2]), argv[3]
    state = {"armed": arm == "-", "seen": 0, "fired": False}

    def matches(code, spec):
        path, qualname = spec.split(":")
        return code.co_qualname == qualname and code.co_filename.endswith(path)

    def at_line(frame, event, arg):
        if (event == "line" and not state["fired"]
                and needle in linecache.getline(frame.f_code.co_filename, frame.f_lineno)):
            state["seen"] += 1
            if state["seen"] == occurrence:
                state["fired"] = True
                os.kill(os.getpid(), signal.SIGINT)  # handled at the next call this line makes
                return None
        return at_line

    def on_call(frame, event, arg):
        if state["fired"]:
            return None
        if not state["armed"] and matches(frame.f_code, arm):
            state["armed"] = True
        return at_line if state["armed"] and matches(frame.f_code, target) else None

    sys.argv = ["bertaccel.run", *argv[4:]]
    sys.settrace(on_call)
    runpy.run_module("bertaccel.run", run_name="__main__", alter_sys=True)
'''

PROBE_MAIN = ("import sys; ns = {'__name__': 'sigint_probe'}; exec(compile(sys.argv[1], 'sigint_probe', 'exec'), ns); "
              "ns['probe'](sys.argv[2:])")

SOURCES = "importlib_resources_config_source.py:ImportlibResourcesConfigSource._read_config"
# (target, line, occurrence, arming call): where the signal lands.
POINTS = {
    # Hydra's first config read of the sweep, between its `try:` and the file's open
    "Hydra's config read at the start": (SOURCES, "f = res.open", 1, "-"),
    # OmegaConf's copy of a node, its parent unset for the copy (AttributeError: bad input, exit 2)
    "OmegaConf's copy while the sweep is planned": ("omegaconf/dictconfig.py:DictConfig.__deepcopy__",
                                                    "vc = copy.deepcopy(v, memo=memo)", 3,
                                                    "runs/sweep_plan.py:plan_sweep"),
    # the parent run made, not yet the sweep's context (a parent left RUNNING)
    "the parent run opens": ("record/sweep.py:open_parent", "client.log_param(new_id", 1, "-"),
    # a job's config read as the sweep is planned (runs/sweep_plan.py): an UnboundLocalError
    # took the Interrupted's place, Hydra made it a warning, the parent run was left RUNNING
    "Hydra's config read for the first job": (SOURCES, "f = res.open", 1, "runs/sweep_plan.py:plan_sweep"),
}


def _said(err: str):
    return [line for line in err.splitlines() if line.strip() and "INFO mlflow" not in line
            and not re.match(r"^(epoch \d+/\d+|INFO  \[alembic)", line)]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("interrupts_cache")  # (the data read and tokenized once)


@pytest.mark.parametrize("point", list(POINTS))
def test_ctrl_c_at_each_point_of_a_sweeps_start_is_one_line_and_leaves_nothing_running(point, cache, tmp_path):
    target, needle, occurrence, arm = POINTS[point]
    store = tmp_path / "mlflow.db"  # (a store of its own: a parent run left by another point would be reopened)
    cmd = [sys.executable, "-c", PROBE_MAIN, PROBE, target, needle, str(occurrence), arm, *SWEEP,
           f"tracking.uri=sqlite:///{store}", f"cache_dir={cache}"]
    r = subprocess.run(cmd, cwd=store.parent, env=ENV, capture_output=True, text=True, timeout=300)
    lines = _said(r.stderr)
    assert "Traceback" not in r.stderr + r.stdout, r.stderr[-4000:]
    assert r.returncode == 128 + signal.SIGINT, (r.returncode, r.stderr[-3000:])
    assert len(lines) == 1 and lines[0].startswith("interrupted by SIGINT"), r.stderr[-3000:]
    if store.exists():
        running = [(r.info.run_name, r.data.tags.get("bertaccel.role")) for r in search_runs(f"sqlite:///{store}", "bertaccel")
                   if r.info.status == "RUNNING"]
        assert not running, (running, lines)


# ---------------------------------------------------------------------------------------------
# Output to a closed pipe (`| head -1`): exit 0 (or 141, SIGPIPE's), no traceback, nothing half-saved.

def _closed_pipe(args, cwd: Path, timeout=300):
    """The command with its stdout a pipe whose read end is closed before it writes anything (a
    `| head -1` that has its line, sooner): (exit status, stderr)."""
    proc = warm_cli.popen([sys.executable, "-m", *args], cwd=cwd, env=ENV, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    return proc.wait(timeout=timeout), err


def _quiet(code: int, err: str) -> None:
    assert code in (0, 141), (code, err[-3000:])
    for sign in ("Traceback", "BrokenPipeError", "Exception ignored", "Logging error"):
        assert sign not in err, err[-3000:]


@pytest.fixture(scope="module")
def piped_sweep(tmp_path_factory, cache):
    """`run -m` of 2 tiny runs with its stdout closed, then its plan and its report likewise."""
    root = tmp_path_factory.mktemp("closed_pipe")
    store = root / "mlflow.db"
    where = [f"tracking.uri=sqlite:///{store}", f"cache_dir={cache}"]
    return root, store, where, _closed_pipe(["bertaccel.run", *SWEEP, *where], root)


def test_a_sweep_with_its_stdout_closed_runs_to_its_end_quietly(piped_sweep):
    root, store, where, (code, err) = piped_sweep
    _quiet(code, err)
    runs = search_runs(f"sqlite:///{store}", "bertaccel")
    assert sorted(r.info.status for r in runs) == ["FINISHED"] * 3, [(r.info.run_name, r.info.status) for r in runs]


def test_plan_report_doctor_and_a_single_run_with_stdout_closed_end_quietly(piped_sweep, cache):
    root, store, where, _ = piped_sweep
    code, err = _closed_pipe(["bertaccel.plan", *SWEEP[1:], *where], root)
    _quiet(code, err)
    saved = list((cache / "plan").glob("*.json"))  # the plan saved whole (or, exit 141, not at all)
    assert [json.loads(p.read_text())["runs"] for p in saved] if code == 0 else not saved, saved
    assert not list((cache / "plan").glob("*.tmp*"))
    _quiet(*_closed_pipe(["bertaccel.report", "--uri", f"sqlite:///{store}", "--out", str(root / "report")], root))
    assert (root / "report" / "report.md").is_file()
    _quiet(*_closed_pipe(["bertaccel.doctor"], root))
    code, err = _closed_pipe(["bertaccel.run", *SWEEP[1:-1], *where], root)
    _quiet(code, err)
    assert len(search_runs(f"sqlite:///{store}", "bertaccel")) == 4
