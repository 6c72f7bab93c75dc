"""sweep.concurrent=N (issue 62, item 1): runs share one GPU for their training while each run's
timed window has it alone. The lock protocol with real processes, the window's plan, the memory
admission, the projection's arithmetic, and real sweeps through the CLI."""
from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path

import pytest
from conftest import kill_mid_run, sweep_children
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

ROOT = Path(__file__).resolve().parent.parent

from bertaccel.train.exclusive import SweepLock, WindowFigures, admits, wait_for_memory, window_plan


def _reader(directory: str, hold_s: float, started, out, release=None) -> None:
    lock = SweepLock(Path(directory))
    lock.acquire_shared()
    t0 = time.time()
    started.set()
    if release is not None:  # (held until the test lets go, however late the other reader started)
        assert release.wait(120)
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


def _stepper(directory: str, stepping, stop, out) -> None:
    """A run's reader side as ExclusiveWindow uses it: held throughout, yielded at a step boundary
    only when a window waits. It steps until `stop` is set (not for a fixed count: a spawned writer
    can take seconds to start on a loaded machine, and a fixed count could end before it came)."""
    lock = SweepLock(Path(directory))
    lock.acquire_shared()
    held = [time.time()]
    holds = []
    stepping.set()
    while not stop.is_set():
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
    # The first two readers hold until both hold and the writer waits (a hold of fixed length let
    # one end before the other, spawned seconds later on a loaded machine, began).
    release = ctx.Event()
    readers = [ctx.Process(target=_reader, args=(str(tmp_path), 0.2, started[i], out, release)) for i in range(2)]
    for p in readers:
        p.start()
    for e in started:
        assert e.wait(60)
    writer = ctx.Process(target=_writer, args=(str(tmp_path), 1.0, out))
    writer.start()
    deadline = time.time() + 60
    while not SweepLock(tmp_path).writer_waiting():  # the writer holds the turnstile, waits for the readers
        assert time.time() < deadline, "the writer never came"
        time.sleep(0.02)
    late_started = ctx.Event()
    late = ctx.Process(target=_reader, args=(str(tmp_path), 0.1, late_started, out))
    late.start()
    time.sleep(0.5)  # (the late reader on its way to the lock; one later still is held back alike)
    release.set()
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
    stepping, stop = [ctx.Event(), ctx.Event()], ctx.Event()
    steppers = [ctx.Process(target=_stepper, args=(str(tmp_path), stepping[i], stop, out)) for i in range(2)]
    for p in steppers:
        p.start()
    for e in stepping:
        assert e.wait(60)  # both are stepping
    writer = ctx.Process(target=_writer, args=(str(tmp_path), 0.5, out))
    writer.start()
    done = out.get(timeout=60)  # the writer's window, once both steppers let it in
    time.sleep(0.3)  # the steppers step on after it
    stop.set()
    got = [done] + [out.get(timeout=60) for _ in range(2)]
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


def _figures(steps: int = 5, time_s: float = 0.5) -> WindowFigures:
    return WindowFigures(wanted_steps=steps, first_step=3, steps=steps, samples=steps * 16, time_s=time_s,
                         start_unix=100.0, end_unix=100.0 + time_s)


def test_the_projection_is_the_window_times_the_run_over_the_window_steps():
    from bertaccel.measure.collectors import Reading
    from bertaccel.record.exclusive import projected_result, window_readings
    from bertaccel.train.result import EpochStats, TrainResult

    fig = _figures(steps=5, time_s=0.5)
    step_ms = [90.0, 80.0, 70.0, 10.0, 12.0, 11.0, 13.0, 14.0, 50.0, 60.0]  # steps 4-8 are the window's
    phases = [{"forward_ms": t / 2, "backward_ms": t / 4, "optimizer_ms": t / 4} for t in step_ms]
    result = TrainResult(epochs=[EpochStats(0, 0.7, 0.5, 10, 9.0, 1.0, 10, 160, step_ms=step_ms, phase_ms=phases),
                                 EpochStats(1, 0.6, 0.6, 10, 8.0, 1.0, 10, 160)])
    projected = projected_result(result, fig)
    # By hand: 0.5 s for 5 steps, the run has 20 steps: 0.5 x 20 / 5 = 2.0 s (the shared clock said 17 s).
    assert projected.train_time_s == pytest.approx(2.0)
    assert projected.shared_train_time_s == pytest.approx(17.0)
    assert projected.step_time_ms == 12.0  # median of 10, 12, 11, 13, 14
    assert projected.phase_ms == {"forward_ms": 6.0, "backward_ms": 3.0, "optimizer_ms": 3.0}  # the window's too
    assert result.step_time_ms != 12.0  # (the whole epoch's median would be another)
    assert projected.test_accuracy == 0.6 and projected.samples == 320  # the full training's
    readings = window_readings({"energy_kwh": Reading(0.001, "NVML energy counter"),
                                "avg_power_w": Reading(300.0, "energy / window")}, fig, 20)
    assert readings["energy_kwh"].value == pytest.approx(0.004)  # 0.001 x 20 / 5
    assert readings["window_energy_kwh"].value == 0.001
    assert readings["energy_kwh"].source.startswith("projected from an exclusive window of 5 steps: ")
    assert "0.001 x 20 / 5" in readings["energy_kwh"].source
    assert readings["avg_power_w"].value == 300.0  # a rate: the window's own
    assert readings["avg_power_w"].source.startswith("over an exclusive window of 5 steps")


