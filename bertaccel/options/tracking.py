"""The `tracking` block's checks: an MLflow tracking URI is given, and its store can be used
(bertaccel/store.py)."""
from __future__ import annotations

from typing import Any, Optional


def check(cfg: Any) -> Optional[str]:
    """Refuses an empty uri and an empty experiment name. Any other name is kept as typed in
    MLflow; one that looks like a path (`../x`, `/Users/me/exp`) gets a safe artifacts folder of
    its own inside the store's mlartifacts/ (runs/tracking.py artifact_folder)."""
    if not cfg.tracking.uri:
        return "tracking.uri is empty: give an MLflow tracking URI, e.g. sqlite:///mlflow.db"
    if not str(cfg.tracking.experiment).strip():
        return "tracking.experiment is empty: give an MLflow experiment name, e.g. tracking.experiment=bertaccel"
    return None


def check_store(cfg: Any) -> Optional[str]:
    """Refuses a store that cannot be used (bertaccel/store.py store_refusal). validate() asks it last, as it may wait on the network (a
    few seconds at most): a tracking server that cannot be reached is bad input too, said before
    any work instead of after minutes of MLflow's retries."""
    from bertaccel.store import store_refusal  # (psutil, hydra: only when it is asked)

    return store_refusal(cfg.tracking.uri)
