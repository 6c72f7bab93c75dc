"""The contributor recipe, proved: docs/architecture.md's worked examples (an attention kernel, an
optimizer) are read from the page itself (each file a code block after `<!-- recipe: PATH -->`),
written into a copy of the package, and run there as a contributor would: Hydra composition and
validation, the tests that once pinned the kernel lists, a tiny CPU run, and the plan over a grid
holding both. The files the recipe touched are counted from the copy (two per addition). And the
schema's split: each option's `schema` is its section's dataclass, in a module of config/ of
its own name, which the registry holds true."""
from __future__ import annotations

import csv
import hashlib
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict

import pytest
from conftest import TINY

from bertaccel.config import CompileConfig, RunConfig, section_schema
from bertaccel.option import Option
from bertaccel.options.registry import _refuse_wrong_schemas, options

ROOT = Path(__file__).resolve().parents[1]
# A recipe file: the marker, then a fenced block (indented as a list item's) holding the file.
RECIPE = re.compile(r"<!-- recipe: (\S+) -->\n( *)```\w*\n(.*?)\n\2```", re.S)
KERNEL, OPTIMIZER = "Worked example: an attention kernel", "Worked example: an optimizer"


def recipe(title: str) -> Dict[str, str]:
    """{path from the repository root: its text} of the files a worked example writes."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    section = page.split(f"### {title}\n", 1)[1].split("\n### ", 1)[0]
    return {path: textwrap.dedent(body) + "\n" for path, _, body in RECIPE.findall(section)}


def test_each_worked_example_is_two_files_a_yaml_and_a_module():
    kernel, optimizer = recipe(KERNEL), recipe(OPTIMIZER)
    assert sorted(kernel) == ["bertaccel/attention/kernels/toy.py", "bertaccel/conf/attention/toy.yaml"]
    assert sorted(optimizer) == ["bertaccel/conf/optimizer/toy_sgd.yaml", "bertaccel/optimizers/toy_sgd.py"]


def test_each_option_schema_is_its_sections_dataclass_in_a_module_of_its_own():
    checked = 0
    for option in options():  # (options() itself refuses a wrong schema: below)
        assert option.schema is section_schema(option.section), option.section
        if option.schema is not None:
            assert option.schema.__module__ == f"bertaccel.config.{option.section}", option.section
            checked += 1
    assert checked >= 12  # every group and block with an option but accumulation and cache_dir


def test_an_option_whose_schema_is_not_its_sections_is_refused_naming_both():
    class Wrong(Option):
        section, schema = "precision", CompileConfig

    class Setting(Option):
        section, schema = "num_gpus", RunConfig  # a plain setting has no schema

    with pytest.raises(TypeError) as refused:
        _refuse_wrong_schemas((Wrong(), Setting()))
    said = str(refused.value)
    assert "Wrong.schema is CompileConfig, but RunConfig types 'precision' as PrecisionConfig" in said
    assert "Setting.schema is RunConfig, but RunConfig types 'num_gpus' as None" in said


def _tree(root: Path) -> Dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


COMPOSE = textwrap.dedent("""
    import sys
    from hydra import compose, initialize_config_dir
    from bertaccel.config import CONF_DIR, ConfigError, register_configs
    from bertaccel.options.checks import validate

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        run = validate(compose(config_name="config", overrides=sys.argv[1:]))
        print("composed", CONF_DIR, run.attention.swap, run.optimizer.impl["_target_"])
        try:
            validate(compose(config_name="config", overrides=sys.argv[1:] + ["optimizer.impl.momentum=1.5"]))
        except ConfigError as e:
            print("refused", e)
""")

# A finished run of the planned configuration recorded on an H200 (as tests/test_roofline.py
# records one), so the plan's h100 rows move its time through the roofline.
ON_H200 = textwrap.dedent("""
    import sys
    from mlflow import MlflowClient
    from bertaccel.model import hf_config
    from bertaccel.plan.grid import expand
    from bertaccel.plan.predict import run_params
    from bertaccel.plan.work import data_shape, work_of

    planned = expand("config", sys.argv[2:]).configs[0]
    typed = planned.run  # the config the plan typed once, as the plan predicts from it
    data = data_shape(typed)
    config = hf_config(typed.model, data.num_labels, data.vocab_size)
    client = MlflowClient(tracking_uri=typed.tracking.uri)
    exp = client.create_experiment("bertaccel", artifact_location=sys.argv[1])
    run = client.create_run(exp, run_name="on h200", tags={"status": "finished", "hardware_profile": "h200"})
    for k, v in run_params(typed, planned.choices, config).items():
        client.log_param(run.info.run_id, k, v)
    client.log_metric(run.info.run_id, "model_flops", work_of(typed, data, config).model_flops)
    client.log_metric(run.info.run_id, "train_time_s", 20.0)
    client.set_terminated(run.info.run_id)
