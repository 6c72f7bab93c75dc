"""A study that needs the Hugging Face hub, on a machine without it: every run is recorded
skipped at once, with the reason and the offline alternative (the real CLI, HF_HUB_OFFLINE=1)."""
from __future__ import annotations

import pytest

from bertaccel.record.tracking import search_runs

# Every test here starts a real process (the CLI, a script, a server) or trains: slow (docs/contributing.md).
pytestmark = pytest.mark.slow


def test_offline_sweep_needing_the_hub_skips_each_run_at_once_with_the_alternative(cli, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty HF cache: nothing of the hub is here
    # 2 runs of a hub model; the timeout is the failure mode of a sweep that waits on the hub per run
    p = cli(["-m", "model=bert_base_uncased", "train.seed=1,2", "train.device=cpu",
             "dataset.train_subset=32", "dataset.test_subset=16"], timeout=90)
    runs = [r for r in search_runs(cli.store, "bertaccel") if r.data.tags.get("bertaccel.role") != "sweep"]
    assert len(runs) == 2, p.stdout[-2000:] + p.stderr[-2000:]
    for r in runs:
        assert r.data.tags["status"] == "skipped"
        reason = r.data.tags["reason"]
        assert "bert-base-uncased" in reason and "HF_HUB_OFFLINE=1" in reason
        assert "model=minilm_l6" in reason  # the offline alternative, named
