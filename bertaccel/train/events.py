"""What the training loop (train.loop) is not: each concern one small object on named events.

The loop calls, for each run, epoch, window and step (`Events` keeps the order fixed):

    run_start                          warm-up / compile (CompileWarmup)
    for each epoch:
        epoch_start                    freezing + optimizer (FreezingSchedule), step graphs
                                       (CompileWarmup), trainable parameters (train.Step)
        window_start                   untimed: phase clock (Step), bar, ranks meet and the device
                                       goes idle (RanksTogether), compile count, collectors start
        -- the window's clock starts (train.Window.open) --
        for each optimizer step:
            step_start                 the lr of this step (LrSchedule)
            (the step itself: train.Step; adaptive k is read inside it)
            step_end                   NaN check, then the bar (every log_every_steps)
        -- the clock stops after a device sync (train.Window.close) --
        window_end                     untimed, also when a step raised: collectors stop, bar
                                       closes, the phase clock is handed to the window (Step)
        epoch_end                      compile count, whole-job figures, epoch NaN check,
                                       evaluation (its own clock)
    run_end                            compile graph count, after_training, layer timing, profiler

Start events (run_start, epoch_start, window_start, step_start) call the objects in list order;
end events call them in reverse, so each object's end nests inside its start as with-blocks do
(collectors start last before the clock and stop first after it; the bar opens before and
closes after them). `train.train` builds the list; its order is part of the measurement.
Nothing here runs between Window.open and Window.close except step_start and step_end.
"""
from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from bertaccel import distributed
from bertaccel.attention.warmup import reset_kernel_caches
from bertaccel.measure import layer_timing
from bertaccel.measure.collectors import CollectorSet
from bertaccel.measure.flops import TokenCounts
from bertaccel.measure.profiling import profile_steps
from bertaccel.options.freezing import apply_freezing
from bertaccel.options.optimizer import build_optimizer, lr_factor, set_lr
from bertaccel.train.step import _sync, model_inputs, windows
from bertaccel.train.step_graph import StepGraphs
from bertaccel.train.warmup import (IGNORE_INDEX, WarmupPlan, compile_events, compiled_graph_count, new_events,
                                    run_warmup, warm_first_update)

if TYPE_CHECKING:
    from bertaccel.train.loop import Run, Window

LAYER_TIMING_STEPS = 10  # timed forward+backward passes for layer_timing (after one untimed)


class NonFiniteLoss(RuntimeError):
    pass


class Callback:
    """The events of the loop; an object overrides the hooks it needs (the rest do nothing)."""

    def run_start(self, run: "Run") -> None: ...

    def epoch_start(self, run: "Run", epoch: int) -> None: ...

    def window_start(self, run: "Run", win: "Window") -> None: ...

    def step_start(self, run: "Run", win: "Window") -> None: ...

    def step_end(self, run: "Run", win: "Window") -> None: ...

    def window_end(self, run: "Run", win: "Window") -> None: ...

    def epoch_end(self, run: "Run", win: "Window") -> None: ...

    def run_end(self, run: "Run") -> None: ...


FORWARD = ("run_start", "epoch_start", "window_start", "step_start")  # called in list order
REVERSE = ("step_end", "window_end", "epoch_end", "run_end")           # called in reverse


class Events:
    """Calls the hooks: start events in list order, end events in reverse (module docstring)."""

    def __init__(self, objects: Sequence[Callback]):
        self.objects = list(objects)
        # Per hook, the bound methods of the objects that define it, in calling order: the base
        # class's empty hooks are not called (per step they were ~24 Python calls of the ~108 the
        # loop adds to a plain loop's; tests/test_host_work.py).
        self.hooks = {name: [getattr(o, name) for o in (self.objects if name in FORWARD else reversed(self.objects))
                             if getattr(type(o), name) is not getattr(Callback, name)]
                      for name in (*FORWARD, *REVERSE)}

    def _forward(self, hook: str, *args) -> None:
        for call in self.hooks[hook]:
            call(*args)

    _reverse = _forward  # the order is in self.hooks

    def run_start(self, run): self._forward("run_start", run)
    def epoch_start(self, run, epoch): self._forward("epoch_start", run, epoch)
    def window_start(self, run, win): self._forward("window_start", run, win)
    def step_start(self, run, win): self._forward("step_start", run, win)
    def step_end(self, run, win): self._reverse("step_end", run, win)
    def window_end(self, run, win): self._reverse("window_end", run, win)
    def epoch_end(self, run, win): self._reverse("epoch_end", run, win)
    def run_end(self, run): self._reverse("run_end", run)


