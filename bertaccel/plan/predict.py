"""Predictions for the configurations of a grid, on their own hardware and on others.

One path for the plan CLI and for a run's own prediction (hook.py): the configuration's
similarity key is built from the same params a run logs (record.open_tracker: the resolved config
flattened, the group choices, the model's shape), so a configuration and the runs of the store
are compared on equal terms.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from omegaconf import OmegaConf

from .calibrate import Reference, calibrate, references, similarity_key
from .pricing import Prediction, price, unpredicted
from .work import DataShape, Work, data_shape, hf_config, meta_model, work_of


def run_params(cfg: Any, choices: Mapping[str, str], config: Any) -> Dict[str, str]:
    """The params the run of this configuration logs (record.open_tracker), the model shape included."""
    from bertaccel.runs.tracking import flatten

    from ..model import built_shape

    params = flatten(OmegaConf.to_container(cfg, resolve=True))
    params.update({f"model.{k}": str(v) for k, v in built_shape(meta_model(config)).items()})
    params.update(choices)
    return params


def own_profile(cfg: Any) -> Tuple[Optional[Dict[str, Any]], str]:
    """(the profile the run would use, how it was chosen) or (None, why not). A named profile is
    used as it is (planning for hardware not at hand is the point); hardware=auto is resolved on
    this machine, as the run would resolve it here."""
    from bertaccel.options.hardware import resolve_device, resolve_profile

    from ..config import ConfigError

    if cfg.hardware.name != "auto":
        return {k: cfg.hardware[k] for k in cfg.hardware}, f"hardware={cfg.hardware.name} (as configured)"
    try:
        return resolve_profile(cfg.hardware, resolve_device(cfg.train.device))
    except ConfigError as e:
        return None, f"hardware=auto cannot be resolved here ({e}); name a profile (hardware=h100)"


def store_references(uri: str, experiment: str, memo: Optional[Dict[Tuple[str, str], Any]] = None
                     ) -> Tuple[List[Reference], str]:
    """The store's runs that can calibrate, and a note on the store ('' when it was read)."""
    from bertaccel.runs.tracking import search_runs
    from bertaccel.store import sqlite_file, sqlite_state, store_problem

    if memo is not None and (uri, experiment) in memo:
        return memo[(uri, experiment)]
    db = sqlite_file(uri)
    why = store_problem(uri, create=False)  # (reading only: nothing is created in a path that is no store)
    if db is not None and sqlite_state(db)[0] == "missing":
        found: Tuple[List[Reference], str] = ([], f"store {uri} does not exist yet: no run to calibrate from")
    elif why:
        found = ([], f"store {uri}: {why}: no run to calibrate from")
    else:
        found = (references(search_runs(uri, experiment, "tags.status = 'finished'")), "")
    if memo is not None:
        memo[(uri, experiment)] = found
    return found


@dataclass
class Planner:
    """What the predictions of one grid share: tokenized data, store reads, profiles."""
    targets: Sequence[str] = ()                       # --hardware: extra profiles to price on
    data_memo: Dict[str, DataShape] = field(default_factory=dict)
    store_memo: Dict[Tuple[str, str], Any] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)

    def profiles(self) -> Dict[str, Dict[str, Any]]:
        from bertaccel.options.hardware import load_profiles

        return {p["name"]: p for p in load_profiles()}

    def predict(self, planned: Any) -> List[Prediction]:
        """The configuration on its own hardware, then on each target profile."""
        cfg = planned.cfg
        precision, gpus = cfg.precision.mfu_peak, int(cfg.num_gpus)
        profiles = self.profiles()
        hw_rows = [("own", None)] + [(t, profiles[t]) for t in self.targets]
        if planned.invalid:
            return [unpredicted(planned.name, planned.config_hash, cfg.hardware.name if n == "own" else n, precision,
                                gpus, f"invalid: {planned.invalid}") for n, _ in hw_rows]
        try:
            data = data_shape(cfg, self.data_memo)
            config = hf_config(cfg.model, data.num_labels, data.vocab_size)
            work = work_of(cfg, data, config)
            params = run_params(cfg, planned.choices, config)
        except Exception as e:  # noqa: BLE001 - DataError, DatasetUnavailable, ModelUnavailable, adaptive+cap
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            return [unpredicted(planned.name, planned.config_hash, cfg.hardware.name if n == "own" else n, precision,
                                gpus, why) for n, _ in hw_rows]
        refs, store_note = store_references(cfg.tracking.uri, cfg.tracking.experiment, self.store_memo)
        if store_note and store_note not in self.notes:
            self.notes.append(store_note)
        out = []
        for label, profile in hw_rows:
            if profile is None:
                profile, how = own_profile(cfg)
                if profile is None:
                    out.append(unpredicted(planned.name, planned.config_hash, cfg.hardware.name, precision, gpus, how))
                    continue
            out.append(predict_one(planned.name, planned.config_hash, work, params, profile, profiles, refs,
                                   precision, gpus))
        return out


def predict_one(name: str, config_hash: str, work: Work, params: Mapping[str, str], profile: Mapping[str, Any],
                profiles: Mapping[str, Mapping[str, Any]], refs: Sequence[Reference], precision: str,
                gpus: int) -> Prediction:
    key = similarity_key(params, profile["name"])
    cal = calibrate(refs, key, profile, profiles, precision)
    return price(name, config_hash, work, cal, profile, precision, gpus)
