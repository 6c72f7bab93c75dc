"""One configuration, end to end: checks, data, model, training, and its MLflow record filled
(record/run_record.py opens it and records what never reaches training).

`execute` never raises for a problem of the run itself: it returns an Outcome whose status is
finished, skipped (this machine cannot run the combination) or failed (an exception while
running), and the MLflow run says the same. Bad input (ConfigError, DataError) is raised before
anything is written, so the caller can decide between "one line and exit" and "record and go on".
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple

import torch

from bertaccel import distributed
from bertaccel.config import ConfigError, RunConfig, first_line
from bertaccel.data import Batching, DatasetUnavailable, RawData, TokenizedData, load_raw, make_loader, tokenize_cached
from bertaccel.measure.carbon import co2e
from bertaccel.measure.collectors import CollectorSet, Reading, build_collectors
from bertaccel.measure.memory import PeakMemory
from bertaccel.measure.profiling import write_report
from bertaccel.model import ModelUnavailable, build_model, built_shape, load_tokenizer
from bertaccel.options.checks import ask_later
from bertaccel.options.train import fits_batch
from bertaccel.options.hardware import check_gpu_count, device_name, probe, resolve_device, resolve_profile, skip_reason
from bertaccel.plan.hook import log_prediction
from bertaccel.runs.cuda_free_imports import run_process_cuda_check
from bertaccel.record.datasets import dataset_inputs
from bertaccel.record import exclusive
from bertaccel.context import current as run_context
from bertaccel.options.sweep import lock_directory, shares_gpu
from bertaccel.runs.interrupt import Interrupted
from bertaccel.options.launcher import launcher_for
from bertaccel.record.readings import TIMER_SOURCE, derived, log_accumulation, log_backprop, run_metric_sources, run_metrics
from bertaccel.record.run_record import Outcome, RankTracker, logged_config, open_tracker, restated_tags, resumed
from bertaccel.runs.startup import Mark, startup_phases
from bertaccel.record.store_failure import close_or_name, failed
from bertaccel.store import store_lock
from bertaccel.train.result import TrainResult
from bertaccel.train.batch_fit import cpu_refusal, fitted_batch
from bertaccel.train.compile_cache import CompileCache, compile_caches
from bertaccel.train.exclusive import BYTES_PER_PARAMETER, ExclusiveWindow, WindowFigures, wait_for_memory
from bertaccel.train.isolation import isolated_run
from bertaccel.train.loop import train
from bertaccel.train.step import uses_fixed_shapes
from bertaccel.train.warmup import WarmupPlan, data_lengths

if TYPE_CHECKING:  # (MLflow's entities and transformers' classes: imported where they are made)
    from mlflow.entities import DatasetInput
    from transformers import PreTrainedModel

log = logging.getLogger("bertaccel")


class Tracker(Protocol):
    """What a run writes its record through: rank 0's MLflow run (record/tracking.py RunTracker), or
    nothing on the other ranks of a data-parallel job (record/run_record.py RankTracker)."""
    @property
    def run_id(self) -> Optional[str]: ...
    def log_metrics(self, metrics: Mapping[str, Optional[float]], step: int = 0) -> None: ...
    def log_series(self, key: str, values: Sequence[float]) -> None: ...
    def log_artifacts(self, local_dir: str, artifact_path: str) -> None: ...
    def log_inputs(self, datasets: Sequence[DatasetInput]) -> None: ...  # (record/datasets.py builds them)
    def set_tags(self, tags: Mapping[str, str]) -> None: ...
    def finish(self, status: str, reason: Optional[str] = None) -> None: ...


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {first_line(e, default='')}"


def job_devices(device: torch.device, world_size: int) -> List[torch.device]:
    """The devices of the whole job: rank r uses cuda:r (launch.py starts one process per GPU)."""
    if device.type != "cuda":
        return [device]
    return [torch.device("cuda", r) for r in range(world_size)]


def execute(run: RunConfig, choices: Mapping[str, str], run_name: str,
            started_at: float, started_source: str, rank: Optional[distributed.Rank] = None,
            launch_tags: Optional[Mapping[str, str]] = None, startup: Sequence[Mark] = (),
            later: Sequence[str] = ()) -> Outcome:
    """run: the config launch.py typed (validated once, there or by the sweep's plan).
    started_at: wall time the run's overhead counts from (see run.py). rank: this process's
    place in a data-parallel job (launch.py), None for a single process. launch_tags: tags the
    launcher finds the run by if its process dies. startup: the marks from started_at to this
    call (runs/startup.py: the main process, the launch, the run's process). later: the later
    checks validate() left to this process (options/launcher.py left_to_the_run), asked here alone."""
    marks = {"entered": time.time()}  # where the start-up goes: startup.startup_phases()
    # Bad input first, before anything is written (raises ConfigError / DataError).
    ask_later(run, later)
    # `run` is what everything reads; `cfg`, the DictConfig the record writes when it opens the run
    # (params, config.yaml, config_hash) and the profile is read from, is derived from it (record/).
    cfg = logged_config(run)
    device = resolve_device(run.train.device)
    check_gpu_count(run.num_gpus, device)
    if device.type == "cuda" and (why := run_process_cuda_check()):
        raise ConfigError(why)
    if fits_batch(run.train) and device.type != "cuda":
        raise ConfigError(cpu_refusal(device))
    if rank is not None and device.type == "cuda":
        device = torch.device("cuda", rank.rank)
        torch.cuda.set_device(device)
    # (the DictConfig's group: the profile is a dict of its keys, as the record and report read it)
    profile, profile_note = resolve_profile(cfg.hardware, device)
    is_main = rank is None or rank.is_main
    if is_main:
        log.info(profile_note)
    marks["checked"] = time.time()
    try:  # (bad data is raised here, before anything is written)
        raw, unavailable = load_raw(run.dataset, run.cache_dir), None
    except DatasetUnavailable as e:
        raw, unavailable = None, str(e)
    marks["data read"] = time.time()

    world = 1 if rank is None else rank.world_size
    what_if = {"hardware_what_if": f"hardware={profile['name']} priced and peaked a run that used "
                                   f"{device_name(device)} (hardware.what_if=true)"} if profile["what_if"] else {}
    tracker: Tracker
    if not is_main:  # rank 0 looks up and writes the job's one run
        tracker, marks["looked up"] = RankTracker(), time.time()
    else:
        # The look-up of earlier runs and the opening of this one are one step under the store's
        # lock: of two sweeps on one store, one opens the run (its claim on the configuration),
        # the other finds it running and waits for it (launch.py).
        with store_lock(cfg.tracking.uri):
            earlier = resumed(cfg, run_name, raw)  # (the rows as read: resume compares their digests)
            if earlier is not None:
                return earlier
            marks["looked up"] = time.time()
            tracker = open_tracker(cfg, choices, run_name, {
                "device_name": device_name(device), "world_size": str(world),
                # the report's hardware column: a what-if run is not mistaken for one on that hardware
                "hardware_profile": profile["name"] + (" (what-if)" if what_if else ""), **what_if,
                "backend": distributed.backend_for(device.type) if world > 1 else "none (one process)",
                **(launch_tags or {})}, profile)
    marks["run opened"] = time.time()
    outcome = Outcome("running", run_name, run_id=tracker.run_id)
    with distributed.process_group(rank, device.type):
        return _run(run, run_name, (started_at, started_source, list(startup)), device, profile, raw, unavailable,
                    tracker, outcome, world, marks)


def _run(run: RunConfig, run_name: str, started: Tuple[float, str, List[Mark]], device: torch.device,
         profile: Mapping[str, Any], raw: Optional[RawData], unavailable: Optional[str], tracker: Tracker,
         outcome: Outcome, world: int, marks: Dict[str, float]) -> Outcome:
    try:
        reason = unavailable or skip_reason(run, device, probe())
        if reason or raw is None:  # (no raw data only where `unavailable` says why)
            return _end(tracker, outcome, "skipped", reason)
        tracker.log_inputs(dataset_inputs(run.dataset, raw))  # the UI's Dataset column (record/datasets.py)
        with isolated_run(run.train.seed, shared_process=launcher_for(run.launcher.name).shares_process), \
                tempfile.TemporaryDirectory(prefix="bertaccel-profile-") as prof_dir, \
                compile_caches(run.cache_dir, run.compile, device) as ccache:
            tokenizer, data = _prepare_data(run, raw, marks)
            model, weights_note = _build_model(run, raw, tokenizer, tracker, marks)
            if fits_batch(run.train):  # before the prediction and loaders, which read the batch
                run = fitted_batch(run, model, device, data, tracker)  # the prediction and the metrics read it
                marks["batch fitted"] = time.time()
            # This run's own prediction, from the store as it stood before it (bertaccel/plan/hook.py).
            log_prediction(run, tracker, data.train.lengths, raw.num_labels, model.config, profile, run_name)
            marks["predicted"] = time.time()
            trained = _train_and_measure(run, model, tokenizer, data, device, profile, world, ccache,
                                         Path(prof_dir), marks)
            if trained.result.profile is not None:
                write_report(trained.result.profile, Path(prof_dir))
                tracker.log_artifacts(prof_dir, "profile")
        # (after the with: the isolation, the profile directory and the compile caches are closed)
        outcome.metrics = _fill_record(run, tracker, trained, data, raw, weights_note, ccache, device, profile,
                                       marks, started)
        return _end(tracker, outcome, "finished")
    except ModelUnavailable as e:
        return _end(tracker, outcome, "skipped", str(e))
    except Interrupted as e:  # SIGINT / SIGTERM with launcher=inline: this process holds the record
        _end(tracker, outcome, "interrupted", e.reason)
        e.run_id, e.run_name = outcome.run_id, run_name
        raise
    except Exception as e:  # noqa: BLE001 - any failure of one run is recorded, the sweep goes on
        store = failed(e, run.tracking.uri, run.tracking.experiment)
        if store is not None:  # not the run's own: the store or the disk, the sweep stops (record/store_failure.py)
            # (the other ranks of a data-parallel job opened no run: rank 0's is the one to close)
            opened = [(outcome.run_id, run_name)] if outcome.run_id is not None else []
            raise store.leaving(close_or_name(run.tracking.uri, opened, store.reason)) from None
        log.error(f"run {run_name} failed:\n{traceback.format_exc()}")
        return _end(tracker, outcome, "failed", _first_line(e))


def _prepare_data(cfg: RunConfig, raw: RawData, marks: Dict[str, float]) -> Tuple[Any, TokenizedData]:
    """The tokenizer and the tokenized splits (from the token cache when it has them)."""
    tokenizer = load_tokenizer(cfg.model)
    data = tokenize_cached(raw, tokenizer, cfg.dataset.max_length, cfg.cache_dir)
    log.info(f"tokenized {len(data.train)} train / {len(data.test)} test rows "
             f"(cache {'hit' if data.cache_hit else 'miss'}, {data.tokenize_time_s:.2f} s)")
    marks["tokenized"] = time.time()
    return tokenizer, data


def _build_model(cfg: RunConfig, raw: RawData, tokenizer: Any, tracker: Tracker,
                 marks: Dict[str, float]) -> Tuple[PreTrainedModel, str]:
    """The model and where its weights came from; the built shape goes to the run's record."""
    model, weights_note = build_model(cfg.model, raw.num_labels, cfg.attention, len(tokenizer), cfg.encoder)
    log.info(f"model {cfg.model.name}: {weights_note}")
    marks["model built"] = time.time()
    # What was built, where the config has no shape of its own (a pretrained model): the model
    # choice restates it, so a tag beside the choice's param (record/run_record.py CONFIG_TAG_PREFIX).
    tracker.set_tags(restated_tags({f"model.{k}": v for k, v in built_shape(model).items() if getattr(cfg.model, k) is None}))
    return model, weights_note


def _loaders(cfg: RunConfig, data: TokenizedData, tokenizer: Any, device: torch.device, world: int) -> List[Any]:
    """The train and test loaders, this rank's share of each."""
    batching = Batching.of(cfg.train, device, fixed_rows=uses_fixed_shapes(cfg))
    return [make_loader(split, batching.sized(bs), tokenizer.pad_token_id, shuffle, cfg.train.seed,
                        distributed.rank(), world)
            for split, bs, shuffle in ((data.train, cfg.train.batch_size, True),
                                       (data.test, cfg.train.eval_batch_size, False))]


@dataclass
class _Trained:
    """What training and the measurements around it give the record."""
    result: TrainResult  # train()'s result (projected from the exclusive window: record/exclusive.py)
    peak_gib: Optional[float]
    peak_source: str
    cache_state: str  # compile cache: cold / warm / fresh / none
    measured: Dict[str, Reading]  # the collectors' readings and what is derived from them
    window: Optional[WindowFigures] = None  # sweep.concurrent > 1: the exclusive window (result: projected)
    memory_wait_s: Optional[float] = None  # sweep.concurrent > 1 on a GPU: waited for the others' memory


def _exclusive(cfg: RunConfig, model: torch.nn.Module, collectors: CollectorSet,
               device: torch.device) -> Tuple[Optional[ExclusiveWindow], Optional[float]]:
    """sweep.concurrent > 1: the run's side of the shared device (train/exclusive.py), after it
    waited for the memory it needs; (None, None) otherwise."""
    if not shares_gpu(cfg.sweep):
        return None, None
    waited = None
    if device.type == "cuda":  # (a CPU host's memory has no free figure that a run could wait on)
        need = BYTES_PER_PARAMETER * sum(p.numel() for p in model.parameters())
        waited = wait_for_memory(lambda: torch.cuda.mem_get_info(device)[0], need, log.info)
    sweep = run_context().sweep  # (a single run: its own lock, which nobody shares)
    directory = lock_directory(cfg.cache_dir, sweep.sweep_id if sweep is not None else f"run-{os.getpid()}")
    return ExclusiveWindow(directory, cfg.sweep.window_steps, collectors), waited


def _train_and_measure(cfg: RunConfig, model: torch.nn.Module, tokenizer: Any, data: TokenizedData,
                       device: torch.device, profile: Mapping[str, Any], world: int, ccache: CompileCache, prof_dir: Path,
                       marks: Dict[str, float]) -> _Trained:
    """Loaders, telemetry and the peak-memory reading around one call of train()."""
    loaders = _loaders(cfg, data, tokenizer, device, world)
    # The shapes this run's batches can have, compiled before the first window (warmup.py).
    plan = WarmupPlan(cfg.train.batch_size, cfg.train.eval_batch_size,
                      data_lengths(data.train.lengths, cfg.train.pad_to_multiple_of),
                      data_lengths(data.test.lengths, cfg.train.pad_to_multiple_of))
    # Rank 0 samples every GPU of the job (NVML reads any GPU of the host): job-wide energy.
    collectors = build_collectors(job_devices(device, world), cfg.telemetry.interval_s,
                                  cfg.telemetry.rapl_root, cfg.telemetry.enabled and distributed.rank() == 0)
    memory = PeakMemory(device)
    memory.reset()
    peak = []  # read before the profiler window, whose event buffers would count on a CPU
    window, memory_wait_s = _exclusive(cfg, model, collectors, device)
    marks["train called"] = time.time()
    # (`train` is looked up in this module at the call: tests/launcher_poison replaces it there)
    try:
        result = train(model, loaders[0], loaders[1], cfg, device, log=log.info,
                       collectors=collectors if window is None else CollectorSet(), profile_dir=prof_dir,
                       after_training=lambda: peak.append(memory.read()), warmup_plan=plan,
                       outermost=[window] if window is not None else [])
    finally:  # (a run that raised lets the others go before it records its failure)
        if window is not None:
            window.lock.close()
    peak_gib, peak_source = peak[0]
    if world > 1:  # the largest of the ranks (-1: a rank that could not read its peak)
        (largest,) = distributed.max_across([-1.0 if peak_gib is None else peak_gib], device)
        peak_gib = None if largest < 0 else largest
        peak_source += f", the largest over {world} ranks"
    ccache.mark_warmed_up()  # (after training: a compile inside a window also counts as cold)
    cache_state = ccache.state(result.compiled_anything)
    readings = collectors.results()
    if window is not None:  # time and energy projected from the exclusive window (record/exclusive.py)
        readings = exclusive.window_readings(readings, window.figures, result.optimizer_steps)
        result = exclusive.projected_result(result, window.figures)
    measured = derived(readings, result, profile, cfg.precision.mfu_peak, cfg.num_gpus)
    measured["co2e_kg"] = co2e(measured.get("energy_kwh", Reading.null("no energy collector")),
                               cfg.carbon, profile)
    return _Trained(result, peak_gib, peak_source, cache_state, measured,
                    None if window is None else window.figures, memory_wait_s)


def _fill_record(cfg: RunConfig, tracker: Tracker, trained: _Trained, data: TokenizedData, raw: RawData,
                 weights_note: str, ccache: CompileCache, device: torch.device, profile: Mapping[str, Any], marks: Mapping[str, float],
                 started: Tuple[float, str, List[Mark]]) -> Dict[str, Any]:
    """The finished run's metrics, series and tags (each metric with its _source); returns the
    metrics the Outcome carries (those with a value). started: (started_at, its source, the marks
    up to job.execute)."""
    result, measured = trained.result, trained.measured
    started_at, started_source, before = started
    for e in result.epochs:
        tracker.log_metrics({"train_loss": e.train_loss, "test_accuracy": e.test_accuracy,
                             "trainable_params": e.trainable_params}, step=e.epoch)
    price = profile.get("price_per_gpu_hour_usd")
    what_if_note = (f"; what-if: profile {profile['name']} on {device_name(device)}, not the device's own"
                    if profile["what_if"] else "")
    phases = startup_phases(before, marks, started_at, result)
    log.info("start-up before the first step: " + ", ".join(f"{k} {v:.2f} s" for k, v in phases.items()))
    metrics = run_metrics(cfg, result, data, raw, trained.peak_gib, price, started_at)
    tracker.log_metrics({k: v for k, v in metrics.items() if k not in ("test_accuracy", "train_loss")},
                        step=result.epochs[-1].epoch)
    sources = run_metric_sources(cfg, result, trained.peak_source, price, profile, what_if_note, device,
                                 started_source)
    tracker.set_tags({
        **sources,
        "compile_cache": trained.cache_state,
        "compile_cache_dir": ccache.describe(),
        "tokenize_cache": "hit" if data.cache_hit else "miss",
        "model_weights": weights_note,
        "startup_phases_s": json.dumps(phases),
        "startup_phases_s_source": ("time.time() marks in the main process (bertaccel.run; the first job from "
                                    "the process's start), the launch, the run's process and the run "
                                    "(job.execute / train), runs/startup.py: the phases sum to startup_overhead_s"),
    })
    tracker.log_series("lr", result.lr_per_step)
    tracker.log_series("step_ms", [t for e in result.epochs for t in e.step_ms])  # which steps were slow
    if result.accumulation_k:
        log_accumulation(tracker, result, metrics)
    if result.backprop is not None:
        log_backprop(tracker, result.backprop, metrics, device)
    tracker.log_metrics({k: r.value for k, r in measured.items()}, step=result.epochs[-1].epoch)
    tracker.set_tags({f"{k}_source": r.source + (what_if_note if k == "mfu" and r.value is not None else "")
                      for k, r in measured.items()})
    tracker.set_tags({"train_windows_unix": json.dumps([list(e.window_unix) for e in result.epochs])})
    metrics.update({k: r.value for k, r in measured.items()})
    if trained.window is not None:
        _record_window(tracker, trained, metrics, {**sources, **{f"{k}_source": r.source for k, r in measured.items()}})
    return {k: v for k, v in metrics.items() if v is not None}


def _record_window(tracker: Tracker, trained: _Trained, metrics: Dict[str, Any], sources: Mapping[str, str]) -> None:
    """sweep.concurrent > 1: the exclusive window's figures beside the projections, whose sources say so."""
    fig, result = trained.window, trained.result
    assert fig is not None and isinstance(result, exclusive.ProjectedResult)
    window_metrics, tags = exclusive.window_record(fig, result, TIMER_SOURCE)
    window_metrics["memory_wait_s"] = trained.memory_wait_s
    tags["memory_wait_s_source"] = (f"waited before training until the device's free memory (cudaMemGetInfo) held "
                                    f"{BYTES_PER_PARAMETER} bytes per parameter (weights, gradients, 2 optimizer "
                                    "moments)" if trained.memory_wait_s is not None else
                                    "null: on a CPU, no free-memory figure to wait on")
    tracker.log_metrics(window_metrics, step=result.epochs[-1].epoch)
    tags.update(exclusive.from_projected(fig, metrics, sources))
    tracker.set_tags(tags)
    metrics.update(window_metrics)


def _end(tracker: Tracker, outcome: Outcome, status: str, reason: Optional[str] = None) -> Outcome:
    tracker.finish(status, reason)
    outcome.status, outcome.reason = status, reason
    if reason:
        log.warning(f"run {outcome.run_name}: {status}: {reason}")
    return outcome
