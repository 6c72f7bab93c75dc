"""The report never compares times of runs that trained different amounts as if equal: a CSV
with train_samples, and a real capped sweep whose accumulation=4 run trains 4x the samples."""
from __future__ import annotations

import sys

import pytest
from conftest import TINY

from bertaccel.record.tracking import runs_by_status
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

# Every test here starts a real process (the CLI, a script, a server) or trains: slow (docs/contributing.md).
pytestmark = pytest.mark.slow

HEADER = "name,time_s,cost_usd,energy_kwh,occupancy_pct,accuracy,train_samples,step_time_ms,train_rows_full,batch_size"


def _report(args, cwd):
    return warm_cli.run([sys.executable, "-m", "bertaccel.report", *args], cwd=cwd, capture_output=True, text=True)


def _baseline_rows(md):
    table = md.split("## Against the baseline")[1].split("\n## ")[0]
    note = table.splitlines()[2]
    rows = {c[0]: c for c in ([x.strip() for x in line.strip("|").split("|")]
                              for line in table.splitlines() if line.startswith("| ") and "---" not in line)}
    return note, rows


def speed(cell):
    """'2.23x faster' -> 2.23, '1.50x slower' -> 1 / 1.5 (the report's two-decimal form)."""
    value = float(cell.split("x ")[0].split("(")[-1])
    return 1 / value if cell.endswith("slower") else value


def test_csv_speedup_is_per_sample_when_the_runs_trained_different_amounts(tmp_path):
    # a: 100 s for 1000 samples (0.1 s/sample); b: 60 s for 2000 (0.03 s/sample), both with a
    # full split of 4000 rows at 0.05 s (a) and 0.1 s (b) per step of 16 rows.
    (tmp_path / "runs.csv").write_text(f"{HEADER}\na,100,1,,,0.9,1000,50,4000,16\nb,60,0.6,,,0.9,2000,100,4000,16\n"
                                       f"c,80,0.8,,,0.9,,,,\n")
    r = _report(["--csv", "runs.csv", "--baseline", "a", "--out", "rep"], tmp_path)
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "the runs trained different numbers of samples (1000 to 2000, train_samples)" in md
    assert "the runs trained different numbers of samples" in r.stdout
    note, rows = _baseline_rows(md)
    assert "time per sample is compared, not time" in note and "null without train_samples (empty in the input)" in note
    assert rows["b"][2:] == ["2000", "0.9000", f"{(100 / 1000) / (60 / 2000):.2f}x faster", "+0.00 pts"]  # not 100/60
    assert rows["c"][2:4] == ["null", "0.9000"] and rows["c"][4].startswith("null (train_samples unknown")

    # Projected to one epoch of the full split, every run trains the same 4000 samples: times divide.
    r = _report(["--csv", "runs.csv", "--baseline", "a", "--project-epochs", "1", "--out", "rep2"], tmp_path)
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "rep2" / "report.md").read_text()
    assert "different numbers of samples" not in md
    note, rows = _baseline_rows(md)
    assert note.startswith("speed = baseline time / time, taking the runs to have trained as much: train_samples "
                           "unknown for 1 of 3 runs (no projection: step_time_ms empty in the input")
    assert rows["b"][1:5] == ["25.00", "4000", "0.9000", f"{25.0 / 12.5:.2f}x slower"]  # 250 steps x 0.05 s vs x 0.1 s


def test_capped_sweep_with_accumulation_is_compared_per_sample(cli, tmp_path):
    # max_steps_per_epoch caps optimizer steps: 2 steps of 1 x 16 rows against 2 of 4 x 16.
    proc = cli(["-m", "accumulation=1,4", *TINY, "train.max_steps_per_epoch=2"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = {r.info.run_name: r for r in runs_by_status(cli.store, "bertaccel")["finished"]}
    one, four = runs["accumulation=1"].data, runs["accumulation=4"].data
    assert (one.metrics["train_samples"], four.metrics["train_samples"]) == (32, 128)
    assert four.tags["train_samples_source"] == "rows of every trained micro-batch, summed over epochs and ranks"

    r = _report(["--uri", cli.store, "--baseline", "accumulation=1", "--out", "rep"], tmp_path)
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "the runs trained different numbers of samples (32 to 128, train_samples)" in md
    note, rows = _baseline_rows(md)
    assert "time per sample is compared, not time" in note
    t1, t4 = one.metrics["train_time_s"], four.metrics["train_time_s"]
    # (the sweep's runs are labelled by their value, '4' for accumulation=4: report/labels.py; --baseline
    # above names the run by its MLflow name)
    assert rows["4"][2] == "128"
    assert speed(rows["4"][4]) == pytest.approx((t1 / 32) / (t4 / 128), abs=0.006)
