"""Every run logs its own prediction when it starts: the plan's numbers from the store as it
stood before the run (finished runs only; the run itself is still `running`), or, when
`python -m bertaccel.plan` planned this very sweep beforehand (its file under
cache_dir/plan/<sweep id>.json, written by plan/saved.py), the plan's prediction of this
configuration, waits included (warm-up, start-up, evaluation, run wall), as it was made before
the sweep.

Metrics predicted_step_time_ms, predicted_train_time_s, predicted_cost_usd, predicted_energy_kwh
(each with a `_source` tag) and the tag prediction_basis. Nothing here may fail or slow a run:
the token lengths are the run's own (already tokenized), the model is the meta-device copy of
its config, and any problem becomes the tag `prediction_basis = not predicted: <why>` with no
metric logged.
"""
from __future__ import annotations

import copy
import logging
import time
from typing import TYPE_CHECKING, Any, Mapping

import torch

from ..config import RunConfig, first_line
from .pricing import PREDICTED, PREDICTED_WAIT

if TYPE_CHECKING:  # (transformers: imported where a model is built)
    from transformers import PretrainedConfig

log = logging.getLogger("bertaccel")


def log_prediction(cfg: RunConfig, tracker: Any, lengths: torch.Tensor, num_labels: int, model_config: PretrainedConfig,
                   profile: Mapping[str, Any], run_name: str) -> None:
    """tracker: the run's RunTracker (rank 0); other ranks' trackers have no store: nothing to do."""
    if getattr(tracker, "client", None) is None:
        return
    t0 = time.perf_counter()
    try:
        why = _predict_and_log(cfg, tracker, lengths, num_labels, model_config, profile, run_name)
    except Exception as e:  # noqa: BLE001 - a prediction never fails a run: it says why it is missing
        why = f"{type(e).__name__}: {first_line(e, default='')}"
    if why:
        tracker.set_tags({"prediction_basis": f"not predicted: {why}"[:5000]})
    log.info(f"prediction: {'not predicted: ' + why if why else 'logged'} ({time.perf_counter() - t0:.2f} s)")


def _predict_and_log(cfg: RunConfig, tracker: Any, lengths: torch.Tensor, num_labels: int, model_config: PretrainedConfig,
                     profile: Mapping[str, Any], run_name: str) -> str:
    """Logs the prediction; returns why there is none ('' when there is)."""
    from bertaccel.options.hardware import load_profiles
    from bertaccel.record.run_record import run_settings
    from bertaccel.store import store_lock

    from .predict import predict_one, store_references
    from .work import DataShape, work_of

    if profile.get("what_if"):
        return "a what-if run: its time is the device's, its profile another's"
    with store_lock(tracker.uri):
        run = tracker.client.get_run(tracker.run_id)
    planned = _planned(cfg, run.data.tags.get("config_hash", ""))
    if planned is not None:
        tracker.log_metrics({f"predicted_{k}": planned[k] for k in PREDICTED + PREDICTED_WAIT
                             if planned.get(k) is not None})
        source = f"bertaccel.plan before the sweep ({planned['made_at']}): "
        tracker.set_tags({"prediction_basis": (source + planned["basis"])[:5000],
                          "prediction_power_basis": planned["power_basis"][:5000],
                          **{f"predicted_{k}_source": (source + planned["sources"].get(k, planned["basis"]))[:5000]
                             if planned.get(k) is not None else planned["why"].get(k, "null")[:5000]
                             for k in PREDICTED + PREDICTED_WAIT}})
        return ""
    params = run_settings(run)  # as logged, the built model's shape included: the same key as a later read
    work = work_of(cfg, DataShape(lengths, num_labels, 0), copy.deepcopy(model_config))
    refs, note = store_references(tracker.uri, tracker.experiment)
    refs = [r for r in refs if r.run_id != tracker.run_id]
    profiles = {p["name"]: p for p in load_profiles()}
    pred = predict_one(run_name, run.data.tags.get("config_hash", ""), work, params, profile, profiles, refs,
                       cfg.precision.mfu_peak, int(cfg.num_gpus))
    if pred.train_time_s is None:
        return pred.why.get("train_time_s", "no rate").removeprefix("null: ")
    source = f"bertaccel.plan before the run: {pred.basis}"
    tracker.log_metrics({f"predicted_{k}": pred.get(k) for k in PREDICTED})
    tracker.set_tags({"prediction_basis": pred.basis[:5000], "prediction_power_basis": pred.power_basis[:5000],
                      **{f"predicted_{k}_source": (source if pred.get(k) is not None else pred.why.get(k, "null"))[:5000]
                         for k in PREDICTED}})
    return ""


def _planned(cfg: RunConfig, config_hash: str) -> Any:
    """The plan's saved prediction of this configuration for this sweep, or None."""
    from bertaccel.context import current as run_context

    from .saved import read_plan

    sweep = run_context().sweep
    if sweep is None or not config_hash:
        return None
    return read_plan(cfg.cache_dir, sweep.sweep_id).get(config_hash)
