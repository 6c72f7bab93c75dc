"""benchmarks/attention_backends.py's CPU-runnable parts: the batches it times, the lengths it
reads, the table it prints, and its one-line refusal without a GPU (the timings need one)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import attention_backends as ab  # noqa: E402


def test_batches_are_padded_like_the_loops_collator():
    lengths = [5, 17, 120, 256, 3]
    for batch in ab.batches("IMDb<=256", 6, lengths, 4):
        mask = batch["attention_mask"]
        seq = mask.shape[1]
        assert seq % 8 == 0 and seq - 8 < int(mask.sum(1).max()) <= seq  # the longest row, rounded up to 8
        assert set(mask.sum(1).tolist()) <= set(lengths)
        assert not batch["input_ids"][mask == 0].any() and batch["labels"].shape == (6,)
    full = ab.batches("S=128", 3, lengths, 1)[0]
    assert full["input_ids"].shape == (3, 128) and bool(full["attention_mask"].all())


def test_lengths_are_real_token_counts_capped(tmp_path):
    """The bundled AG News sample's descriptions stand in for IMDb reviews, in IMDb's text,label CSV."""
    import csv
    import gzip

    with gzip.open(ROOT / "bertaccel" / "samples" / "ag_news" / "test.csv.gz", "rt", newline="") as f:
        rows = [(r["description"], r["label"]) for _, r in zip(range(50), csv.DictReader(f))]
    path = tmp_path / "imdb.csv.gz"
    with gzip.open(path, "wt", newline="") as f:
        csv.writer(f).writerows([("text", "label"), *rows])
    lengths = ab.imdb_lengths(str(path), ab.compose([]).model, 50, 32)
    assert len(lengths) == 50 and max(lengths) == 32 and min(lengths) > 2  # [CLS] text [SEP], cut at 32


def test_table_ratios_are_against_the_faster_sdpa():
    cells = {"sdpa": 100.0, "sdpa [B,1,1,S]": 50.0, "xformers": 40.0, "triton": 100.0}
    rows = [{"workload": "S=128", "B": 32, "mode": "eager", "attention": a, "real_token_fraction": 1.0,
             "ms_step": ms, "samples_s": 32 / ms * 1000} for a, ms in cells.items()]
    line = ab.table1(rows).splitlines()[-1]
    assert "| 640 | 800 (1.25x) | 320 (0.50x) |" in line, line  # best sdpa: 50 ms = 640 samples/s


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_without_a_gpu_it_says_so_in_one_line():
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "attention_backends.py")], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 1 and p.stderr.strip().startswith("error: this benchmark needs a CUDA GPU"), p.stderr
