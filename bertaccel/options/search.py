"""Multi-objective search (hydra-optuna-sweeper) instead of the full grid: the one home of the
`search` config block, its check, and what a job returns to the sweeper.

    python -m bertaccel.run -m --config-name thesis_grid hydra/sweeper=optuna_pareto

The sweeper (conf/hydra/sweeper/optuna_pareto.yaml: multi-objective TPE, n_trials) picks each trial's
configuration from the study's own axes (its hydra.sweeper.params, so the search covers the same
groups as the grid) and our launcher runs it: every trial is an ordinary run of the sweep's
MLflow parent, and the report reads them as any sweep. The job returns `search.objectives`, MLflow
metric names, read from the finished run; the preset's directions are `search.directions`
(interpolated, so objectives and directions have this one home).

A trial whose run did not finish (skipped, failed, bad input) or lacks an objective (energy_kwh
on a CPU without RAPL) raises TrialFailed: Optuna records the trial as failed, never a made-up
value. On such a machine leave that objective out, e.g.
search.objectives=[train_time_s,test_accuracy] search.directions=[minimize,maximize].
A trial Optuna samples again (a small categorical space) is not trained twice: with sweep.resume
(the default) the earlier run's metrics are returned.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Tuple

from bertaccel.config import SearchConfig
from bertaccel.option import Option

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from bertaccel.config import RunConfig

DIRECTIONS = ("minimize", "maximize")


class TrialFailed(RuntimeError):
    """The run gave no objective values; carries its Outcome (the sweep's summary lists it)."""

    def __init__(self, message: str, outcome: Any) -> None:
        super().__init__(message)
        self.outcome = outcome


class Objectives(tuple[float, ...]):
    """The objective values, as the sweeper reads them (a tuple of floats), with the run's
    Outcome attached for the sweep's progress lines and summary (runs/progress.py)."""
    outcome: Any = None


def check_search(search: SearchConfig) -> List[str]:
    """Why the search block cannot work, one line each."""
    objectives, directions = list(search.objectives), list(search.directions)
    found = []
    if not objectives:
        found.append("search.objectives is empty: name at least one MLflow metric, e.g. [train_time_s,test_accuracy]")
    elif len(objectives) != len(directions):
        found.append(f"search.objectives has {len(objectives)} metric(s) but search.directions {len(directions)}: "
                     "give one direction (minimize or maximize) per objective, in the same order")
    found += [f"search.directions: {d!r} is not one of {', '.join(DIRECTIONS)}" for d in directions if d not in DIRECTIONS]
    if len(set(objectives)) != len(objectives):
        found.append(f"search.objectives={objectives}: an objective is named twice")
    return found


class SearchOption(Option):
    section, schema = "search", SearchConfig

    def check(self, cfg: "RunConfig") -> List[str]:
        """Refuses no objectives, objectives and directions of different lengths, a direction other
        than minimize or maximize, and an objective named twice."""
        return check_search(cfg.search)


OPTION = SearchOption()


def uses_search(hydra_cfg: Any) -> bool:  # (HydraConf as typed by Hydra, a DictConfig when run)
    """Whether this job's sweeper is Optuna's, which needs the objective values back."""
    target = str((hydra_cfg.get("sweeper") or {}).get("_target_", ""))
    return "optuna" in target.lower()


def parent_tags(hydra_cfg: DictConfig, search: SearchConfig) -> Dict[str, str]:
    """Tags of a search sweep's parent run: what searched, and for what. The report and the
    notebook find a search by them and mark the front it found (report/search_front.py)."""
    sampler = hydra_cfg.sweeper.get("sampler") or {}
    return {"search.sampler": str(sampler.get("_target_", "?")).rsplit(".", 1)[-1],
            "search.sampler_seed": str(sampler.get("seed")),
            "search.n_trials": str(hydra_cfg.sweeper.get("n_trials")),
            "search.objectives": ",".join(search.objectives),
            "search.directions": ",".join(search.directions)}


def trial_result(outcome: Any, search: SearchConfig) -> Tuple[float, ...]:
    """The objective values of a finished run, in search.objectives' order; else TrialFailed."""
    if outcome.status not in ("finished", "already_finished"):
        raise TrialFailed(f"run {outcome.run_name} {outcome.status}: {outcome.reason}", outcome)
    missing = [m for m in search.objectives if outcome.metrics.get(m) is None]
    if missing:
        raise TrialFailed(f"run {outcome.run_name} has no {', '.join(missing)} (see the run's "
                          f"{missing[0]}_source tag); leave it out of search.objectives on this machine", outcome)
    values = Objectives(float(outcome.metrics[m]) for m in search.objectives)
    values.outcome = outcome
    return values
