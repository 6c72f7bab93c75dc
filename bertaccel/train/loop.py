"""The training core: one loop that every option changes by argument, never by shape.

Per epoch: apply the freezing schedule, (re)build the optimizer, run accumulation windows of
`accumulation` micro-batches, then evaluate on the test split. Only the training window is
timed into train_time_s, and only it is measured by the collectors (energy, GPU activity);
evaluation has its own clock (the thesis excludes it too). An optional profiler window runs
after the last evaluation (profiling.py).

`loop` is the whole loop on one screen; everything else hangs on its events, one object per
concern (train/events.py; the protocol, the run's state and the window: train/state.py; the
optimizer step: train/step.py). `train` lists the objects: that list is the events' order.
"""
from __future__ import annotations

import math
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from bertaccel import distributed
from bertaccel.config import RunConfig
from bertaccel.encoder.option import half_params
from bertaccel.measure.collectors import CollectorSet
from bertaccel.options.optimizer import optimizer_class, scaled_lr
from bertaccel.options.precision import Precision
from bertaccel.train.accumulation import Accumulation
from bertaccel.train.checkpointing import apply_checkpointing
from bertaccel.train.events import (AfterTraining, Collectors, CompileEventCount, CompileWarmup, Evaluation,
                                    FreezingSchedule, LayerTiming, LrSchedule, NonFiniteCheck, Profiler, ProgressBar,
                                    RanksTogether)
from bertaccel.train.forward import Forward
from bertaccel.train.isolation import warm_up_device
from bertaccel.train.result import TrainResult
from bertaccel.train.state import Callback, Events, Run, Window
from bertaccel.train.step import Step, compile_model, compiles_anything, data_parallel, dynamo_settings, windows
from bertaccel.train.warmup import WarmupPlan, padded_lengths


def loop(run: Run, events: Events) -> TrainResult:
    """The epoch / window / step loop; the events' order is the list `train` builds."""
    cfg, result = run.cfg, run.result
    events.run_start(run)
    for epoch in range(cfg.train.epochs):
        events.epoch_start(run, epoch)
        run.model.train()
        win = Window(epoch, run.model, run.device)
        with events.window(run, win):  # window_end also when a window_start, a step or the clock raised
            win.open(result)  # train_time_s from here
            for window in windows(run.train_loader, run.accumulation.k):
                if win.steps == run.steps_per_epoch:
                    break
                if result.first_step_started_at is None:
                    result.first_step_started_at = time.time()
                events.step_start(run, win)
                window_loss = run.step(window)
                run.micro_batches_done += len(window)
                win.clock.mark()
                win.add(window, window_loss)
                run.global_step += 1
                events.step_end(run, win)
            win.close()  # to here, after a device sync
        events.epoch_end(run, win)
        result.epochs.append(win.stats(run.model))
        result.last_window_end_unix = win.end_unix
        run.log(f"epoch {epoch + 1}/{cfg.train.epochs}: train_loss={win.epoch_loss():.4f} "
                f"test_accuracy={win.test_accuracy:.4f} train_time_s={win.train_time_s:.1f} "
                f"eval_time_s={win.eval_time_s:.1f} trainable_params={win.trainable:,}")
    events.run_end(run)
    return result


