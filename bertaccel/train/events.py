"""What the training loop (train.loop) is not: each concern one small event object (the
protocol: train/state.py's `Callback`), each with its own state. Which objects the loop calls,
and in what order, is written once: the list in train/loop.py's `train`.
"""
from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Callable, Dict, List, NoReturn, Optional

import torch
from tqdm.auto import tqdm

from bertaccel import distributed
from bertaccel.config import OptimizerConfig
from bertaccel.attention.warmup import reset_kernel_caches
from bertaccel.measure import layer_timing
from bertaccel.measure.collectors import CollectorSet
from bertaccel.measure.flops import TokenCounts
from bertaccel.measure.profiling import profile_steps
from bertaccel.options.compile import compiles, uses_cuda_graphs
from bertaccel.attention.option import jit_compiles
from bertaccel.encoder.option import is_fused
from bertaccel.options.freezing import apply_freezing, freezes
from bertaccel.options.optimizer import lr_factor, set_lr
from bertaccel.train.forward import Forward, real_rows
from bertaccel.train.state import Callback, Run, Window, sync
from bertaccel.train.step import uses_triton, windows
from bertaccel.train.warmup import (WarmupPlan, compile_events, compiled_graph_count, new_events, run_warmup,
                                    warm_first_update)

LAYER_TIMING_STEPS = 10  # timed forward+backward passes for layer_timing (after one untimed)


class NonFiniteLoss(RuntimeError):
    pass


class CompileWarmup(Callback):
    """Everything the loop will run, for every shape, compiled before the first window; its wall
    clock is compile_time_s. Step graphs are captured at the first epoch's start (they need the
    optimizer) and count in it too. At run end: the dynamo graphs this run compiled.
    plan: the shapes to compile (the caller's; a CUDA-graph run works on a copy)."""

    def __init__(self, plan: WarmupPlan):
        self.plan = plan
        self.graphs_at_start = 0  # dynamo's counters outlive torch.compiler.reset()

    def run_start(self, run: Run) -> None:
        cfg, result = run.cfg, run.result
        self.graphs_at_start = compiled_graph_count()
        if result.compiled_anything:
            reset_kernel_caches()  # this run loads or compiles its own Triton variants
            if uses_cuda_graphs(cfg.compile.mode):
                # CUDA-graph trees: warm-up call, recording call, first replay (a copy: the
                # caller's plan is not changed under it).
                self.plan = dataclasses.replace(self.plan, repeats=3)
            result.compile_time_s = run_warmup(run.model, self.plan, run.step.micro, run.step.eval_forward, run.device)
            dynamic = " (length dynamic)" if run.step.forward.dynamic_length else ""
            what = [f"torch.compile mode={cfg.compile.mode}{dynamic}"] if compiles(cfg.compile) else []
            what += ["our Triton kernels (attention, fused encoder)"] if uses_triton(cfg, run.device.type) else []
            what += ["CUDA graphs of the whole step per length"] if cfg.compile.step_graph else []
            result.compile_time_source = (f"wall clock of the warm-up before the first training window "
                                          f"({' + '.join(what)}): {self.plan.describe()}")
        elif warms_up(run):
            # Nothing to compile, but first uses cost: the caching allocator grows to the longest
            # batch (cudaMalloc), cuBLAS and SDPA pick their kernels per shape, and under data
            # parallel NCCL creates its communicators on the first all-reduce and DDP rebuilds its
            # gradient buckets in the second forward (measured on 2 H200s: 0.45 s of a 4.4 s window
            # went to such first-step costs). Eager steps at the longest lengths pay them before the
            # window, as the plain loop a run is compared with pays them in its warm-up steps. The
            # optimizer's first step is warmed at epoch_start (it needs the optimizer).
            parallel = run.parallel is not None
            eager = WarmupPlan(cfg.train.batch_size, cfg.train.eval_batch_size, self.plan.train_lengths[-1:],
                               [] if parallel else self.plan.eval_lengths[-1:], repeats=2 if parallel else 1)
            result.compile_time_s = run_warmup(run.model, eager, run.step.micro, run.step.eval_forward, run.device)
            warm_up = ("data-parallel warm-up before the first window (NCCL/gloo communicators, DDP bucket rebuild, "
                       if parallel else "eager warm-up before the first window (")
            result.compile_time_source = (f"nothing compiled (compile=off); wall clock of the {warm_up}the allocator "
                                          f"grown to the longest batch, per-shape kernel choices): {eager.describe()}")
        else:
            result.compile_time_source = (f"nothing compiled (compile=off, attention={cfg.attention.name}"
                                          f"{' on CPU: interpreter' if jit_compiles(cfg.attention) or is_fused(cfg.encoder) else ''})")

    def epoch_start(self, run: Run, epoch: int) -> None:
        step = run.step
        if epoch == 0 and warms_up(run) and not run.cfg.compile.step_graph:
            # The optimizer's first step, before the first window and counted in compile_time_s
            # (the step-graph capture below runs it eagerly anyway); then a fresh optimizer.
            params: List[torch.Tensor] = [p for p in run.model.parameters() if p.requires_grad]
            run.result.compile_time_s += warm_first_update(step.update, params, step.precision.scaler, run.device)
            step.renew_optimizer()
            run.result.compile_time_source += ("; then the optimizer's first update on zero gradients, undone "
                                               "(its kernels compiled or loaded, its buffers allocated)")
        if run.cfg.compile.step_graph and step.graphs is None:
            # Part of the warm-up (its time counts in compile_time_s), before the first window.
            t_capture = time.perf_counter()
            step.capture_graphs(self.plan.train_rows, self.plan.train_lengths)
            run.result.compile_time_s += time.perf_counter() - t_capture

    def run_end(self, run: Run) -> None:
        if compiles(run.cfg.compile):
            run.result.compile_graphs = compiled_graph_count() - self.graphs_at_start


