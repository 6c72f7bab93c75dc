"""Issue 59, items 5 (the config half) and 8 (the user's own studies): every problem of a config
named at once, typos and values together, by run, run -m and plan; a study kept in a folder of
one's own (`--config-dir mine --config-name X`) works with every command, and a broken one or a
missing folder is one line, exit 2, nothing written.

Real CLIs in a temp directory (the tiny model on the CPU); the checks themselves in-process."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bertaccel.config import ConfigError
from bertaccel.options.checks import validate
from bertaccel.options.precision import check_precision
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
TYPO = "train.batchsize=3"  # (Hydra refuses it while it composes: not in struct)
BAD_VALUES = ["train.epochs=0", "optimizer.lr=-1", "train.batch_size=0"]
SAID = ["train.batchsize is not a setting of bertaccel; did you mean train.batch_size?",
        "train.epochs=0 must be > 0", "optimizer.lr=-1.0 must be > 0", "train.batch_size=0 must be an integer >= 1 or auto"]
# A study of the user's own, as bertaccel/sweeps/quick.yaml is one of bertaccel's.
STUDY = """defaults:
  - config
  - override /model: tiny
  - _self_

train:
  device: cpu
  epochs: 1
  batch_size: 16
dataset:
  train_subset: 32
  test_subset: 16
sweep:
  baseline: false

hydra:
  sweeper:
    params:
      train.seed: 1,2