class CompileWarmup(Callback):
    """Everything the loop will run, for every shape, compiled before the first window; its wall
    clock is compile_time_s. Step graphs are captured at the first epoch's start (they need the
    optimizer) and count in it too. At run end: the dynamo graphs this run compiled."""

    def run_start(self, run: "Run") -> None:
        cfg, result = run.cfg, run.result
        if result.compiled_anything:
            reset_kernel_caches()  # this run loads or compiles its own Triton variants
            if run.cuda_graphs:
                # CUDA-graph trees: warm-up call, recording call, first replay (a copy: the
                # caller's plan is not changed under it).
                run.plan = dataclasses.replace(run.plan, repeats=3)
            result.compile_time_s = run_warmup(run.model, run.plan, run.step.micro, run.step.eval_forward, run.device)
            what = [f"torch.compile mode={cfg.compile.mode}" + (" (length dynamic)" if run.step.dynamic_length else "")
                    ] if cfg.compile.mode != "off" else []
            what += ["our Triton kernels (attention, fused encoder)"] if run.has_triton else []
            what += ["CUDA graphs of the whole step per length"] if cfg.compile.step_graph else []
            result.compile_time_source = (f"wall clock of the warm-up before the first training window "
                                          f"({' + '.join(what)}): {run.plan.describe()}")
        elif warms_up(run):
            # Nothing to compile, but first uses cost: the caching allocator grows to the longest
            # batch (cudaMalloc), cuBLAS and SDPA pick their kernels per shape, and under data
            # parallel NCCL creates its communicators on the first all-reduce and DDP rebuilds its
            # gradient buckets in the second forward (measured on 2 H200s: 0.45 s of a 4.4 s window
            # went to such first-step costs). Eager steps at the longest lengths pay them before the
            # window, as the plain loop a run is compared with pays them in its warm-up steps. The
            # optimizer's first step is warmed at epoch_start (it needs the optimizer).
            parallel = run.parallel is not None
            eager = WarmupPlan(cfg.train.batch_size, cfg.train.eval_batch_size, run.plan.train_lengths[-1:],
                               [] if parallel else run.plan.eval_lengths[-1:], repeats=2 if parallel else 1)
            result.compile_time_s = run_warmup(run.model, eager, run.step.micro, run.step.eval_forward, run.device)
            what = ("data-parallel warm-up before the first window (NCCL/gloo communicators, DDP bucket rebuild, "
                    if parallel else "eager warm-up before the first window (")
            result.compile_time_source = (f"nothing compiled (compile=off); wall clock of the {what}the allocator "
                                          f"grown to the longest batch, per-shape kernel choices): {eager.describe()}")
        else:
            result.compile_time_source = (f"nothing compiled (compile=off, attention={cfg.attention.name}"
                                          f"{' on CPU: interpreter' if cfg.attention.swap == 'triton' or cfg.encoder.layer == 'fused' else ''})")

    def epoch_start(self, run: "Run", epoch: int) -> None:
        step = run.step
        if epoch == 0 and warms_up(run) and not run.cfg.compile.step_graph:
            # The optimizer's first step, before the first window and counted in compile_time_s
            # (the step-graph capture below runs it eagerly anyway); then a fresh optimizer.
            params = [p for p in run.model.parameters() if p.requires_grad]
            run.result.compile_time_s += warm_first_update(step.update, params, step.precision.scaler, run.device)
            step.optimizer = new_optimizer(run)
            run.result.compile_time_source += ("; then the optimizer's first update on zero gradients, undone "
                                               "(its kernels compiled or loaded, its buffers allocated)")
        if run.cfg.compile.step_graph and step.graphs is None:
            # Part of the warm-up (its time counts in compile_time_s), before the first window.
            t_capture = time.perf_counter()
            step.graphs = StepGraphs(step.step_model, run.model, step.optimizer, step.precision.autocast,
                                     step.attention_ctx, run.cfg.optimizer.max_grad_norm, run.device,
                                     step.drop_full_mask)
            step.graphs.capture(run.plan.train_rows, run.plan.train_lengths)
            run.result.compile_time_s += time.perf_counter() - t_capture

    def run_end(self, run: "Run") -> None:
        if run.cfg.compile.mode != "off":
            run.result.compile_graphs = compiled_graph_count() - run.graphs_at_start


