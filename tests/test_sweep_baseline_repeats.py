"""sweep.repeats and sweep.baseline (runs/sweep_jobs.py, hydra_plugins/bertaccel_sweeper): real
sweeps of the tiny model into a real store, the launch order read back from MLflow."""
from __future__ import annotations

import pytest

from conftest import TINY

from bertaccel.record.tracking import runs_by_status
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

# Every test here starts a real process (the CLI, a script, a server) or trains: slow (docs/contributing.md).
pytestmark = pytest.mark.slow

QUICK = [o for o in TINY if not o.startswith(("train.batch_size", "dataset.test_subset"))] + [
    "train.max_steps_per_epoch=2", "dataset.test_subset=32"]


def _launch_order(store):
    """(optimizer, batch size, attention, seed) of every run, in the order the runs started."""
    runs = sorted(runs_by_status(store, "bertaccel")["finished"], key=lambda r: r.info.start_time)
    return [(r.data.params["optimizer"], r.data.params["train.batch_size"], r.data.params["attention"],
             r.data.params["train.seed"]) for r in runs]


def test_repeats_are_interleaved_and_a_grid_with_the_defaults_adds_no_baseline(cli):
    # attention=eager at batch 32 is the defaults run: the baseline is in the grid, nothing is added.
    # Two configurations (not a 2x2 grid): A B A B vs A A B B is what tells interleaving, and each
    # run is a worker process of its own (seconds of start-up): 4 runs, not 8. (Options every CPU
    # runs: bf16 is skipped on a CPU without native bf16, and the test then measured the machine.)
    proc = cli(["-m", "attention=eager,sdpa", "sweep.repeats=2", *QUICK])  # (batch: the default 32)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[sweep] 4 runs;" in proc.stdout and "4 runs: finished=4" in proc.stdout
    assert "baseline added" not in proc.stdout
    configs = ["eager", "sdpa"]
    # A B A B: the second round after the whole first, on the next seed; never back to back.
    assert _launch_order(cli.store) == ([("adamw", "32", a, "42") for a in configs] +
                                        [("adamw", "32", a, "43") for a in configs])
    # The report groups them: 2 runs per configuration, means and intervals.
    report = cli.dir / "rep"
    import sys
    r = warm_cli.run([sys.executable, "-m", "bertaccel.report", "--uri", cli.store, "--out", str(report)],
                     capture_output=True, text=True, cwd=cli.dir)
    assert r.returncode == 0, r.stderr
    text = (report / "report.md").read_text()
    assert "(2 runs)" in text and "the run with the config groups' defaults" in text


def test_a_sweep_without_the_defaults_adds_its_baseline_once_and_resumes_it(cli):
    args = ["-m", "attention=sdpa", "optimizer=adamw,lamb", *QUICK, "train.batch_size=16"]
    proc = cli(args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[sweep] 3 runs;" in proc.stdout
    assert ("[sweep] baseline added: the config groups' defaults (precision=fp32 attention=eager encoder=hf "
            "compile=off freezing=none optimizer=adamw accumulation=1 on model=tiny") in proc.stdout
    order = _launch_order(cli.store)
    assert order == [("adamw", "16", "sdpa", "42"), ("lamb", "16", "sdpa", "42"), ("adamw", "16", "eager", "42")]
    # The same command again: the baseline is a finished configuration like the others, not run again.
    again = cli(args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "3 runs: finished=0 skipped=0 failed=0" in again.stdout and "already finished=3" in again.stdout
    assert len(runs_by_status(cli.store, "bertaccel")["finished"]) == 3
    # sweep.baseline=false: the grid alone (its runs already finished; no new run appears).
    alone = cli(args + ["sweep.baseline=false"])
    assert "[sweep] 2 runs;" in alone.stdout and "baseline added" not in alone.stdout


def test_repeats_and_a_seed_sweep_or_no_repeat_are_refused_before_anything_is_written(cli):
    for extra, said in ((["sweep.repeats=2", "train.seed=1,2"], "sweep.repeats=2 and a train.seed sweep"),
                        (["sweep.repeats=0"], "sweep.repeats=0: give the number of runs per configuration")):
        proc = cli(["-m", "precision=fp32,bf16", *QUICK, *extra])
        assert proc.returncode == 2, proc.stdout[-2000:]
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and said in lines[0], proc.stderr
    assert not (cli.dir / "mlflow.db").exists()