"""
BROKEN = "defaults:\n  - config\n  - _self_\ntrain:\n  epochs: [1\n  device: cpu\n"  # (the list never closes)
BROKEN_OPTION = "name: mine\nsource: random_init\n  hidden_size: 8\n"  # (an indented key under a plain value)


def _cli(module: str, args, cwd: Path) -> subprocess.CompletedProcess:
    store = f"sqlite:///{cwd / 'mlflow.db'}"
    return warm_cli.run([sys.executable, "-m", module, *args, f"tracking.uri={store}", f"cache_dir={cwd / 'cache'}"],
                        cwd=cwd, env=ENV, capture_output=True, text=True, timeout=600)


def _lines(proc: subprocess.CompletedProcess):
    return [line for line in proc.stderr.splitlines() if line.strip()]


def _folder_of_studies(tmp_path: Path) -> Path:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "tiny_seeds.yaml").write_text(STUDY)
    (mine / "broken.yaml").write_text(BROKEN)
    (mine / "model").mkdir()
    (mine / "model" / "broken_model.yaml").write_text(BROKEN_OPTION)  # an option of the model group
    return mine


# --- every problem at once (item 5) ------------------------------------------------------------

def test_a_typo_key_and_bad_values_and_a_sections_own_check_are_said_together(compose_cfg):
    """A `+key` the schema lacks, two numbers out of range and train.batch_size=0 (the train
    section's own check, once asked only when every number was in range): four lines, one refusal."""
    with pytest.raises(ConfigError) as info:
        validate(compose_cfg(["+train.batchsize=3", *BAD_VALUES]))
    said = str(info.value).splitlines()
    assert len(said) == 4, said
    for expected in SAID:
        assert any(expected in line for line in said), (expected, said)


def test_a_rule_waits_for_its_sections_but_the_others_are_said(compose_cfg):
    """num_gpus=0 is out of range: the rule freezing x num_gpus is not asked on it, but the train
    and model sections' problems are said with it, and a check that divides by a head count refused
    as 0 leaves it to its range line instead of failing."""
    with pytest.raises(ConfigError) as info:
        validate(compose_cfg(["model=tiny", "model.num_attention_heads=0", "num_gpus=0", "freezing=layerwise",
                              "train.batch_size=0"]))
    assert str(info.value).splitlines() == ["num_gpus=0 must be > 0", "model.num_attention_heads=0 must be > 0",
                                            "train.batch_size=0 must be an integer >= 1 or auto"]


def test_a_precision_says_each_of_its_problems():
    """precision's check once stopped at its first problem (an if/elif chain)."""
    from omegaconf import OmegaConf

    from bertaccel.config import PrecisionConfig

    p = OmegaConf.structured(PrecisionConfig(name="mine", autocast_dtype="bfloat16", loss_scaling=True, fp8_recipe="x"))
    said = check_precision(p)
    assert len(said) == 2 and "loss_scaling=true needs autocast_dtype float16" in said[0]
    assert "fp8_recipe='x' is not one of" in said[1]
    # a dtype that is no dtype is said once, not again as each setting's mismatch
    assert len(check_precision(OmegaConf.structured(PrecisionConfig(autocast_dtype="f8", loss_scaling=True)))) == 1


@pytest.mark.slow
@pytest.mark.parametrize("module,args", [("bertaccel.run", []), ("bertaccel.run", ["-m"]), ("bertaccel.plan", [])],
                         ids=["run", "run -m", "plan"])
def test_a_typo_and_three_bad_values_are_four_lines_of_one_refusal(tmp_path, module, args):
    """Hydra refuses train.batchsize while it composes; the three bad values beside it are said too."""
    proc = _cli(module, [*args, TYPO, *BAD_VALUES], tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    said = _lines(proc)
    assert len(said) == 4 and all(line.startswith("error: ") for line in said), said
    for expected in SAID:
        assert any(expected in line for line in said), (expected, said)
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "a refused command line writes nothing"


# --- the user's own studies (item 8) -------------------------------------------------------------

@pytest.mark.slow
def test_a_study_of_ones_own_works_with_run_m_plan_and_report(tmp_path):
    """plan once answered "no such study or config" for a --config-dir study that run -m ran."""
    _folder_of_studies(tmp_path)
    study = ["--config-dir", "mine", "--config-name", "tiny_seeds"]
    planned = _cli("bertaccel.plan", study, tmp_path)
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert "2 configurations of --config-name tiny_seeds" in planned.stdout
    sweep = planned.stdout.split("each run of sweep ")[1].split(" ")[0]
    ran = _cli("bertaccel.run", ["-m", *study], tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    from bertaccel.record.tracking import search_runs

    runs = search_runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "bertaccel")
    children = [r for r in runs if r.data.tags.get("bertaccel.role") != "sweep"]
    assert len(children) == 2 and {r.data.tags.get("sweep_id") for r in children} == {sweep}
    assert all(r.info.status == "FINISHED" for r in children)
    report = warm_cli.run([sys.executable, "-m", "bertaccel.report", "--uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
                           "--sweep", sweep, "--out", "rep"], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                          timeout=600)
    assert report.returncode == 0, report.stderr[-3000:]
    assert (tmp_path / "rep" / "report.md").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("module,args,where", [
    ("bertaccel.run", ["--config-name", "broken"], ("broken.yaml", 6, 9)),  # Hydra's own composition
    ("bertaccel.run", ["-m", "model=tiny,broken_model"], ("model/broken_model.yaml", 3, 14)),  # a job's: the sweep's plan
    ("bertaccel.plan", ["--config-name", "broken"], ("broken.yaml", 6, 9)),
], ids=["run", "run -m", "plan"])
def test_a_study_that_is_not_yaml_is_one_line_naming_the_file_and_line(tmp_path, module, args, where):
    """Was a yaml.parser traceback (run, run -m), or "no such study or config" (plan)."""
    mine = _folder_of_studies(tmp_path)
    proc = _cli(module, ["--config-dir", "mine", *args], tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    said = _lines(proc)
    name, line, column = where
    assert len(said) == 1 and said[0].startswith(f"error: {mine / name}, line {line}, column {column}: not valid YAML: "), said
    assert said[0].endswith("; fix the file there and run the same command again")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"], "nothing written: no outputs/, multirun/, store"


@pytest.mark.slow
@pytest.mark.parametrize("module,args", [("bertaccel.run", ["-m"]), ("bertaccel.plan", [])], ids=["run -m", "plan"])
def test_a_folder_of_studies_that_is_not_there_is_one_line(tmp_path, module, args):
    """Was Hydra's SearchPathException traceback (run and run -m: one code path, before either)."""
    proc = _cli(module, [*args, "--config-dir", "nothere", "--config-name", "quick"], tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    said = _lines(proc)
    assert len(said) == 1 and said[0].startswith("error: --config-dir ") and "nothere: no such folder" in said[0], said
    assert sorted(p.name for p in tmp_path.iterdir()) == []
