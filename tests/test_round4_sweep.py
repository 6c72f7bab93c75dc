"""Issue 59, round 4: no typo exhausts the machine, and a sweep bad in every requested configuration
writes nothing.

- A sweep's size (configurations x repeats) is counted from the command line before anything is
  listed: past sweep.max_runs it is one line with the count, exit 2, nothing written, in seconds
  and in bounded memory (RLIMIT_AS), for `run -m` and `plan`. The count is Hydra's own (each
  sweep's length computed, not listed), and sweep.max_runs raises the limit.
- Below it, planning is linear: each configuration's hash once (plan/grid.py hashed every earlier
  one again for each new one) and the sweep's first line comes before the whole list is composed.
- The seeds repeats derive are checked before the first run; sweep.repeats without -m is refused.
- Every requested configuration refused (the added baseline aside, this machine's refusals too)
  refuses the sweep; an fp8 sweep whose only finished run is the added baseline exits 1.
"""
from __future__ import annotations

import os
import re
import resource
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest
from conftest import TINY
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
MEMORY_BYTES = 6 * 2**30  # the address space a refused sweep may take: a billion jobs listed took far more


def _bounded_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))


def _command(tool: str, tmp_path: Path, args: List[str]) -> List[str]:
    multirun = ["-m"] if tool == "bertaccel.run" else []
    return [sys.executable, "-m", tool, *multirun, *args, f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
            f"cache_dir={tmp_path / 'cache'}"]


def _said(err: str) -> List[str]:
    """stderr's lines without what a run writes there anyway (progress bars, MLflow's INFO lines)."""
    return [line for line in err.splitlines() if line.strip() and not re.match(r"^epoch \d+/\d+:", line)
            and "INFO mlflow" not in line]


def _refused(tmp_path: Path, tool: str, args: List[str], timeout_s: float = 60) -> str:
    """The command's one line: exit 2, within timeout_s, in bounded memory, nothing written."""
    started = time.monotonic()
    r = warm_cli.run(_command(tool, tmp_path, args), cwd=tmp_path, capture_output=True, text=True,
                     timeout=timeout_s, env=ENV, preexec_fn=_bounded_memory)
    assert time.monotonic() - started < timeout_s
    assert r.returncode == 2, (r.stdout + r.stderr)[-3000:]
    lines = _said(r.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr[-3000:]
    assert "Traceback" not in r.stdout + r.stderr
    assert "[sweep]" not in r.stdout  # no parent run, no summary
    assert list(tmp_path.iterdir()) == []  # no store, no lock, no multirun/, no outputs/, no saved plan
    return lines[0]


# --- past the limit: one line, in seconds and bounded memory -------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("tool, args, runs", [
    ("bertaccel.run", ["model=tiny", "sweep.repeats=1000000000"], 1000000000),
    ("bertaccel.run", ["model=tiny", "train.seed=range(0,1000000000)"], 1000000000),
    ("bertaccel.plan", ["model=tiny", "sweep.repeats=1000000000"], 1000000000),
    ("bertaccel.plan", ["model=tiny", "hydra/sweeper=basic", "precision=fp32,bf16", "train.seed=range(0,6000)"], 12000),
])
def test_a_sweep_past_max_runs_is_one_line_with_its_count_in_seconds_and_bounded_memory(tmp_path, tool, args, runs):
    line = _refused(tmp_path, tool, args)
    assert f"the sweep has {runs} runs" in line and "sweep.max_runs=10000" in line, line
    assert f"sweep.max_runs={runs}" in line  # how to run it on purpose


@pytest.mark.slow  # several seconds on one core: the full suite runs it, the inner loop does not
def test_sweep_max_runs_is_the_limit_and_raises_it(tmp_path):
    """In-process through plan's expansion (the same code as run -m's): 3 runs past max_runs=2 is
    refused with its count, max_runs=3 plans all three."""
    from bertaccel.plan.grid import PlanInputError, expand

    common = ["model=tiny", "train.seed=range(0,3)", f"tracking.uri=sqlite:///{tmp_path / 'none.db'}"]
    with pytest.raises(PlanInputError, match=r"the sweep has 3 runs \(train.seed: 3 values\), more than sweep.max_runs=2"):
        expand("config", common + ["sweep.max_runs=2"])
    assert len(expand("config", common + ["sweep.max_runs=3"]).configs) == 3


