"""runs/startup.py on its own: marks to phases, the main process's marks, the process start."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from bertaccel.context import CONTEXT_ENV, current
from bertaccel.runs import startup


def test_marks_on_another_clock_are_held_between_their_neighbours_and_the_sum_is_exact():
    # A forked process's start is read to the clock tick (10 ms): it may read before the mark
    # taken just before the fork. Its phase is then 0, never negative, and the total is kept.
    marks = [("a", 100.0), ("fork", 100.500), ("setup", 100.495), ("imports", 100.520)]
    phases = startup.before_run(marks, 100.0, 100.600)
    assert [p for p, _ in phases] == ["a", "fork", "setup", "imports"]
    assert min(s for _, s in phases) >= 0 and phases[1][1] == 0.0
    assert abs(sum(s for _, s in phases) - 0.6) < 1e-9
    ((phase, seconds),) = startup.before_run([], 100.0, 100.6)  # execute called directly: one phase
    assert phase == startup.UNMARKED and abs(seconds - 0.6) < 1e-9


def test_rounded_phases_sum_to_the_rounded_total_however_many():
    phases = [(f"p{i}", 0.0004) for i in range(40)]  # each rounds to 0.000 alone: 16 ms would vanish
    out = startup._rounded(phases)
    assert abs(sum(out.values()) - 0.016) < 1e-9 and min(out.values()) >= 0


@pytest.mark.slow
def test_the_main_process_marks_reach_its_first_job_only_and_not_its_children(monkeypatch):
    monkeypatch.setenv(CONTEXT_ENV, "")  # (and gone again after the test)
    started = time.time() - 1
    startup.mark_main(startup.MAIN_COMPOSE)
    startup.mark_main(startup.MAIN_PARENT_RUN)
    first = startup.job_marks(started, first_of_process=True)
    assert [p for p, _ in first] == [startup.MAIN_IMPORTS, startup.MAIN_COMPOSE, startup.MAIN_PARENT_RUN,
                                     startup.JOB_START]
    assert first[0][1] == started and [t for _, t in first] == sorted(t for _, t in first)
    assert [p for p, _ in startup.job_marks(time.time(), first_of_process=False)] == [startup.JOB_START]
    # A child process inherits the variable, not the marks: its first job counts from its own start.
    code = ("import time; from bertaccel.runs import startup; "
            "print([p for p, _ in startup.job_marks(time.time() - 1, True)])")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ),
                           timeout=120)
    assert child.stdout.strip() == repr([startup.PROCESS_START, startup.JOB_START]), child.stderr
    assert current().startup is not None and current().startup.pid == os.getpid()


@pytest.mark.slow
def test_a_process_start_is_read_to_the_clock_tick():
    # A child started now: its start within the time it took to start it (and a tick either way),
    # where psutil's create_time may read up to a second early.
    before = time.time()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        after = time.time()
        started = startup.process_started_at(proc.pid)
        assert before - 0.011 <= started <= after + 0.011, (before, started, after)
    finally:
        proc.kill()
        proc.wait()