""")


@pytest.mark.slow
def test_the_documented_recipe_composes_validates_plans_and_trains_in_a_copy(tmp_path):
    copy, work = tmp_path / "copy", tmp_path / "work"
    ignore = shutil.ignore_patterns("__pycache__")
    for folder in ("bertaccel", "hydra_plugins", "tests"):
        shutil.copytree(ROOT / folder, copy / folder, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", copy)
    work.mkdir()
    before = _tree(copy)
    kernel, optimizer = recipe(KERNEL), recipe(OPTIMIZER)
    for path, text in {**kernel, **optimizer}.items():
        (copy / path).write_text(text)
    after = _tree(copy)
    touched = sorted(p for p in after if before.get(p) != after[p])
    # The files the two additions touched: the docs' two each, nothing else.
    assert touched == sorted({**kernel, **optimizer}) and len(kernel) == 2 and len(optimizer) == 2

    env = {**os.environ, "PYTHONPATH": str(copy), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}

    def python(*args: str, cwd: Path = work) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)

    new = ["attention=toy", "optimizer=toy_sgd"]
    store = f"sqlite:///{work / 'mlflow.db'}"
    args = [*new, *TINY, f"tracking.uri={store}", f"cache_dir={work / 'cache'}"]

    # Hydra composes the new options, validate() accepts them, and the class's own check speaks.
    done = python("-c", COMPOSE, *args)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"composed {copy / 'bertaccel' / 'conf'} toy bertaccel.optimizers.toy_sgd.ToySGD" in done.stdout
    assert "refused optimizer=toy_sgd: momentum=1.5 must be in [0, 1)" in done.stdout

    # The tests that once listed the kernels pass with the new one there, unedited.
    done = python("-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-m", "not slow",
                  "tests/test_attention_kernels.py", "tests/test_attention_option.py", cwd=copy)
    assert done.returncode == 0, done.stdout[-3000:]

    # A tiny CPU run on both: finished, recorded under their names.
    done = python("-m", "bertaccel.run", *args)
    assert done.returncode == 0, done.stderr[-3000:]
    from mlflow import MlflowClient

    (run,) = MlflowClient(tracking_uri=store).search_runs(
        [MlflowClient(tracking_uri=store).get_experiment_by_name("bertaccel").experiment_id])
    assert run.data.tags["status"] == "finished" and "train_time_s" in run.data.metrics
    assert (run.data.params["attention"], run.data.params["optimizer"]) == ("toy", "toy_sgd")

    # The plan over a grid holding both, from a run on an H200: each row predicted, and the new
    # optimizer's h100 row moved through the roofline like any other's (plan/roofline.py counts
    # an optimizer it was not told about).
    planned = f"sqlite:///{work / 'plan.db'}"
    done = python("-c", ON_H200, (work / "art").as_uri(), *new, *TINY, f"tracking.uri={planned}",
                  f"cache_dir={work / 'cache'}")
    assert done.returncode == 0, done.stderr[-3000:]
    done = python("-m", "bertaccel.plan", "-m", "attention=toy,eager", "optimizer=toy_sgd,adamw", *TINY,
                  f"tracking.uri={planned}", f"cache_dir={work / 'cache'}", "--hardware", "h100,h200", "--out", "plan")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = list(csv.DictReader(open(work / "plan" / "plan.csv")))
    # 4 configurations, each on this machine's profile (cpu) and the two asked for
    assert len(rows) == 12 and {row["hardware"] for row in rows} == {"cpu", "h100", "h200"}
    assert all(row["time_s"] for row in rows if row["hardware"] == "h100")
    (toy,) = [row for row in rows if row["hardware"] == "h100"
              and "attention=toy" in row["name"] and "optimizer=toy_sgd" in row["name"]]
    assert "roofline from h200 runs" in toy["basis"] and "no roofline" not in toy["basis"], toy["basis"]