CONCURRENT = ["-m", "train.seed=1,2,3", "model=tiny", "train.device=cpu", "dataset.train_subset=256",
              "dataset.test_subset=64", "train.batch_size=16", "sweep.baseline=false", "sweep.concurrent=3",
              "sweep.window_steps=5"]


@pytest.mark.slow
def test_a_concurrent_sweep_times_each_window_alone_and_projects_it(cli, monkeypatch):
    import json

    # One "GPU" by name: the launcher hands its slots out as on a GPU host (the runs use the CPU).
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "gpuA")
    done = cli(CONCURRENT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "3 at a time" in done.stdout + done.stderr and "each timed alone over an exclusive window" in done.stdout + done.stderr
    kids = sweep_children(cli.store)
    assert sorted(k.data.tags["status"] for k in kids) == ["finished"] * 3  # every run finishes
    # The three share the one GPU, and their training overlaps (side by side, not one after another).
    assert {k.data.tags["cuda_visible_devices"] for k in kids} == {"gpuA"}
    trained = sorted(json.loads(k.data.tags["train_windows_unix"])[0] for k in kids)
    assert trained[1][0] < trained[0][1] and trained[2][0] < trained[0][1]
    windows = {k.info.run_id: json.loads(k.data.tags["exclusive_window_unix"]) for k in kids}
    holds = {k.info.run_id: json.loads(k.data.tags["exclusive_holds_unix"]) for k in kids}
    for rid, (start, end) in windows.items():
        assert start < end
        for other, (s, e) in windows.items():
            assert other == rid or not _overlap((start, end), (s, e))  # no two windows overlap
        for other, spans in holds.items():
            if other != rid:  # no other run's step (nor warm-up, nor evaluation) overlaps a window
                assert spans and not any(_overlap((start, end), tuple(h)) for h in spans)
    for k in kids:
        m, t = k.data.metrics, k.data.tags
        # The projection, by hand from the recorded window figures: window time x steps / window steps.
        assert m["window_steps"] == 5 and m["optimizer_steps"] == 16
        assert m["train_time_s"] == pytest.approx(m["window_time_s"] * 16 / 5, rel=1e-9)
        assert m["throughput_samples_s"] == pytest.approx(m["train_samples"] / m["train_time_s"], rel=1e-9)
        assert m["step_time_mean_ms"] == pytest.approx(1000 * m["window_time_s"] / 5, rel=1e-9)
        assert t["train_time_s_source"].startswith("projected from an exclusive window of 5 steps: window_time_s "
                                                   "x optimizer_steps / window_steps = ")
        assert "x 16 / 5" in t["train_time_s_source"]
        assert t["window_end_unix_source"] and m["window_start_unix"] == windows[k.info.run_id][0]
        assert "shared with the sweep's other runs" in t["shared_train_time_s_source"]
        assert m["shared_train_time_s"] > 0 and "test_accuracy" in m  # accuracy: the full training's
        # the window lies inside the run's own (shared) training window
        (train_window,) = json.loads(t["train_windows_unix"])
        assert train_window[0] <= m["window_start_unix"] < m["window_end_unix"] <= train_window[1]
        assert k.data.params["sweep.concurrent"] == "3"


@pytest.mark.slow
def test_the_mode_leaves_the_losses_alone_and_the_default_records_no_window(cli, tmp_path):
    one = ["model=tiny", "train.device=cpu", "dataset.train_subset=128", "dataset.test_subset=64",
           "train.batch_size=16"]
    shared = cli(["-m", "train.seed=1", *one, "sweep.baseline=false", "sweep.concurrent=2", "sweep.window_steps=3"])
    assert shared.returncode == 0, shared.stderr[-2000:]
    alone_store = f"sqlite:///{tmp_path / 'alone.db'}"
    alone = cli(["-m", "train.seed=1", *one, "sweep.baseline=false"], uri=alone_store)
    assert alone.returncode == 0, alone.stderr[-2000:]
    (a,), (b,) = sweep_children(cli.store), sweep_children(alone_store)
    assert a.data.metrics["train_loss"] == b.data.metrics["train_loss"]  # bit for bit
    assert a.data.metrics["test_accuracy"] == b.data.metrics["test_accuracy"]
    assert "window_time_s" not in b.data.metrics and "exclusive_window_unix" not in b.data.tags
    assert b.data.tags["train_time_s_source"] == "time.perf_counter (device synchronized at window edges)"


@pytest.mark.slow
def test_contradictory_combinations_are_refused_one_line_each(cli):
    refused = cli(["model=tiny", "train.device=cpu", "sweep.concurrent=2", "launcher.name=inline", "num_gpus=2"])
    assert refused.returncode == 2
    assert "sweep.concurrent=2 trains runs side by side, each in processes of its own: launcher=inline" in refused.stderr
    assert "sweep.concurrent=2 shares one GPU between runs and times each alone, but num_gpus=2" in refused.stderr
    assert "Traceback" not in refused.stderr


@pytest.mark.slow
def test_a_killed_concurrent_sweep_is_resumed_like_any_other(cli, tmp_path):
    import os
    import subprocess
    import sys
    from collections import Counter

    sweep = [*CONCURRENT[:-2], "dataset.train_subset=384", "train.epochs=2", "sweep.concurrent=2",
             "sweep.window_steps=5"]
    cmd = [sys.executable, "-m", "bertaccel.run", *sweep, f"tracking.uri={cli.store}", f"cache_dir={tmp_path / 'cache'}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = warm_cli.popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          start_new_session=True)
    killed = kill_mid_run(proc, cli.store, timeout_s=400)  # one done, another mid-way
    assert killed, "the sweep ended before it could be killed mid-run"
    # The runs the kill left running (one that finished between kill_mid_run's look and its kill,
    # possible on a loaded machine, is finished, not left running).
    left = {k.info.run_id for k in sweep_children(cli.store) if k.data.tags["status"] == "running"}
    rerun = warm_cli.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    kids = sweep_children(cli.store)
    finished = [k for k in kids if k.data.tags["status"] == "finished"]
    assert sorted(Counter(k.data.tags["config_hash"] for k in finished).values()) == [1, 1, 1]  # each exactly once
    assert {k.info.run_id for k in kids if k.data.tags["status"] == "interrupted"} == left  # the killed run(s), labelled
    assert {k.data.tags["status"] for k in kids} <= {"finished", "interrupted"}
    assert all("exclusive_window_unix" in k.data.tags for k in finished)


@pytest.mark.slow
def test_the_proof_script_compares_a_sweep_alone_and_shared_on_the_cpu(tmp_path):
    """benchmarks/exclusive_proof.sh (the GPU proof of issue 62, item 2) at a tiny size on the CPU:
    both sweeps run, and each row's ratio is the shared runs' mean projected train time over the
    alone runs' mean, read back from the two stores."""
    import os
    import re
    import subprocess
    import statistics

    out = tmp_path / "proof"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "exclusive_proof.sh"), str(out), "2", "-m",
                           "accumulation=1,2", "model=tiny", "train.device=cpu", "dataset.train_subset=128",
                           "dataset.test_subset=32", "train.batch_size=8", "sweep.baseline=false",
                           "sweep.repeats=2", "sweep.window_steps=5"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "alone: sweep.concurrent=1, exit 0" in done.stdout and "shared: sweep.concurrent=2, exit 0" in done.stdout
    for k in (1, 2):
        row = next(line for line in done.stdout.splitlines() if line.startswith(f"| accumulation={k} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1] == "2/2", row
        means = []
        for mode in ("alone", "shared"):
            runs = [r for r in sweep_children(f"sqlite:///{out / mode}.db") if r.info.run_name.startswith(f"accumulation={k}")]
            means.append(statistics.mean(r.data.metrics["train_time_s"] for r in runs))
        assert re.match(rf"{means[1] / means[0]:.3f}x, (inside|OUTSIDE)$", cells[4]), (row, means)
    assert re.search(r"projection inside the alone runs' interval: [0-2] of 2 figures", done.stdout)
    assert (out / "table.md").read_text().startswith("| configuration |")
