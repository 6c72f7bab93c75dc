"""Bad input writes nothing and deletes nothing of the user's (issue 42): a refused single run in
a folder an earlier run used leaves every file byte-identical; a key the schema does not have is
refused with or without `+`; a sweep whose every configuration is refused, or that has none, is
one line before any store is made; a configuration given twice in a sweep runs once.

Real `python -m bertaccel.run` processes, real SQLite stores and files; the tiny model on the CPU."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from bertaccel.record.tracking import search_runs
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
TINY = ["model=tiny", "train.device=cpu", "dataset.train_subset=64", "dataset.test_subset=32", "train.batch_size=16",
        "train.max_steps_per_epoch=2"]


def _run(cwd: Path, args, store: str, cache: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "bertaccel.run", *args, f"tracking.uri={store}", f"cache_dir={cache}"]
    return warm_cli.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600, env=ENV)


def _said(err: str):
    """stderr's lines without what a run writes there anyway (progress bars, MLflow's INFO lines)."""
    return [line for line in err.splitlines() if line.strip() and not re.match(r"^epoch \d+/\d+:", line)
            and "INFO mlflow" not in line]


def _tree(folder: Path):
    """Every file and folder below folder: path -> sha256 of its bytes (None for a folder)."""
    return {str(p.relative_to(folder)): (None if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(folder.rglob("*"))}


@pytest.mark.slow
def test_a_refused_run_in_an_earlier_runs_folder_leaves_every_file_as_it_was(tmp_path):
    """hydra.run.dir=<a folder an earlier good run used, with the user's files>, then bad values:
    exit 2, one line, and every earlier file (its .hydra/, its run.log, the user's) byte-identical."""
    work = tmp_path / "work"
    work.mkdir()
    store = f"sqlite:///{work / 'mlflow.db'}"
    # The earlier good run, into work/ (its .hydra/ and run.log are Hydra's real files); it also
    # shows a free-form optimizer setting added with `+` still composes and reaches the run.
    good = _run(tmp_path, [*TINY, f"hydra.run.dir={work}", "+optimizer.impl.betas=[0.9,0.98]"], store, tmp_path / "cache")
    assert good.returncode == 0, good.stderr[-3000:]
    (run,) = search_runs(store, "bertaccel")
    assert run.data.params["optimizer.impl.betas"] == "[0.9, 0.98]"
    assert {"config.yaml", "hydra.yaml", "overrides.yaml"} <= {p.name for p in (work / ".hydra").iterdir()}
    assert (work / "run.log").exists()
    # The user's own files beside and inside what Hydra writes.
    (work / "notes.txt").write_text("my notes\n")
    (work / ".hydra" / "mine.yaml").write_text("a: 1\n")
    (work / "data").mkdir()
    (work / "data" / "train.csv").write_text("text,label\nhello,0\n")
    before = _tree(work)
    for where, bad, words in ((tmp_path, [f"hydra.run.dir={work}", "train.epochs=0"], "train.epochs=0"),
                              (work, ["hydra.run.dir=.", "optimizer.lr=-1"], "optimizer.lr=-1")):
        r = _run(where, [*TINY, *bad], store, tmp_path / "cache")
        assert r.returncode == 2, r.stderr[-3000:]
        lines = _said(r.stderr)
        assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], r.stderr[-3000:]
        assert _tree(work) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "work"]


