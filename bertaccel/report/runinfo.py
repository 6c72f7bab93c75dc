"""What an MLflow run says beyond its scored metrics: its seed and configuration without the seed
(repeats), SM and tensor activity (--occupancy-metric), what it was measured on (the
comparability gate) and its per-epoch accuracy and training windows (--target-accuracy)."""
from __future__ import annotations

import hashlib
import json
import math
import sys
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

SEED_PARAM = "train.seed"
GROUP_TAG = "config_key_noseed"   # job.config_key_noseed: config_hash without train.seed
WINDOWS_TAG = "train_windows_unix"  # [[start, end], ...] per epoch, time.time() at the window's edges
ACCURACY_METRIC = "test_accuracy"   # logged once per epoch, MLflow step = epoch (0-based)
HISTORY_RUNS_AT_ONCE = 500          # runs per bulk history query
ACTIVITY_METRICS = ("sm_active_pct", "tensor_active_pct")


def params_group_key(params: Mapping[str, str], where_roots: Iterable[str]) -> str:
    """The configuration without its seed, from the logged params (runs logged before the
    config_key_noseed tag): every param but train.seed and where results go (where_roots)."""
    roots = set(where_roots)
    kept = {k: v for k, v in params.items() if k != SEED_PARAM and k.split(".")[0] not in roots and k not in roots}
    return "params:" + hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:12]


def group_keys(runs: Sequence[Any]) -> Tuple[List[str], str]:
    """(one key per run, how the keys were made). The tag when every run has it, computed by one
    identity version (tracking.IDENTITY_VERSION: the launcher's settings left out since 2); else
    every key from params, so that runs logged before the tag (or its version) and after it still
    group together. Runs that read other rows (their dataset digests, record/datasets.py) are
    never repeats of one configuration: where the runs' data differ, each key names its data."""
    from bertaccel.record.datasets import data_key
    from bertaccel.record.run_record import run_settings
    from bertaccel.record.tracking import HASH_EXCLUDED_KEYS, IDENTITY_VERSION_TAG

    tags = [r.data.tags.get(GROUP_TAG) for r in runs]
    versions = {r.data.tags.get(IDENTITY_VERSION_TAG, "1") for r in runs}
    if all(tags) and len(versions) == 1:
        keys, how = list(tags), f"tag {GROUP_TAG} (config_hash without {SEED_PARAM})"
    else:
        missing = sum(1 for t in tags if not t)
        keys = [params_group_key(run_settings(r), HASH_EXCLUDED_KEYS) for r in runs]
        how = (f"params without {SEED_PARAM} and what is not a run's identity ("
               + (f"{missing} of {len(runs)} runs have no {GROUP_TAG} tag)" if missing else
                  f"the runs' {GROUP_TAG} tags are of {len(versions)} identity versions)"))
    data = [data_key(r) for r in runs]
    if len(set(data)) > 1:
        keys = [f"{k} data:{d or 'unrecorded'}" for k, d in zip(keys, data)]
        how += "; runs that read other rows apart (their dataset digests)"
    return keys, how


def energy_source_kind(source: str) -> str:
    """What measured energy_kwh, in the coarse terms that decide whether two runs' energies can be
    compared: a CPU package (RAPL) or GPU boards (NVML counter or integrated power)."""
    if source.startswith("RAPL"):
        return "RAPL (CPU package)"
    if source.startswith("NVML"):
        return "NVML (GPU board)"
    return source.split(":")[0][:40] if source else ""


def _windows(text: Optional[str]) -> Tuple[Tuple[float, ...], str]:
    """Each epoch's window seconds from the tag, or () with why."""
    if not text:
        return (), f"tag {WINDOWS_TAG} not logged"
    try:
        pairs = json.loads(text)
        seconds = tuple(float(end) - float(start) for start, end in pairs)
    except (ValueError, TypeError):
        return (), f"tag {WINDOWS_TAG} is not a list of [start, end] pairs"
    if not seconds or any(not math.isfinite(s) or s <= 0 for s in seconds):
        return (), f"tag {WINDOWS_TAG} has an empty or non-positive window"
    return seconds, ""