@pytest.mark.parametrize("override", [
    "train.seed=range(0,7)", "train.seed=range(10,0,-3)", "train.seed=range(5,5)", "optimizer.lr=range(0.1,0.5,0.1)",
    "optimizer.lr=range(1,0,-0.25)", "precision=fp32,bf16,fp16", "precision=glob(fp*)", "train.seed=shuffle(range(0,4))",
    "train.seed=3", "precision=choice(fp32,bf16)", "train.seed=sort(3,1,2,1)",
])
def test_a_sweeps_length_is_counted_as_hydra_lists_it(override):
    """values_count computes a sweep's length without listing it; it must be what Hydra lists."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from bertaccel.config import CONF_DIR, register_configs
    from bertaccel.runs.sweep_jobs import values_count

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            loader = GlobalHydra.instance().config_loader()
            (o,) = OverridesParser.create(config_loader=loader).parse_overrides([override])
            listed = len(list(o.sweep_string_iterator())) if o.is_sweep_override() else 1
            assert values_count(o) == listed, override
    finally:
        GlobalHydra.instance().clear()


# --- below it: linear, and its first line early --------------------------------------------------

def _counting_hashes(monkeypatch) -> List[int]:
    import bertaccel.record.run_record as run_record

    calls = [0]
    real = run_record.cfg_hash

    def counted(cfg):
        calls[0] += 1
        return real(cfg)

    monkeypatch.setattr(run_record, "cfg_hash", counted)
    return calls


@pytest.mark.slow  # several seconds on one core: the full suite runs it, the inner loop does not
def test_plan_hashes_each_configuration_once(tmp_path, monkeypatch):
    """plan/grid.py hashed every earlier configuration again for each new one: n(n+1)/2 hashes
    (21 for 6; 5050 for 100, 47.6 s). Now one per configuration (a repeat given twice included)."""
    from bertaccel.plan.grid import expand

    calls = _counting_hashes(monkeypatch)
    grid = expand("config", ["model=tiny", "train.seed=1,2,3,4,5,6,6", f"tracking.uri=sqlite:///{tmp_path / 'x.db'}"])
    assert len(grid.configs) == 6
    assert calls[0] == 7


@pytest.mark.slow  # several seconds on one core: the full suite runs it, the inner loop does not
def test_the_sweeps_own_plan_hashes_each_job_once(monkeypatch):
    """runs/sweep_plan.py, the plan run -m makes before its store: one hash per job too."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    from bertaccel.config import CONF_DIR, register_configs
    from bertaccel.runs.sweep_plan import plan_sweep

    register_configs()
    calls = _counting_hashes(monkeypatch)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="t"):
            loader = GlobalHydra.instance().config_loader()
            master = loader.load_configuration("config", ["model=tiny", "train.seed=1,2,3", "precision=fp32,bf16"],
                                               run_mode=RunMode.MULTIRUN)
            plan = plan_sweep(master)
    finally:
        GlobalHydra.instance().clear()
    assert len(plan.jobs) == 6 and calls[0] == 6  # (fp32 is on the defaults: no baseline added)


