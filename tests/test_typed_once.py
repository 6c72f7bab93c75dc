"""Issue 61, typed once: the composed config is converted to the typed RunConfig once per run and
once per configuration of a sweep (checks.validate, where it becomes typed); the later checks a
sweep leaves to each run are asked of that typed config alone; the DictConfig the record writes is
derived from the typed one and says what Hydra composed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from omegaconf import OmegaConf

from bertaccel.options.checks import validate
from bertaccel.record.run_record import logged_config
from bertaccel.runs.checked import LEFT_TO_THE_RUNS
from conftest import TINY, conversion_counter

# The real CLI in a process of its own, its conversions counted (conftest.conversion_counter), the
# counts written at exit to $COUNTS_FILE.
DRIVER = conversion_counter('os.environ["COUNTS_FILE"]') + textwrap.dedent("""
    import runpy, sys
    sys.argv = ["bertaccel.run", *sys.argv[1:]]
    runpy.run_module("bertaccel.run", run_name="__main__", alter_sys=True)
""")


def _counted_run(tmp_path, args):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    counts = tmp_path / "counts.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "COUNTS_FILE": str(counts)}
    r = subprocess.run([sys.executable, str(driver), *args, f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
                        f"cache_dir={tmp_path / 'cache'}"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return json.loads(counts.read_text()), r


@pytest.mark.slow
def test_a_single_run_converts_its_config_once(tmp_path):
    counts, r = _counted_run(tmp_path, [*TINY, "launcher.name=inline", "train.epochs=1", "train.max_steps_per_epoch=2"])
    assert "test_accuracy=" in r.stdout
    assert counts == {"validate": 1, "typed": 1}, counts


@pytest.mark.slow
def test_each_configuration_of_a_sweep_is_converted_once(tmp_path):
    counts, r = _counted_run(tmp_path, ["-m", *TINY, "launcher.name=inline", "train.epochs=1",
                                        "train.max_steps_per_epoch=2", "train.seed=1,2", "sweep.baseline=false"])
    import mlflow

    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("bertaccel").experiment_id], "tags.status = 'finished'")
    assert len(runs) == 2, [x.data.tags.get("status") for x in runs]
    assert counts == {"validate": 2, "typed": 2}, counts


@pytest.mark.parametrize("overrides", [[], ["optimizer=adan", "precision=bf16"], ["accumulation=adaptive"],
                                       ["optimizer=lamb", "freezing=layerwise", "compile=default", "hardware=h100"],
                                       [*TINY, "train.batch_size=auto", "optimizer.impl.foreach=false"]])
def test_the_recorded_config_is_derived_from_the_typed_one_and_says_what_hydra_composed(compose_cfg, overrides):
    cfg = compose_cfg(overrides)
    logged = logged_config(validate(cfg, leave=LEFT_TO_THE_RUNS))
    assert OmegaConf.to_yaml(logged) == OmegaConf.to_yaml(cfg)  # (config.yaml, key order included)
    assert OmegaConf.to_container(logged, resolve=True) == OmegaConf.to_container(cfg, resolve=True)