def warms_up(run: Run) -> bool:
    """Runs with first-use costs to pay before the first window: anything compiled, data parallel
    (communicators, DDP's bucket rebuild), any GPU run (allocator, per-shape kernel choices). A
    plain CPU run has none worth a warm-up."""
    return run.result.compiled_anything or run.parallel is not None or run.device.type == "cuda"


class FreezingSchedule(Callback):
    """Per epoch: the freezing schedule's trainable layers, and the optimizer (re)built over them."""

    def epoch_start(self, run: Run, epoch: int) -> None:
        cfg = run.cfg
        apply_freezing(run.model, cfg.freezing.name, epoch)
        if run.step.optimizer is None or freezes(cfg.freezing):
            # Rebuilt over the parameters trainable this epoch (seed 000, section 3.2).
            run.step.renew_optimizer()


class LrSchedule(Callback):
    """Each step's learning rate, set before the step (adaptive: over micro-batches, the one
    count known in advance), as a factor of the step's base lr (the linear scaling rule's)."""

    def __init__(self, optimizer_cfg: OptimizerConfig):
        # Read per step, so plain values: an OmegaConf attribute costs ~20 Python calls, which a
        # plain loop does not pay (tests/test_host_work.py counts them).
        o = optimizer_cfg
        self.schedule, self.warmup_ratio, self.min_lr_ratio = str(o.schedule), float(o.warmup_ratio), float(o.min_lr_ratio)

    def step_start(self, run: Run, win: Window) -> None:
        done = run.micro_batches_done if run.accumulation.adaptive else run.global_step
        factor = lr_factor(self.schedule, done, run.total_steps, self.warmup_ratio, self.min_lr_ratio)
        lr_now = run.step.base_lr * factor
        run.result.lr_per_step.append(lr_now)
        set_lr(run.step.optimizer, lr_now)


class NonFiniteCheck(Callback):
    """A NaN/inf training loss stops the run: checked every log_every_steps (the host sync the
    bar shares) and over the whole epoch before evaluation."""

    def step_end(self, run: Run, win: Window) -> None:
        if run.log_due(win):
            mean_loss = win.mean_loss()
            if not math.isfinite(mean_loss):
                raise NonFiniteLoss(f"non-finite training loss ({mean_loss}) by optimizer step "
                                    f"{run.global_step} (epoch {win.epoch + 1})")

    def epoch_end(self, run: Run, win: Window) -> None:
        epoch_loss = win.epoch_loss()
        if not math.isfinite(epoch_loss):
            raise NonFiniteLoss(f"non-finite training loss ({epoch_loss}) in epoch {win.epoch + 1}")


class ProgressBar(Callback):
    """One tqdm bar per window, on rank 0 only (one bar per job, not per rank)."""

    def __init__(self) -> None:
        self.bar: Optional[tqdm[NoReturn]] = None  # (a bar of counts, over no iterable)

    def window_start(self, run: Run, win: Window) -> None:
        epochs = run.cfg.train.epochs
        self.bar = tqdm(total=None if run.accumulation.adaptive else run.steps_per_epoch,
                        desc=f"epoch {win.epoch + 1}/{epochs}", unit="step", dynamic_ncols=True, mininterval=1.0,
                        disable=distributed.rank() != 0)

    def step_end(self, run: Run, win: Window) -> None:
        if run.log_due(win):
            # One host sync every few steps (win.mean_loss, shared with the NaN check), not every step.
            self.window_bar().set_postfix(loss=f"{win.mean_loss():.4f}",
                                          samples_s=f"{win.samples / win.elapsed_s():.1f}")
        self.window_bar().update(1)

    def window_end(self, run: Run, win: Window) -> None:
        self.window_bar().close()

    def window_bar(self) -> tqdm[NoReturn]:
        """The window's bar (window_start opens one for every window)."""
        if self.bar is None:
            raise RuntimeError("ProgressBar: no bar open (window_start opens it)")
        return self.bar


