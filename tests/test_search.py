"""Multi-objective search (bertaccel/options/search.py, hydra/sweeper=optuna_pareto): what a trial returns,
the search block's checks, and a real search on the CPU whose trials are runs of the sweep."""
from __future__ import annotations

import pytest
from conftest import TINY
from omegaconf import OmegaConf

from bertaccel.config import ConfigError
from bertaccel.options.checks import validate
from bertaccel.options.search import Objectives, TrialFailed, trial_result
from bertaccel.record.run_record import Outcome
from bertaccel.record.tracking import runs_by_status, search_runs

SEARCH = OmegaConf.create({"objectives": ["train_time_s", "test_accuracy"], "directions": ["minimize", "maximize"]})


def test_a_finished_run_returns_its_objectives_in_order():
    o = Outcome("finished", "a", run_id="r", metrics={"test_accuracy": 0.8, "train_time_s": 3.0, "cost_usd": 1.0})
    values = trial_result(o, SEARCH)
    assert values == (3.0, 0.8) and isinstance(values, Objectives) and values.outcome is o


@pytest.mark.parametrize("outcome,message", [
    (Outcome("skipped", "a", "fp16 needs a GPU"), "run a skipped: fp16 needs a GPU"),
    (Outcome("failed", "a", "RuntimeError: boom"), "run a failed: RuntimeError: boom"),
    (Outcome("finished", "a", metrics={"train_time_s": 3.0}), "run a has no test_accuracy"),
])
def test_no_objective_value_is_a_failed_trial_never_a_number(outcome, message):
    with pytest.raises(TrialFailed, match=message) as e:
        trial_result(outcome, SEARCH)
    assert e.value.outcome is outcome


@pytest.mark.parametrize("overrides,message", [
    (["search.directions=[minimize]"], "search.objectives has 4 metric\\(s\\) but search.directions 1"),
    (["search.objectives=[a,b]", "search.directions=[minimize,up]"], "'up' is not one of minimize, maximize"),
    (["search.objectives=[]", "search.directions=[]"], "search.objectives is empty"),
])
def test_bad_search_settings_are_one_line(compose_cfg, overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose_cfg(overrides))


@pytest.mark.slow
def test_search_on_the_cpu_trials_are_runs_of_the_sweep_and_a_missing_objective_fails_the_trial(cli):
    """mfu is null on a CPU (the cpu profile has no peak FLOP/s): every trial fails as a trial, while
    its run is recorded finished under the sweep's parent; the search goes on to n_trials."""
    r = cli(["-m", *TINY, "train.max_steps_per_epoch=2", "hydra/sweeper=optuna_pareto", "hydra.sweeper.n_trials=2",
             "search.objectives=[train_time_s,mfu]", "search.directions=[minimize,maximize]",
             "freezing=none,layerwise"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "[sweep] 2 runs" in r.stdout and r.stdout.count("[sweep] run ") == 2
    out = r.stdout + r.stderr  # (Hydra logs the failed trials to stdout)
    assert out.count("Failed experiment: run freezing=") == 2 and "has no mfu" in out
    children = runs_by_status(cli.store, "bertaccel")["finished"]
    parent = [x for x in search_runs(cli.store, "bertaccel") if x.data.tags.get("bertaccel.role") == "sweep"]
    assert len(parent) == 1 and 1 <= len(children) <= 2  # (a sample drawn twice is not trained twice)
    assert all(c.data.tags["mlflow.parentRunId"] == parent[0].info.run_id for c in children)
    assert all(c.data.tags["mfu_source"].startswith("null: ") for c in children)
    assert parent[0].data.tags["search.sampler"] == "MOTPESampler" and parent[0].data.tags["search.sampler_seed"] == "0"
    assert parent[0].data.tags["search.objectives"] == "train_time_s,mfu"

    # Another sampler seed is another sweep (its own parent and front), not the first one reopened.
    again = cli(["-m", *TINY, "train.max_steps_per_epoch=2", "hydra/sweeper=optuna_pareto", "hydra.sweeper.n_trials=1",
                 "hydra.sweeper.sampler.seed=1", "search.objectives=[train_time_s,mfu]",
                 "search.directions=[minimize,maximize]", "freezing=none,layerwise"])
    assert again.returncode == 0, again.stderr[-3000:]
    parents = [x for x in search_runs(cli.store, "bertaccel") if x.data.tags.get("bertaccel.role") == "sweep"]
    assert sorted(x.data.tags["search.sampler_seed"] for x in parents) == ["0", "1"]
    assert len({x.data.tags["sweep_id"] for x in parents}) == 2
