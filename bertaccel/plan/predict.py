"""Predictions for the configurations of a grid, on their own hardware and on others.

One path for the plan CLI and for a run's own prediction (hook.py): the configuration's
similarity key is built from the same params a run logs (record.open_tracker: the resolved config
flattened, the group choices, the model's shape), so a configuration and the runs of the store
are compared on equal terms.
"""
from __future__ import annotations

import os
import threading
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple

from omegaconf import OmegaConf

from .calibrate import Calibration, Reference, calibrate, references, similarity_key
from .fit import fit_overhead
from .pricing import Prediction, price, unpredicted
from .probe import Prober, ProbeResult
from .roofline import parts_of
from .wall import SweepWalls, compiles, graph_key
from ..config import RunConfig, first_line
from ..model import hf_config
from ..options.compile import keeps_cache
from .work import DataShape, Work, data_shape, meta_model, work_of

if TYPE_CHECKING:  # (transformers: imported where a model is built)
    from transformers import PretrainedConfig

SCRATCH_BESIDE_PROBES_CORES = 4  # cores from which the scratch store is timed beside the probes


def run_params(cfg: RunConfig, choices: Mapping[str, str], config: PretrainedConfig) -> Dict[str, str]:
    """The params the run of this configuration logs (record.open_tracker), the model shape included."""
    from bertaccel.record.tracking import flatten

    from ..model import built_shape

    params = flatten(asdict(cfg))
    params.update({f"model.{k}": str(v) for k, v in built_shape(meta_model(config)).items()})
    params.update(choices)
    return params


def own_profile(cfg: RunConfig) -> Tuple[Optional[Dict[str, Any]], str]:
    """(the profile the run would use, how it was chosen) or (None, why not). A named profile is
    used as it is (planning for hardware not at hand is the point); hardware=auto is resolved on
    this machine, as the run would resolve it here."""
    from bertaccel.options.hardware import picks_profile, resolve_device, resolve_profile

    from ..config import ConfigError

    hardware = OmegaConf.structured(cfg.hardware)  # (the profile as a run reads it: record.logged_config's)
    if not picks_profile(hardware):
        return {k: hardware[k] for k in hardware}, f"hardware={hardware.name} (as configured)"
    try:
        return resolve_profile(hardware, resolve_device(cfg.train.device))
    except ConfigError as e:
        return None, f"hardware=auto cannot be resolved here ({e}); name a profile (hardware=h100)"


StoreRefs = Tuple[List[Reference], str]  # a store's runs that can calibrate, and a note on the store


