"""benchmarks/energy_check.py's table on the CPU: a real sweep (with its parent run) into the
check's own store, then --table-only, which needs neither a GPU nor nvidia-smi."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bertaccel.record.tracking import search_runs

# Every test here starts a real process (the CLI, a script, a server) or trains: slow (docs/contributing.md).
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "energy_check.py"


def test_table_of_a_cpu_sweep_skips_the_parent_run_and_says_why_null(cli):
    sweep = cli(["-m", "precision=fp32,bf16", "model=tiny", "train.device=cpu", "dataset.train_subset=32",
                 "dataset.test_subset=16", "train.batch_size=16", "tracking.experiment=energy_check"])
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    runs = search_runs(cli.store, "energy_check")
    assert [r.data.tags.get("bertaccel.role") for r in runs].count("sweep") == 1  # the parent run is there
    children = {r.info.run_name: r for r in runs if r.data.tags.get("bertaccel.role") != "sweep"}
    assert set(children) == {"precision=fp32", "precision=bf16"}

    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(cli.dir), "--table-only"], cwd=cli.dir,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == (cli.dir / "energy_check.md").read_text().strip()
    lines = proc.stdout.splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {c[0]: dict(zip(header, c)) for c in ([x.strip() for x in line.strip("|").split("|")]
                                                for line in lines[2:] if line.startswith("| "))}
    assert set(rows) == set(children)  # one row per training run, none for "sweep ..."
    no_log = f"no nvidia-smi log (nvidia_smi.csv) in {cli.dir}"
    for name, run in children.items():
        row, m, tags = rows[name], run.data.metrics, run.data.tags
        if tags["status"] != "finished":  # e.g. bf16 on a CPU without native bf16
            assert row["status"] == f"{tags['status']}: {tags['reason']}"
            continue
        # Nothing read nvidia-smi here: null with why, never 0.
        assert [row[c] for c in ("kWh nvidia-smi (log)", "diff %", "smi mean W")] == ["null"] * 3
        assert f"kWh nvidia-smi, diff %, smi mean W: {no_log}" in row["null: why"]
        assert float(row["train_time_s"]) == round(m["train_time_s"], 2)
        # NVML's parts are absent on a CPU (energy too where there is no RAPL): null and the run's reason.
        for column, metric in (("occupancy_pct", "occupancy_pct"), ("sm_active_pct", "sm_active_pct"),
                               ("energy_kwh (run)", "energy_kwh"), ("mfu", "mfu")):
            if metric in m:
                assert row[column] != "null"
            else:
                assert row[column] == "null" and tags[f"{metric}_source"] in row["null: why"], (column, row)
        assert row["gemm/attn/elem/opt/other %"] == "null"  # profile=false
        assert "shares: null: profile=false" in row["null: why"]
        assert "nan" not in " ".join(row.values())
    if all(r.data.tags["status"] == "finished" for r in children.values()):
        fp32 = children["precision=fp32"].data
        assert "energy per sample, bf16 vs fp32: " + ("null (" if "energy_per_sample_j" not in fp32.metrics else "") \
            in proc.stdout