def warms_up(run: "Run") -> bool:
    """Runs with first-use costs to pay before the first window: anything compiled, data parallel
    (communicators, DDP's bucket rebuild), any GPU run (allocator, per-shape kernel choices). A
    plain CPU run has none worth a warm-up."""
    return run.result.compiled_anything or run.parallel is not None or run.device.type == "cuda"


class FreezingSchedule(Callback):
    """Per epoch: the freezing schedule's trainable layers, and the optimizer (re)built over them."""

    def epoch_start(self, run: "Run", epoch: int) -> None:
        cfg = run.cfg
        apply_freezing(run.model, cfg.freezing.name, epoch)
        if run.step.optimizer is None or cfg.freezing.name != "none":
            # Rebuilt over the parameters trainable this epoch (seed 000, section 3.2).
            run.step.optimizer = new_optimizer(run)


def new_optimizer(run: "Run") -> torch.optim.Optimizer:
    """The run's optimizer over the parameters trainable now, with fresh state."""
    return build_optimizer(run.model, run.cfg.optimizer, capturable=run.cfg.compile.step_graph, lr=run.base_lr)


class LrSchedule(Callback):
    """Each step's learning rate, set before the step (adaptive: over micro-batches, the one
    count known in advance)."""

    def step_start(self, run: "Run", win: "Window") -> None:
        schedule, warmup_ratio, min_lr_ratio = run.lr_schedule
        done = run.micro_batches_done if run.accumulation.adaptive else run.global_step
        lr_now = run.base_lr * lr_factor(schedule, done, run.total_steps, warmup_ratio, min_lr_ratio)
        run.result.lr_per_step.append(lr_now)
        set_lr(run.step.optimizer, lr_now)


class NonFiniteCheck(Callback):
    """A NaN/inf training loss stops the run: checked every log_every_steps (the host sync the
    bar shares) and over the whole epoch before evaluation."""

    def step_end(self, run: "Run", win: "Window") -> None:
        if run.log_due(win):
            mean_loss = win.mean_loss()
            if not math.isfinite(mean_loss):
                raise NonFiniteLoss(f"non-finite training loss ({mean_loss}) by optimizer step "
                                    f"{run.global_step} (epoch {win.epoch + 1})")

    def epoch_end(self, run: "Run", win: "Window") -> None:
        epoch_loss = win.epoch_loss()
        if not math.isfinite(epoch_loss):
            raise NonFiniteLoss(f"non-finite training loss ({epoch_loss}) in epoch {win.epoch + 1}")


class ProgressBar(Callback):
    """One tqdm bar per window, on rank 0 only (one bar per job, not per rank)."""

    def __init__(self) -> None:
        self.bar: Optional[tqdm] = None

    def window_start(self, run: "Run", win: "Window") -> None:
        epochs = run.cfg.train.epochs
        self.bar = tqdm(total=None if run.accumulation.adaptive else run.steps_per_epoch,
                        desc=f"epoch {win.epoch + 1}/{epochs}", unit="step", dynamic_ncols=True, mininterval=1.0,
                        disable=distributed.rank() != 0)

    def step_end(self, run: "Run", win: "Window") -> None:
        if run.log_due(win):
            # One host sync every few steps (win.mean_loss, shared with the NaN check), not every step.
            self.bar.set_postfix(loss=f"{win.mean_loss():.4f}", samples_s=f"{win.samples / win.elapsed_s():.1f}")
        self.bar.update(1)

    def window_end(self, run: "Run", win: "Window") -> None:
        self.bar.close()


class RanksTogether(Callback):
    """Data parallel at the window's edges: every rank enters it together on an idle device,
    and after it the figures are the whole job's (nothing but the device sync in a 1-process run)."""

    def window_start(self, run: "Run", win: "Window") -> None:
        distributed.start_together(run.device)
        _sync(run.device)

    def epoch_end(self, run: "Run", win: "Window") -> None:
        if not distributed.active():
            return
        # Whole-job figures: the slowest rank's window, every rank's samples and tokens.
        (win.train_time_s,) = distributed.max_across([win.train_time_s], run.device)
        t = win.tokens
        totals = distributed.sum_across([float(win.loss_sum), win.samples, t.sequences, t.padded_tokens,
                                         t.real_tokens, t.attention_pairs, t.real_attention_pairs,
                                         t.split_attention_pairs], run.device)
        win.loss_sum, win.samples = torch.tensor(totals[0]), int(totals[1])
        win.tokens = TokenCounts(*(int(v) for v in totals[2:]))