def store_references(uri: str, experiment: str, memo: Optional[Dict[Tuple[str, str], StoreRefs]] = None
                     ) -> StoreRefs:
    """The store's runs that can calibrate, and a note on the store ('' when it was read)."""
    from bertaccel.record.tracking import search_runs
    from bertaccel.store import sqlite_file, sqlite_state, store_problem

    if memo is not None and (uri, experiment) in memo:
        return memo[(uri, experiment)]
    db = sqlite_file(uri)
    why = store_problem(uri, create=False)  # (reading only: nothing is created in a path that is no store)
    if db is not None and sqlite_state(db)[0] == "missing":
        found: StoreRefs = ([], f"store {uri} does not exist yet: no run to calibrate from")
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
    work_memo: Dict[str, Tuple[DataShape, Any, Work]] = field(default_factory=dict)  # by config_hash
    store_memo: Dict[Tuple[str, str], StoreRefs] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)
    prober: Prober = field(default_factory=Prober)    # --probe: enabled
    walls: SweepWalls = field(default_factory=SweepWalls)
    own_rows: int = 0                                  # this machine's rows so far (the first run's start-up)

    def profiles(self) -> Dict[str, Dict[str, Any]]:
        from bertaccel.options.hardware import load_profiles

        return {p["name"]: p for p in load_profiles()}

    def _inputs(self, planned: Any) -> Tuple[DataShape, Any, Work]:
        """The configuration's data, model config and work (once per configuration: probe_ahead
        and predict both ask)."""
        if planned.config_hash not in self.work_memo:
            cfg = planned.run
            data = data_shape(cfg, self.data_memo)
            config = hf_config(cfg.model, data.num_labels, data.vocab_size)
            self.work_memo[planned.config_hash] = (data, config, work_of(cfg, data, config))
        return self.work_memo[planned.config_hash]

    def _scratch_once(self, work: Work) -> None:
        """A run's MLflow costs, timed once per plan on a scratch store (wall.Scratch): beside the
        probes, or before them on a small host (probe_ahead)."""
        if self.walls.scratch.record_s is None:
            self.walls.scratch.measure(work.optimizer_steps or work.micro_batches)

    def probe_ahead(self, configs: Sequence[Any]) -> None:
        """--probe: before any prediction, the configurations that compile nothing are probed
        together in one process (Prober.ahead); predict then finds them. A configuration that
        cannot be read or priced here is left to predict, which says why."""
        if not self.prober.enabled:
            return
        reqs, first_work = [], None
        for planned in configs:
            if planned.invalid:
                continue
            try:
                data, config, work = self._inputs(planned)
            except Exception:  # noqa: BLE001 - predict says it, one line per row
                continue
            first_work = first_work or work
            profile, _ = own_profile(planned.run)
            req = self.prober.request(planned.run, data, config, work, profile)[0] if profile is not None else None
            if req is not None:
                reqs.append(req)
        # The scratch store's timing (1.3-1.5 s on the GPU hosts, after the forkserver's preload was
        # done) beside the probes, in this process that only waits for them, where the host has cores
        # to spare; on fewer it would take CPU from the probes it runs beside, so it runs first there.
        scratch = None
        if first_work is not None and (os.cpu_count() or 1) >= SCRATCH_BESIDE_PROBES_CORES:
            scratch = threading.Thread(target=self._scratch_once, args=(first_work,), name="bertaccel-plan-scratch",
                                       daemon=True)
            scratch.start()
        elif first_work is not None:
            self._scratch_once(first_work)
        try:
            self.prober.ahead(reqs, self.walls.machine)
        finally:
            if scratch is not None:
                scratch.join()  # (a failure there is met again, and said, when predict asks for it)

    def predict(self, planned: Any) -> List[Prediction]:
        """The configuration on its own hardware, then on each target profile."""
        composed = planned.cfg  # (as composed: an invalid configuration has no typed config)
        precision, gpus = composed.precision.mfu_peak, int(composed.num_gpus)
        profiles = self.profiles()
        hw_rows = [("own", None)] + [(t, profiles[t]) for t in self.targets]
        if planned.invalid:
            return [unpredicted(planned.name, planned.config_hash, composed.hardware.name if n == "own" else n,
                                precision, gpus, f"invalid: {'; '.join(planned.invalid.splitlines())}") for n, _ in hw_rows]
        cfg = planned.run
        try:
            data, config, work = self._inputs(planned)
            params = run_params(cfg, planned.choices, config)
        except Exception as e:  # noqa: BLE001 - DataError, DatasetUnavailable, ModelUnavailable, adaptive+cap
            why = first_line(e)
            return [unpredicted(planned.name, planned.config_hash, cfg.hardware.name if n == "own" else n, precision,
                                gpus, why) for n, _ in hw_rows]
        refs, store_note = store_references(cfg.tracking.uri, cfg.tracking.experiment, self.store_memo)
        if store_note and store_note not in self.notes:
            self.notes.append(store_note)
        if self.prober.enabled:
            self._scratch_once(work)
        out = []
        own: Optional[Tuple[Prediction, Mapping[str, Any]]] = None  # this machine's probed row
        for label, profile in hw_rows:
            if profile is None:
                profile, how = own_profile(cfg)
                if profile is None:
                    out.append(unpredicted(planned.name, planned.config_hash, cfg.hardware.name, precision, gpus, how))
                    continue
            probe, probe_note = self.prober.get(cfg, data, config, work, profile, runs_machine=self.walls.machine)
            pred = predict_one(planned.name, planned.config_hash, work, params, profile, profiles, refs,
                               precision, gpus, probe, probe_note)
            if probe is not None:
                own = (pred, profile)
            elif own is not None and not _exact_anywhere(refs, similarity_key(params, profile["name"])):
                pred = _moved_probe(pred, own, work, params, profile, precision, gpus)
            if label == "own":
                self._waits(cfg, pred, work, probe, refs, similarity_key(params, profile["name"]), data)
            else:
                for col in ("warmup_s", "startup_overhead_s", "eval_time_s", "run_wall_s"):
                    pred.why[col] = "null: what a user waits for is predicted for the sweep's own hardware only"
            out.append(pred)
        return out

    def _waits(self, cfg: RunConfig, pred: Prediction, work: Work, probe: Optional[ProbeResult], refs: Sequence[Reference],
               key: Mapping[str, str], data: DataShape) -> None:
        self.walls.fill(pred, work, probe, refs, key, graph_key(cfg), compiles(cfg),
                        keeps_cache(cfg.compile), first=self.own_rows == 0)
        self.own_rows += 1


