"""sweep.concurrent=N (issue 62, item 1): runs share one GPU for their training while each run's
timed window has it alone. The lock protocol with real processes, the window's plan, the memory
admission, the projection's arithmetic, and real sweeps through the CLI."""
from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path

import pytest

from bertaccel.train.exclusive import SweepLock, admits, wait_for_memory, window_plan


def _reader(directory: str, hold_s: float, started, out) -> None:
    lock = SweepLock(Path(directory))
    lock.acquire_shared()
    t0 = time.time()
    started.set()
    time.sleep(hold_s)
    t1 = time.time()
    lock.release_shared()
    out.put(("reader", t0, t1))


def _writer(directory: str, hold_s: float, out) -> None:
    lock = SweepLock(Path(directory))
    lock.acquire_exclusive()
    t0 = time.time()
    time.sleep(hold_s)
    t1 = time.time()
    lock.release_exclusive()
    out.put(("writer", t0, t1))


def _stepper(directory: str, steps: int, out) -> None:
    """A run's reader side as ExclusiveWindow uses it: held throughout, yielded at a step boundary
    only when a window waits."""
    lock = SweepLock(Path(directory))
    lock.acquire_shared()
    held = [time.time()]
    holds = []
    for _ in range(steps):
        if lock.writer_waiting():
            holds.append((held[0], time.time()))
            lock.release_shared()
            lock.acquire_shared()
            held = [time.time()]
        time.sleep(0.01)  # a step
    holds.append((held[0], time.time()))
    lock.release_shared()
    out.put(("holds", holds))


def _overlap(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1]


@pytest.mark.slow
def test_a_writer_waits_for_the_readers_and_new_readers_wait_for_the_writer(tmp_path):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    started = [ctx.Event(), ctx.Event()]
    readers = [ctx.Process(target=_reader, args=(str(tmp_path), 1.0, started[i], out)) for i in range(2)]
    for p in readers:
        p.start()
    for e in started:
        assert e.wait(60)
    writer = ctx.Process(target=_writer, args=(str(tmp_path), 1.0, out))
    writer.start()
    time.sleep(0.3)  # the writer now holds the turnstile and waits for the readers
    late_started = ctx.Event()
    late = ctx.Process(target=_reader, args=(str(tmp_path), 0.1, late_started, out))
    late.start()
    got = [out.get(timeout=60) for _ in range(4)]
    for p in (*readers, writer, late):
        p.join(60)
        assert p.exitcode == 0
    (w,) = [g[1:] for g in got if g[0] == "writer"]
    firsts = sorted((g[1:] for g in got if g[0] == "reader"), key=lambda r: r[0])
    # The two first readers held it together; the writer started only after both let go ...
    assert _overlap(firsts[0], firsts[1])
    assert all(w[0] >= r[1] for r in firsts[:2])
    # ... and the reader that came while the writer waited was held back until the writer was done.
    assert firsts[2][0] >= w[1]


@pytest.mark.slow
def test_steppers_yield_at_a_step_boundary_and_resume_after_the_window(tmp_path):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    steppers = [ctx.Process(target=_stepper, args=(str(tmp_path), 150, out)) for _ in range(2)]
    for p in steppers:
        p.start()
    time.sleep(0.8)  # both are stepping
    writer = ctx.Process(target=_writer, args=(str(tmp_path), 0.5, out))
    writer.start()
    got = [out.get(timeout=60) for _ in range(3)]
    for p in (*steppers, writer):
        p.join(60)
        assert p.exitcode == 0
    (w,) = [g[1:] for g in got if g[0] == "writer"]
    holds = [g[1] for g in got if g[0] == "holds"]
    for run in holds:
        assert len(run) == 2  # paused once, for the window, then resumed
        assert not any(_overlap(h, w) for h in run)
        assert run[0][1] <= w[0] and run[1][0] >= w[1]


def test_the_window_is_the_steady_steps_after_warm_up_clipped_and_said():
    assert window_plan(1000, 200) == (3, 200, "")
    first, steps, note = window_plan(50, 200)
    assert (first, steps) == (3, 47)
    assert "sweep.window_steps=200 clipped to 47" in note
    assert window_plan(2, 200)[:2] == (0, 2)  # too short for a warm-up: all its steps


def test_a_run_that_does_not_fit_waits_until_the_memory_is_free():
    assert admits(None, 10**12)  # a CPU: nothing to check
    assert admits(8 * 2**30, 8 * 2**30) and not admits(8 * 2**30 - 1, 8 * 2**30)
    free = iter([1 * 2**30, 2 * 2**30, 6 * 2**30])  # the others finish, one by one
    slept, said = [], []
    waited = wait_for_memory(lambda: next(free), 5 * 2**30, said.append, poll_s=1.5, sleep=slept.append)
    assert slept == [1.5, 1.5] and len(said) == 1 and "5.00 GiB" in said[0]
    assert waited >= 0.0
    assert wait_for_memory(lambda: 6 * 2**30, 5 * 2**30, said.append, sleep=slept.append) == 0.0
    assert slept == [1.5, 1.5]