class CompileEventCount(Callback):
    """Compile events (dynamo graphs, Triton variants, CUDA-graph recordings) counted across the
    window: the warm-up should leave none to happen inside it; any that do are logged."""

    def __init__(self) -> None:
        self.before: dict = {}

    def window_start(self, run: "Run", win: "Window") -> None:
        self.before = compile_events(run.device)

    def epoch_end(self, run: "Run", win: "Window") -> None:
        in_window = new_events(self.before, compile_events(run.device))
        win.compiles_in_window = sum(in_window.values())
        if win.compiles_in_window:
            kinds = ", ".join(f"{n} {kind}" for kind, n in in_window.items())
            run.log(f"warning: {win.compiles_in_window} compile(s) inside the training window of epoch "
                    f"{win.epoch + 1} ({kinds}): its time includes compilation (a shape the warm-up did not cover)")


class Collectors(Callback):
    """The telemetry collectors (energy, GPU activity) measure the training window only: started
    last before its clock starts, stopped first after it stops (also when a step raised: no
    sampler is left running)."""

    def __init__(self, collectors: CollectorSet):
        self.collectors = collectors

    def window_start(self, run: "Run", win: "Window") -> None:
        self.collectors.start()

    def window_end(self, run: "Run", win: "Window") -> None:
        self.collectors.stop()


class Evaluation(Callback):
    """Test accuracy after each epoch's window, on its own clock (eval_time_s; the thesis
    excludes it from training time too)."""

    def epoch_end(self, run: "Run", win: "Window") -> None:
        # Compiles are counted here as around the window: a compiled run's warm-up covers the
        # evaluation shapes, so none should land in eval_time_s (on an H200 a compiled run's
        # evaluation once took 4.6 s against 0.1 s eager, with no word of why).
        before = compile_events(run.device)
        t1 = time.perf_counter()
        win.test_accuracy = run.step.evaluate(run.test_loader)
        _sync(run.device)
        win.eval_time_s = time.perf_counter() - t1
        in_eval = new_events(before, compile_events(run.device))
        win.compiles_in_eval = sum(in_eval.values())
        if win.compiles_in_eval:
            kinds = ", ".join(f"{n} {kind}" for kind, n in in_eval.items())
            run.log(f"warning: {win.compiles_in_eval} compile(s) inside the evaluation of epoch {win.epoch + 1} "
                    f"({kinds}): eval_time_s includes compilation (a shape the warm-up did not cover)")


class AfterTraining(Callback):
    """The caller's after_training (job.py reads peak memory there): after the last evaluation,
    before layer timing and the profiler."""

    def __init__(self, after_training: Optional[Callable[[], None]]):
        self.after_training = after_training

    def run_end(self, run: "Run") -> None:
        if self.after_training is not None:
            self.after_training()


class LayerTiming(Callback):
    """layer_timing=true: per-layer backward and all-reduce times (layer_timing.py)."""

    def run_end(self, run: "Run") -> None:
        if not run.cfg.layer_timing:
            return
        step = run.step
        # After the last evaluation, on the eager model (hooks do not survive compile or
        # CUDA graphs); forward+backward only, the weights are not changed.

        def timing_loss(host_batch):
            batch = model_inputs(host_batch, run.device, step.drop_full_mask)
            with step.precision.autocast(), step.attention_ctx():
                logits = (run.parallel or run.model)(input_ids=batch["input_ids"],
                                                     attention_mask=batch["attention_mask"]).logits
            return F.cross_entropy(logits.float(), batch["labels"], ignore_index=IGNORE_INDEX)

        run.result.backprop = layer_timing.measure(run.model, timing_loss, run.train_loader, run.device,
                                                   LAYER_TIMING_STEPS, parallel=run.parallel)


class Profiler(Callback):
    """profile=true: a torch.profiler window of the run's own step (profiling.py)."""

    def __init__(self, profile_dir: Optional[Path]):
        self.profile_dir = profile_dir

    def run_end(self, run: "Run") -> None:
        if not run.cfg.profile:
            return
        # After the last evaluation: its extra steps change weights nobody reads any more.
        pw = run.cfg.profile_window
        try:
            run.result.profile = profile_steps(run.step, windows(run.train_loader, run.accumulation.first), run.device,
                                               pw.warmup_steps, pw.active_steps, self.profile_dir or Path("profile"),
                                               pw.top_k)
        except Exception as e:  # noqa: BLE001 - a failed profile costs the profile, not the run
            run.result.profile_error = f"{type(e).__name__}: {e}"
            run.log(f"profile failed: {run.result.profile_error}")