def _exact_anywhere(refs: Sequence[Reference], key: Mapping[str, str]) -> bool:
    """Whether the store has finished runs of this very configuration, on any hardware."""
    return any(all(r.key[k] == key[k] for k in key if k != "hardware") for r in refs)


def _moved_probe(pred: Prediction, own: Tuple[Prediction, Mapping[str, Any]], work: Work, params: Mapping[str, str],
                 profile: Mapping[str, Any], precision: str, gpus: int) -> Prediction:
    """The configuration on another profile from its probe here, moved through the roofline
    (roofline.transfer: the probe's overhead kept as the host's launch part, the rest split into
    GEMM and memory shares and scaled by the peak and bandwidth ratios)."""
    from .roofline import Uncounted, transfer

    here, source = own
    if here.train_time_s is None or work.model_flops <= 0:
        return pred
    steps = work.optimizer_steps or work.micro_batches / gpus / 2
    try:
        moved, how = transfer(here.train_time_s, parts_of(work, params), source, profile, precision,
                              here.overhead_ms_per_step / 1e3 * steps)
    except Uncounted as e:
        pred.basis += f" (the probe on '{source['name']}' not moved here: {e})"
        return pred
    cal = Calibration(work.model_flops / (moved * gpus) / 1e12, pred.power_w_per_gpu,
                      f"{here.basis} on '{source['name']}', moved by the {how}", pred.power_basis, [])
    return price(pred.name, pred.config_hash, work, cal, profile, precision, gpus)


def predict_one(name: str, config_hash: str, work: Work, params: Mapping[str, str], profile: Mapping[str, Any],
                profiles: Mapping[str, Mapping[str, Any]], refs: Sequence[Reference], precision: str,
                gpus: int, probe: Optional[ProbeResult] = None, probe_note: str = "") -> Prediction:
    key = similarity_key(params, profile["name"])
    cal = with_overhead(calibrate(refs, key, profile, profiles, precision, parts=lambda: parts_of(work, params)),
                        refs, key, probe, probe_note)
    return price(name, config_hash, work, cal, profile, precision, gpus)


def with_overhead(cal: Calibration, refs: Sequence[Reference], key: Mapping[str, str],
                  probe: Optional[ProbeResult], probe_note: str) -> Calibration:
    """The rate split into a per-step overhead and a FLOP rate (fit.py), from the best evidence:
    1. finished runs of this very configuration here (nothing let go): their own time, with the
       overhead fit when they differ in FLOPs per step;
    2. the probe of this configuration on this machine (plan --probe);
    3. the similar runs calibrate() chose, with the overhead fit when they differ in FLOPs per
       step (e.g. two batch sizes), else their FLOP rate alone."""
    exact = [r for r in refs if r.key == dict(key)]
    if not exact and probe is not None:
        how = "cached probe" if probe.cached else "probe"
        return Calibration(probe.tflops, cal.power_w_per_gpu,
                           f"{how} of this configuration here ({probe.measured_at}): {probe.fit['how']}",
                           cal.power_basis, [], probe.overhead_ms)
    used = exact or [r for r in refs if r.run_id in cal.run_ids and r.key["hardware"] == key["hardware"]]
    points = [(r, r.optimizer_steps) for r in used if r.optimizer_steps]
    if len(points) >= 2:
        fit = fit_overhead([r.model_flops / r.num_gpus for r, _ in points], [r.train_time_s for r, _ in points],
                           [steps for _, steps in points])
        if fit.overhead_ms > 0:
            return Calibration(fit.tflops, cal.power_w_per_gpu, f"{cal.basis}; {fit.how}", cal.power_basis,
                               cal.run_ids, fit.overhead_ms)
    if probe_note and not exact and (cal.basis.startswith("profile") or cal.basis.startswith("null")):
        return Calibration(cal.tflops_per_gpu, cal.power_w_per_gpu, f"{cal.basis} ({probe_note})", cal.power_basis,
                           cal.run_ids, cal.overhead_ms_per_step)
    return cal
