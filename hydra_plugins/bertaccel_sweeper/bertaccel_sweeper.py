"""bertaccel's Hydra sweeper: the basic sweeper, whose grid also holds the user's baseline and
`sweep.repeats` interleaved repeats (bertaccel/runs/sweep_jobs.py: what it adds, and why).

Hydra finds sweepers only in the `hydra_plugins` package, hence this module's place;
conf/config.yaml selects it (`override hydra/sweeper: bertaccel`). The sweep's plan
(runs/sweep_plan.py) expands the same list before this runs, so a refusal is said there first.
"""
# No `from __future__ import annotations`: Hydra executes plugin modules outside sys.modules,
# where dataclasses cannot resolve string annotations.
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore

from bertaccel.hydra_adapter import BasicSweeper


@dataclass
class BertaccelSweeperConf:
    _target_: str = "hydra_plugins.bertaccel_sweeper.bertaccel_sweeper.BertaccelSweeper"
    max_batch_size: Optional[int] = None
    params: Optional[Dict[str, str]] = None


ConfigStore.instance().store(group="hydra/sweeper", name="bertaccel", node=BertaccelSweeperConf,
                             provider="bertaccel")


class BertaccelSweeper(BasicSweeper):
    # An instance method where the basic sweeper's is static: the jobs depend on the sweep's config
    # (sweep.repeats, sweep.baseline), which BasicSweeper.sweep calls this without.
    def split_arguments(self, overrides: List[Any], max_batch_size: Optional[int]) -> List[List[List[str]]]:  # type: ignore[override]
        from bertaccel.runs.sweep_jobs import sweep_jobs

        jobs = sweep_jobs(self.config, overrides).overrides
        if max_batch_size is None:
            return [jobs]
        return list(BasicSweeper.split_overrides_to_chunks(jobs, max_batch_size))

    def validate_batch_is_legal(self, batch: Any) -> None:
        # Hydra composes every job of the batch here to catch a composition error early; the
        # sweep's plan (runs/sweep_plan.py) composed each one already, before the store opened, so
        # only a job it did not plan is composed again (a second pass doubled a big sweep's wait).
        from bertaccel.runs.progress import plan_of

        plan = plan_of(self.hydra_context) if self.hydra_context is not None else None
        super().validate_batch_is_legal([o for o in batch if plan is None or not plan.composed(o)])
