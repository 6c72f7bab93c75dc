"""benchmarks/vs_hf.py end to end on the CPU: plain-HF rungs, the HF Trainer epoch and a bertaccel
row through the real core, on real text (the bundled AG News sample) with the tiny BERT."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

# Every test here starts a real process (the CLI, a script, a server) or trains: slow (docs/contributing.md).
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "bertaccel" / "samples" / "ag_news" / "train.csv.gz"


def parse_table(text: str) -> Dict[str, Dict[str, str]]:
    """The last Markdown table printed (the full one), as row id -> column -> cell."""
    lines = text.splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("| row | what |"))
    columns = [c.strip() for c in lines[start].strip("|").split("|")]
    rows: Dict[str, Dict[str, str]] = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells: List[str] = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0]] = dict(zip(columns, cells))
    return rows


def is_number(cell: str) -> bool:
    try:
        float(cell)
        return True
    except ValueError:
        return False


def test_vs_hf_table_on_cpu(tmp_path):
    out = tmp_path / "vs_hf.md"
    bertaccel_row = ("model=tiny train.device=cpu dataset.train_subset=64 dataset.test_subset=32 train.batch_size=16 "
                     f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'} cache_dir={tmp_path / 'cache'}")
    cmd = [sys.executable, str(REPO / "benchmarks" / "vs_hf.py"), "--device", "cpu", "--tiny",
           "--steps", "3", "--warmup-steps", "1", "--batch-sizes", "8", "--rung-batches", "2", "--seq", "32",
           "--rungs", "a,b,b',d,e,f",
           "--imdb-train", str(SAMPLE), "--text-columns", "title,description", "--label-column", "label",
           "--trainer-subset", "64", "--trainer-max-length", "64",
           "--bertaccel", bertaccel_row, "--out", str(out)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = parse_table(proc.stdout)
    assert set(rows) == {"a/B8", "b/B8", "b'/B8", "d/B8", "e/B8", "f/B8", "trainer", "bertaccel 1"}, proc.stdout

    for rung in ("a/B8", "b/B8", "b'/B8", "e/B8"):  # e: encoder=fused, its kernels in Triton's interpreter here
        row = rows[rung]
        assert is_number(row["ms/step"]) and is_number(row["samples/s"]), row
        assert is_number(row["final loss"]) and is_number(row["warm-up s"]), row
        # No GPU: energy and MFU are null, each with its reason in the notes.
        assert row["kJ"] == "null" and "kJ null: no GPU" in row["notes"], row
        assert row["MFU"] == "null" and "MFU null:" in row["notes"], row

    for rung in ("d/B8", "f/B8"):
        assert rows[rung]["ms/step"] == "-"
        assert "skipped: CUDA graphs need a GPU" in rows[rung]["notes"]
    assert "tokens computed: exact" in rows["e/B8"]["notes"]  # the fused encoder ran on the real tokens
    # b' is b fed by a DataLoader with bertaccel's collator (its default pad multiple and worker
    # count, no pinning on a CPU) over b's rows (B x --rung-batches), cycled: its 4 steps take
    # two passes over 2 batches. Each batch is padded to its own longest row, rounded up to 8, at
    # most S=32 (the rows truncated to S).
    feed = rows["b'/B8"]["notes"]
    assert ("fed by DataLoader(PadCollator(pad to a multiple of 8), workers=0, pin_memory=False) "
            "over the 16 rows of b's batches, cycled") in feed, feed
    lengths = [int(x) for x in feed.split("padded lengths of the measured batches: ")[1].split(";")[0].split(", ")]
    assert lengths and all(n % 8 == 0 and n <= 32 for n in lengths), feed
    assert math.isfinite(float(rows["b'/B8"]["final loss"])), rows["b'/B8"]  # it trained on real rows

    trainer = rows["trainer"]
    assert is_number(trainer["s/epoch"]) and is_number(trainer["final loss"]), trainer
    assert "64 rows, 2 steps" in trainer["notes"], trainer

    ours = rows["bertaccel 1"]
    assert not ours["notes"].startswith(("failed", "skipped")), ours
    assert is_number(ours["s/epoch"]) and is_number(ours["accuracy"]), ours

    # --out holds the same table.
    assert parse_table(out.read_text()) == rows
