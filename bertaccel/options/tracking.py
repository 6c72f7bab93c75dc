"""The `tracking` block's checks: an MLflow tracking URI is given, and its store can be used
(bertaccel/store/check.py)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Optional

from bertaccel.config import TrackingConfig
from bertaccel.option import Option

if TYPE_CHECKING:
    from bertaccel.config import RunConfig


def check_tracking(tracking: TrackingConfig) -> List[str]:
    found = []
    if not tracking.uri:
        found.append("tracking.uri is empty: give an MLflow tracking URI, e.g. sqlite:///mlflow.db")
    if not str(tracking.experiment).strip():
        found.append("tracking.experiment is empty: give an MLflow experiment name, e.g. tracking.experiment=bertaccel")
    return found


def check_store(cfg: "RunConfig") -> Optional[str]:
    """Refuses a store that cannot be used (bertaccel/store/check.py store_refusal). A later check (asked once the tracking block is sound), as it may wait on the
    network (a few seconds at most): a tracking server that cannot be reached is bad input too, said before
    any work instead of after minutes of MLflow's retries."""
    from bertaccel.store import store_refusal  # (psutil, hydra: only when it is asked)

    return store_refusal(cfg.tracking.uri)


class TrackingOption(Option):
    section, schema = "tracking", TrackingConfig
    later = (check_store,)  # (left to each run's turn by a sweep: runs/sweep_plan.py)

    def check(self, cfg: "RunConfig") -> List[str]:
        """Refuses an empty uri and an empty experiment name. Any other name is kept as typed in
        MLflow; one that looks like a path (`../x`, `/Users/me/exp`) gets a safe artifacts folder of
        its own inside the store's mlartifacts/ (record/tracking.py artifact_folder)."""
        return check_tracking(cfg.tracking)


OPTION = TrackingOption()