@pytest.mark.slow
def test_a_key_the_schema_lacks_is_refused_with_or_without_plus_and_nothing_is_written(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    said = []
    for key in ("train.bacth_size=64", "+train.bacth_size=64"):
        r = _run(tmp_path, [*TINY, key], store, tmp_path / "cache")
        assert r.returncode == 2, r.stderr[-3000:]
        lines = _said(r.stderr)
        assert len(lines) == 1, r.stderr[-3000:]
        said.append(lines[0])
    assert said[0] == said[1]  # the same line, plain or with +
    assert "train.bacth_size" in said[0] and "train.batch_size" in said[0], said[0]  # and the key meant
    # default output dir, store, its lock: nothing
    assert list(tmp_path.iterdir()) == []


def _refused_sweep(tmp_path: Path, args, words):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    r = _run(tmp_path, ["-m", *TINY, *args], store, tmp_path / "cache")
    assert r.returncode == 2, (r.stdout + r.stderr)[-3000:]
    lines = _said(r.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr[-3000:]
    for w in words:
        assert w in lines[0], lines[0]
    assert "[sweep]" not in r.stdout  # no parent run, no summary
    assert list(tmp_path.iterdir()) == []  # no store, no lock, no multirun/ folder, no cache


@pytest.mark.slow
def test_a_sweep_bad_in_every_configuration_is_refused_before_its_store(tmp_path):
    _refused_sweep(tmp_path, ["train.epochs=0", "precision=fp32,bf16"], ["train.epochs=0"])


@pytest.mark.slow
def test_a_sweep_with_an_unknown_key_is_refused_before_its_store(tmp_path):
    _refused_sweep(tmp_path, ["+train.bacth_size=64", "train.seed=1,2"], ["train.bacth_size", "train.batch_size"])


@pytest.mark.slow
def test_an_empty_sweep_is_refused_before_its_store(tmp_path):
    _refused_sweep(tmp_path, ["train.seed=range(1,1)"], ["train.seed=range(1,1)"])


@pytest.mark.slow
def test_a_configuration_given_twice_runs_once_and_bad_ones_among_good_are_recorded(tmp_path):
    """train.seed=1,1 x optimizer.lr=-1,5e-5,0.00005: six jobs, two configurations, one of them bad.
    Each repeat is said once and dropped (a value given twice, and two spellings of one value);
    the bad configuration is recorded failed with its reason, the good one runs."""
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # (sweep.baseline=false: no run here has the default lr, so the sweep would add that baseline;
    # what is checked is the repeats and the bad configuration among good ones)
    r = _run(tmp_path, ["-m", *TINY, "train.seed=1,1", "optimizer.lr=-1,5e-5,0.00005", "sweep.baseline=false"],
             store, tmp_path / "cache")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("train.seed=1 given twice: run once") == 1, r.stdout
    assert r.stdout.count("optimizer.lr=5e-05 given twice: run once") == 1, r.stdout  # (as Hydra reads both)
    assert "[sweep] 2 runs;" in r.stdout and "[sweep] run 2 of 2" in r.stdout, r.stdout
    assert "2 runs: finished=1 skipped=0 failed=1" in r.stdout, r.stdout
    runs = [x for x in search_runs(store, "bertaccel") if x.data.tags.get("bertaccel.role") != "sweep"]
    assert sorted(x.data.tags["status"] for x in runs) == ["failed", "finished"]
    (failed,) = [x for x in runs if x.data.tags["status"] == "failed"]
    assert failed.data.tags["reason"].startswith("bad input: optimizer.lr=-1"), failed.data.tags["reason"]
    (parent,) = [x for x in search_runs(store, "bertaccel") if x.data.tags.get("bertaccel.role") == "sweep"]
    assert MlflowClient(store).get_run(parent.info.run_id).data.tags["status"] == "finished (1 of 2 runs finished)"


@pytest.mark.slow
def test_every_option_preset_and_study_composes_within_the_schema(tmp_path):
    """The unknown-key check refuses only the user's keys: every option of every group, every
    preset and every study (with its grid's first values) composes to keys of the schema, and
    optimizer.impl's own settings (free-form) pass."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from bertaccel.config import CONF_DIR, GROUPS, SWEEPS_DIR, ConfigError, register_configs
    from bertaccel.options.checks import check_known_keys

    register_configs()
    GlobalHydra.instance().clear()
    conf = tmp_path / "conf"  # conf/ and the studies in one folder (what the search path gives the CLI)
    shutil.copytree(CONF_DIR, conf)
    for f in SWEEPS_DIR.glob("*.yaml"):
        (conf / f.name).write_text(f.read_text())
    try:
        with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
            composed = [compose("config", overrides=[f"{g}={p.stem}"]) for g in GROUPS
                        for p in (conf / g).glob("*.yaml") if not p.stem.endswith("_schema")]
            composed += [compose(f.stem) for f in SWEEPS_DIR.glob("*.yaml")]
            composed.append(compose("config", overrides=["+optimizer.impl.betas=[0.9,0.98]", "+optimizer.impl.amsgrad=true"]))
            assert len(composed) > 40
            for cfg in composed:
                check_known_keys(cfg)
            with pytest.raises(ConfigError, match=r"did you mean optimizer\.weight_decay\?"):
                check_known_keys(compose("config", overrides=["+optimizer.weight_decya=0.1"]))
    finally:
        GlobalHydra.instance().clear()