def _first_line(cmd: List[str], cwd: Path, stream: str, timeout_s: float) -> str:
    """The first line the command writes on stream (stdout or stderr), then the command stopped
    (its whole process group: the run's forkserver too)."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_bounded_memory)
    try:
        pipe = proc.stdout if stream == "stdout" else proc.stderr
        sel = selectors.DefaultSelector()
        sel.register(pipe, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if sel.select(timeout=1):
                line = pipe.readline()
                if not line or not re.match(r"^(\d{4}/\d\d/\d\d .*INFO|\s*$)", line):
                    return line
            if proc.poll() is not None:
                return pipe.readline()
        return ""
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("tool, stream, prefix", [("bertaccel.run", "stdout", "[sweep] "),
                                                  ("bertaccel.plan", "stderr", "plan: ")])
def test_a_ten_thousand_run_sweep_says_its_first_line_within_seconds(tmp_path, tool, stream, prefix):
    """`train.seed=range(0,10000)`: 120 s without a line from run -m, 240 s from plan. Its first
    line now comes before the configurations are composed (Hydra: a few a second)."""
    line = _first_line(_command(tool, tmp_path, ["model=tiny", "train.seed=range(0,10000)"]), tmp_path, stream, 60)
    assert line.startswith(f"{prefix}composing and checking 10000 configurations"), line


# --- seeds, repeats without -m ---------------------------------------------------------------------

@pytest.mark.slow
def test_repeats_past_the_seed_range_are_refused_before_the_first_run(tmp_path):
    """sweep.repeats=3 train.seed=4294967295 ran the first round, then failed the rest one by one, exit 0."""
    line = _refused(tmp_path, "bertaccel.run", [*TINY, "sweep.repeats=3", "train.seed=4294967295"])
    assert "sweep.repeats=3" in line and "4294967297" in line and "at most 4294967293" in line, line


@pytest.mark.slow
def test_sweep_repeats_without_m_is_refused(tmp_path):
    """A single run with sweep.repeats=3 ran once and said nothing of the repeats."""
    r = warm_cli.run([sys.executable, "-m", "bertaccel.run", *TINY, "sweep.repeats=3",
                      f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", f"cache_dir={tmp_path / 'cache'}"],
                     cwd=tmp_path, capture_output=True, text=True, timeout=300, env=ENV)
    assert r.returncode == 2, (r.stdout + r.stderr)[-3000:]
    assert _said(r.stderr) == ["error: sweep.repeats=3 needs -m (a sweep): a single run runs once; add -m to run "
                               "it 3 times with seeds train.seed, +1, ..."], r.stderr[-3000:]
    assert list(tmp_path.iterdir()) == []  # no store, no outputs/


# --- bad in every requested configuration ----------------------------------------------------------

@pytest.mark.slow
def test_a_sweep_every_requested_configuration_of_which_is_refused_writes_nothing(tmp_path):
    """num_gpus=2,3 with train.batch_size=auto: both requested refused by a rule; the added baseline
    (num_gpus=1, auto on a CPU: refused at its turn there) ran alone, with a store, a parent run,
    multirun/ and exit 1."""
    line = _refused(tmp_path, "bertaccel.run", ["model=tiny", "num_gpus=2,3", "train.batch_size=auto"], timeout_s=120)
    assert "train.batch_size=auto with num_gpus=2" in line and "refused too: nothing to run" in line, line


@pytest.mark.slow
def test_a_sweep_whose_only_finished_run_is_its_added_baseline_exits_1(tmp_path):
    """optimizer.lr=1e30 fails in training (NaN loss); the baseline the sweep adds (the default lr)
    finishes: exit 0 before. (A configuration skipped here, known before it runs, leaves the baseline
    untrained instead: tests/test_no_baseline_when_all_skipped.py.)"""
    r = warm_cli.run(_command("bertaccel.run", tmp_path, [*TINY, "optimizer.lr=1e30", "train.log_every_steps=1"]),
                       cwd=tmp_path, capture_output=True, text=True, timeout=600, env=ENV)
    assert r.returncode == 1, (r.stdout + r.stderr)[-3000:]
    assert "2 runs: finished=1 skipped=0 failed=1" in r.stdout, r.stdout[-3000:]
    assert "[sweep] none of the requested configurations finished (only the baseline the sweep added did)" in r.stdout
    assert "Traceback" not in r.stderr  # (the failed run's log on stdout has its own, as any failed run's)
