"""The answer warns beside a winner whose one-time warm-up is longer than its training window,
whatever produced it (report/one_time.py): here a Triton-JIT-only run (compile=off, its fused
optimizer's kernels compiled at its first step: compile_time_s), in a real MLflow store written as
job.py writes runs, read through the report's own command. Break-even worked by hand."""
from __future__ import annotations

import sys

import pytest

from report_store import Store

from bertaccel.report.baseline import default_choices
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

# Every test here starts a real process (the CLI, a script, a server) or trains: slow (docs/contributing.md).
pytestmark = pytest.mark.slow


def _run(store, name, choices, time_s, compile_time_s, steps=100, samples=3200, accuracy=0.9):
    return store.log(name, {**choices, "accumulation": "1", "num_gpus": "1"},
                     {"train_time_s": time_s, "cost_usd": time_s / 100, "test_accuracy": accuracy,
                      "compile_time_s": compile_time_s, "optimizer_steps": steps, "train_samples": samples}, {})


def _answer(tmp_path, store) -> str:
    r = warm_cli.run([sys.executable, "-m", "bertaccel.report", "--uri", store.uri, "--out", "rep"],
                     cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return (tmp_path / "rep" / "report.md").read_text().split("\n## ")[1]


def test_a_jit_only_winner_whose_warm_up_outlasts_its_window_is_warned_with_its_break_even(tmp_path):
    d = default_choices()
    store = Store(tmp_path)
    # The baseline: 3.0 s for 100 steps, 0.1 s warm-up. The winner (adamw_fused, compile=off):
    # 1.45 s for the same 100 steps of 32 samples, 2.4 s warm-up (its Triton JIT).
    _run(store, "defaults", d, 3.0, 0.1)
    _run(store, "optimizer=adamw_fused", {**d, "optimizer": "adamw_fused"}, 1.45, 2.4)
    answer = _answer(tmp_path, store)
    # By hand: 2.3 s more warm-up; per sample 3.0/3200 - 1.45/3200 = 1.55/3200 s saved, so
    # 2.3 / (1.55/3200) = 4748.4 samples = 148.4 steps of 32 -> 149 steps, against the 100 it ran.
    assert ("its one-time warm-up (2.40 s: compile_time_s, compile / Triton JIT / CUDA-graph capture) is longer "
            "than its training window (1.45 s); the 2.30 s more than the baseline's pays back after 149 steps; "
            "its run took 100 steps") in answer


def test_no_warning_where_the_warm_up_is_short_or_the_steps_never_pay_it_back(tmp_path):
    d = default_choices()
    store = Store(tmp_path)
    _run(store, "defaults", d, 3.0, 0.1)
    _run(store, "attention=sdpa", {**d, "attention": "sdpa"}, 1.0, 0.5)       # warm-up within its window
    answer = _answer(tmp_path, store)
    assert "one-time warm-up" not in answer
    (tmp_path / "b").mkdir()
    store = Store(tmp_path / "b")
    _run(store, "defaults", d, 1.0, 0.1, accuracy=0.80)
    # Slower per sample than the baseline, but the only run above the accuracy floor: it wins.
    _run(store, "optimizer=adamw_fused", {**d, "optimizer": "adamw_fused"}, 1.5, 2.4, accuracy=0.9)
    answer = _answer(tmp_path / "b", store)
    assert "longer than its training window (1.50 s); 2.30 s more than the baseline's, never paid back" in answer
    # A winner slower than the baseline says so first, and why it may still win.
    assert "Your baseline 'defaults' (0.8000) is below the accuracy floor (0.8900)" in answer
    assert "best under every strategy: 1.50x slower" in answer