def train(model: torch.nn.Module, train_loader: Any, test_loader: Any, cfg: RunConfig,
          device: torch.device, log: Callable[[str], None] = print,
          collectors: Optional[CollectorSet] = None, profile_dir: Optional[Path] = None,
          after_training: Optional[Callable[[], None]] = None,
          warmup_plan: Optional[WarmupPlan] = None, callbacks: Sequence[Callback] = (),
          outermost: Sequence[Callback] = ()) -> TrainResult:
    """collectors: started/stopped around each training window. after_training: called after
    the last evaluation, before the optional profiler window (cfg.profile), which writes its
    trace to profile_dir. warmup_plan: the shapes to compile before the first window (job.py
    builds it from the data); None = derive the lengths from max_length (every multiple).
    callbacks: more event objects, innermost (their start hooks run last before the window's
    clock starts, their end hooks first after it stops). outermost: event objects listed first
    (their run_start before the warm-up, their run_end after all else: train/exclusive.py)."""
    collectors = collectors or CollectorSet()
    run = _prepare(model, train_loader, test_loader, cfg, device, log)
    every_length = padded_lengths(cfg.dataset.max_length, cfg.train.pad_to_multiple_of)
    plan = warmup_plan or WarmupPlan(cfg.train.batch_size, cfg.train.eval_batch_size, every_length, every_length)
    # The events' order, written here only and part of the measurement: start events call the
    # objects in this order, end events in reverse (train/state.py: Events). So the profiler,
    # layer timing and after_training run last at run end, after evaluation; the optimizer exists
    # before the warm-up's first update and step graphs; the collectors start last before the
    # window's clock and stop first after it; the lr is set right before each step.
    events = Events([*outermost, Profiler(profile_dir), LayerTiming(), AfterTraining(after_training), FreezingSchedule(),
                     CompileWarmup(plan), run.step, Evaluation(), ProgressBar(), NonFiniteCheck(), RanksTogether(),
                     CompileEventCount(), Collectors(collectors), LrSchedule(cfg.optimizer), *callbacks])
    with dynamo_settings(cfg, len(plan.train_lengths) + len(plan.eval_lengths)):
        return loop(run, events)


def _prepare(model: torch.nn.Module, train_loader: Any, test_loader: Any, cfg: RunConfig, device: torch.device,
             log: Callable[[str], None]) -> Run:
    """The model on the device and wrapped (DDP, torch.compile), its forward, the step, and the step counts."""
    precision = Precision(cfg.precision, device)
    accumulation = Accumulation(cfg)
    k = accumulation.first  # adaptive: accumulation_max, the window's largest
    model.to(device)
    swapped = precision.prepare(model)  # fp8: the Linear layers swapped for torchao's (before compile)
    if swapped:
        log(swapped)
    if half_params(cfg, optimizer_class(cfg.optimizer)):
        # encoder=fused's mixed-precision update: the parameters live in the autocast dtype and the
        # optimizer keeps their fp32 masters in its flat buffers, so no weight is cast per step.
        model.to(precision.dtype)
        log(f"parameters in {precision.dtype}, fp32 master weights in optimizer={cfg.optimizer.name}'s buffers")
    apply_checkpointing(model, cfg.train.gradient_checkpointing)
    warm_up_device(device)
    result = TrainResult(device_ready_at=time.time())
    parallel = data_parallel(model, device)
    forward = Forward.for_run(cfg, model, compile_model(parallel or model, cfg), precision, device)
    no_sync = parallel.no_sync if parallel is not None else nullcontext
    # The linear scaling rule counts the global batch: per-rank batch x accumulation x ranks.
    base_lr = scaled_lr(cfg.optimizer, cfg.train.batch_size * k * distributed.world_size())
    step = Step(cfg, forward, no_sync, accumulation, result, base_lr)
    # adaptive: windows have at least 2 micro-batches, so ceil(len/2) bounds the steps; the
    # schedule then runs over micro-batches, the one count known in advance.
    steps_per_epoch = math.ceil(len(train_loader) / (2 if accumulation.adaptive else k))
    if cfg.train.max_steps_per_epoch:
        steps_per_epoch = min(steps_per_epoch, cfg.train.max_steps_per_epoch)
    total_steps = cfg.train.epochs * (len(train_loader) if accumulation.adaptive else steps_per_epoch)
    result.compiled_anything = compiles_anything(cfg, device.type)
    return Run(cfg, device, log, model, parallel, train_loader, test_loader, step, accumulation, result,
               steps_per_epoch, total_steps)