class RanksTogether(Callback):
    """Data parallel at the window's edges: every rank enters it together on an idle device,
    and after it the figures are the whole job's (nothing but the device sync in a 1-process run)."""

    def window_start(self, run: Run, win: Window) -> None:
        distributed.start_together(run.device)
        sync(run.device)

    def epoch_end(self, run: Run, win: Window) -> None:
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
        self.before: Dict[str, int] = {}  # compile events by kind at the window's start

    def window_start(self, run: Run, win: Window) -> None:
        self.before = compile_events(run.device)

    def epoch_end(self, run: Run, win: Window) -> None:
        in_window = new_events(self.before, compile_events(run.device))
        win.compiles_in_window = sum(in_window.values())
        if win.compiles_in_window:
            kinds = ", ".join(f"{n} {kind}" for kind, n in in_window.items())
            run.log(f"warning: {win.compiles_in_window} compile(s) inside the training window of epoch "
                    f"{win.epoch + 1} ({kinds}): its time includes compilation (a shape the warm-up did not cover)")


class Collectors(Callback):
    """The telemetry collectors (energy, GPU activity) measure the training window only (stopped
    also when a step raised: no sampler is left running)."""

    def __init__(self, collectors: CollectorSet):
        self.collectors = collectors

    def window_start(self, run: Run, win: Window) -> None:
        self.collectors.start()

    def window_end(self, run: Run, win: Window) -> None:
        self.collectors.stop()


class Evaluation(Callback):
    """Test accuracy after each epoch's window, on its own clock (eval_time_s; the thesis
    excludes it from training time too)."""

    def epoch_end(self, run: Run, win: Window) -> None:
        # Compiles are counted here as around the window: a compiled run's warm-up covers the
        # evaluation shapes, so none should land in eval_time_s (on an H200 a compiled run's
        # evaluation once took 4.6 s against 0.1 s eager, with no word of why).
        before = compile_events(run.device)
        t1 = time.perf_counter()
        win.test_accuracy = run.step.evaluate(run.test_loader)
        sync(run.device)
        win.eval_time_s = time.perf_counter() - t1
        in_eval = new_events(before, compile_events(run.device))
        win.compiles_in_eval = sum(in_eval.values())
        if win.compiles_in_eval:
            kinds = ", ".join(f"{n} {kind}" for kind, n in in_eval.items())
            run.log(f"warning: {win.compiles_in_eval} compile(s) inside the evaluation of epoch {win.epoch + 1} "
                    f"({kinds}): eval_time_s includes compilation (a shape the warm-up did not cover)")


class AfterTraining(Callback):
    """The caller's after_training (job.py reads peak memory there), at run end."""

    def __init__(self, after_training: Optional[Callable[[], None]]):
        self.after_training = after_training

    def run_end(self, run: Run) -> None:
        if self.after_training is not None:
            self.after_training()


class LayerTiming(Callback):
    """layer_timing=true: per-layer backward and all-reduce times (layer_timing.py)."""

    def run_end(self, run: Run) -> None:
        if not run.cfg.layer_timing:
            return
        # After the last evaluation, on the eager model (hooks do not survive compile or
        # CUDA graphs): the run's forward and loss through it, the batch's mean over its data
        # rows; forward+backward only, the weights are not changed.
        forward: Forward = run.step.forward.through(run.parallel or run.model)  # (Run.step is typed Any)

        def timing_loss(host_batch: Dict[str, torch.Tensor]) -> torch.Tensor:
            return forward.loss(forward.inputs(host_batch), real_rows(host_batch))

        run.result.backprop = layer_timing.measure(run.model, timing_loss, run.train_loader, run.device,
                                                   LAYER_TIMING_STEPS, parallel=run.parallel)


class Profiler(Callback):
    """profile=true: a torch.profiler window of the run's own step (profiling.py)."""

    def __init__(self, profile_dir: Optional[Path]):
        self.profile_dir = profile_dir

    def run_end(self, run: Run) -> None:
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