def finite(value: float) -> bool:
    """A logged metric that is a number: not nan, not +-inf, and not the largest float, which is
    how MLflow's SQL store keeps an inf that was logged."""
    return math.isfinite(value) and abs(value) < sys.float_info.max


def finite_metrics(run: Any) -> Dict[str, float]:
    """A run's metrics without those logged as nan or +-inf (a diverged run): never scored, ranked or crowned."""
    return {k: v for k, v in run.data.metrics.items() if finite(v)}


def not_finite(metrics: Dict[str, float], name: str) -> str:
    """Why a logged metric is taken as null: '' unless it was logged as nan or +-inf."""
    value = metrics.get(name)
    if value is None or finite(value):
        return ""
    shown = "nan" if math.isnan(value) else "-inf" if value < 0 else "inf"
    return f"{name} logged as {shown}: not a finite number"


def accuracy_histories(client: Any, run_ids: Sequence[str]) -> Optional[Dict[str, List[Any]]]:
    """Each run's ACCURACY_METRIC history in a few queries where the store can (MLflow's SQL
    store, get_metric_history_bulk), else None (ask per run): one query per run cost seconds per
    thousand runs."""
    bulk = getattr(getattr(getattr(client, "_tracking_client", None), "store", None), "get_metric_history_bulk", None)
    if bulk is None:
        return None
    out: Dict[str, List[Any]] = {rid: [] for rid in run_ids}
    for at in range(0, len(run_ids), HISTORY_RUNS_AT_ONCE):  # (SQLite limits the variables of one query)
        for m in bulk(list(run_ids[at:at + HISTORY_RUNS_AT_ONCE]), ACCURACY_METRIC, max_results=10 ** 9):
            out.setdefault(m.run_id, []).append(m)  # (a Metric with its run_id)
    return out


def run_fields(run: Any, client: Any, history: Optional[List[Any]] = None) -> Dict[str, Any]:
    """Row fields from one run, and why each empty one is empty (under "extra"). history: the
    run's ACCURACY_METRIC history when already read (accuracy_histories), else asked for here."""
    from bertaccel.options.dataset import label
    from bertaccel.record.run_record import run_settings

    tags, params = run.data.tags, run_settings(run)
    metrics = finite_metrics(run)
    extra: Dict[str, str] = {}
    fields: Dict[str, Any] = {"seed": params.get(SEED_PARAM, "")}
    for name in ACTIVITY_METRICS:
        fields[name] = metrics.get(name)
        if fields[name] is None:
            extra[name] = not_finite(run.data.metrics, name) or tags.get(f"{name}_source", "not logged")
    from bertaccel.config import GROUPS

    # A run logs each group's option as a param named for the group (record/run_record.py open_tracker).
    fields["choices"] = {g: params[g] for g in GROUPS if g in params}
    fields["settings"] = dict(params)  # (the like-for-like groups, the baseline's defaults, labels)
    fields["sweep"] = tags.get("sweep_id", "")
    fields["device"] = tags.get("device_name", "")
    fields["dataset"] = label(params)  # `imdb (csv)`: the data, not only its loader
    fields["energy_source"] = energy_source_kind(tags.get("energy_kwh_source", "")) \
        if metrics.get("energy_kwh") is not None else ""
    subset = params.get("dataset.test_subset")
    fields["test_rows"] = int(subset) if subset and subset.isdigit() else None
    if fields["test_rows"] is None:
        extra["test_rows"] = "dataset.test_subset = null: the full test split" if subset == "null" else \
            "param dataset.test_subset not logged"
    if history is None:
        history = client.get_metric_history(run.info.run_id, ACCURACY_METRIC)
    history = sorted(history, key=lambda m: m.step)
    fields["epoch_accuracy"] = tuple(m.value for m in history)
    if not all(finite(a) for a in fields["epoch_accuracy"]):
        fields["epoch_accuracy"] = ()
        extra["epoch_accuracy"] = f"{ACCURACY_METRIC} logged as a number that is not finite in an epoch"
    fields["epoch_time_s"], why = _windows(tags.get(WINDOWS_TAG))
    if why:
        extra["epoch_time_s"] = why
    fields["extra"] = extra
    return fields
