"""The training core: one loop that every option changes by argument, never by shape.

Per epoch: apply the freezing schedule, (re)build the optimizer, run accumulation windows of
`accumulation` micro-batches, then evaluate on the test split. Only the training window is
timed into train_time_s, and only it is measured by the collectors (energy, GPU activity);
evaluation has its own clock (the thesis excludes it too). An optional profiler window runs
after the last evaluation (profiling.py).
"""
from __future__ import annotations

import dataclasses
import math
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from . import distributed, layer_timing
from .adaptive_accumulation import GradVariance, next_k
from .attention.warmup import reset_kernel_caches
from .checkpointing import apply_checkpointing
from .config import uses_cuda_graphs
from .collectors import CollectorSet
from .flops import TokenCounts, bert_train_flops
from .freezing import apply_freezing, count_trainable
from .isolation import warm_up_device
from .optim import build_optimizer, lr_factor, scaled_lr, set_lr
from .precision import Precision
from .profiling import KernelProfile, profile_steps
from .step_clock import PhaseClock, StepClock, steady_median_ms, steady_phase_medians
from .step import (_sync, accumulate_window, compile_model, data_parallel, dynamo_settings, eval_batch, evaluate,
                   mark_length_dynamic, model_inputs, real_rows, sdpa_backends, windows)
from .step_graph import StepGraphs
from .warmup import (IGNORE_INDEX, WarmupPlan, compile_events, compiled_graph_count, new_events, padded_lengths,
                     run_warmup)


LAYER_TIMING_STEPS = 10  # timed forward+backward passes for layer_timing (after one untimed)


class NonFiniteLoss(RuntimeError):
    pass


@dataclass
class EpochStats:
    epoch: int
    train_loss: float
    test_accuracy: float
    trainable_params: int
    train_time_s: float
    eval_time_s: float
    optimizer_steps: int
    samples: int
    tokens: TokenCounts = field(default_factory=TokenCounts)
    model_flops: float = 0.0                  # analytic, flops.py
    window_unix: Tuple[float, float] = (0.0, 0.0)  # time.time() at the training window's edges
    step_ms: List[float] = field(default_factory=list)  # per optimizer step (step_clock.py)
    compiles_in_window: int = 0               # compile events counted inside the window (must be 0)
    phase_ms: List[dict] = field(default_factory=list)  # per step {forward_ms, backward_ms, optimizer_ms}


@dataclass
class TrainResult:
    epochs: List[EpochStats] = field(default_factory=list)
    compile_graphs: Optional[int] = None
    first_step_started_at: Optional[float] = None  # time.time() as the first window began
    device_ready_at: Optional[float] = None        # time.time() once the model is on the device, CUDA started
    first_window_opened_at: Optional[float] = None  # time.time() as the first window's clock started
    profile: Optional[KernelProfile] = None
    profile_error: Optional[str] = None
    backprop: Optional[layer_timing.BackpropTiming] = None  # layer_timing=true
    lr_per_step: List[float] = field(default_factory=list)  # the lr each optimizer step used
    accumulation_k: List[int] = field(default_factory=list)  # accumulation=adaptive: k per step
    grad_variance: List[Optional[float]] = field(default_factory=list)  # and sigma^2 (eq. 7) per step
    compile_time_s: float = 0.0               # warm-up before the first window (warmup.py)
    compile_time_source: str = "nothing compiled"
    compiled_anything: bool = False           # whether the run has compiled/JIT paths at all
    last_window_end_unix: Optional[float] = None

    @property
    def step_time_ms(self) -> Optional[float]:
        return steady_median_ms([e.step_ms for e in self.epochs])

    @property
    def phase_ms(self) -> Dict[str, Optional[float]]:
        """Steady-state medians of forward_ms, backward_ms, optimizer_ms (None: no phases were
        marked, i.e. step graphs, which replay the whole step as one)."""
        windows = [e.phase_ms for e in self.epochs if e.phase_ms and any(e.phase_ms[0].values())]
        return steady_phase_medians(windows) if windows else dict.fromkeys(("forward_ms", "backward_ms", "optimizer_ms"))

    @property
    def recompiles_in_window(self) -> int:
        return sum(e.compiles_in_window for e in self.epochs)

    @property
    def model_flops(self) -> float:
        return sum(e.model_flops for e in self.epochs)

    @property
    def tokens(self) -> TokenCounts:
        total = TokenCounts()
        for e in self.epochs:
            total += e.tokens
        return total

    @property
    def train_time_s(self) -> float:
        return sum(e.train_time_s for e in self.epochs)

    @property
    def eval_time_s(self) -> float:
        return sum(e.eval_time_s for e in self.epochs)

    @property
    def test_accuracy(self) -> float:
        return self.epochs[-1].test_accuracy

    @property
    def optimizer_steps(self) -> int:
        return sum(e.optimizer_steps for e in self.epochs)

    @property
    def samples(self) -> int:
        return sum(e.samples for e in self.epochs)


def train(model: torch.nn.Module, train_loader: Any, test_loader: Any, cfg: Any,
          device: torch.device, log: Callable[[str], None] = print,
          collectors: Optional[CollectorSet] = None, profile_dir: Optional[Path] = None,
          after_training: Optional[Callable[[], None]] = None,
          warmup_plan: Optional[WarmupPlan] = None) -> TrainResult:
    """collectors: started/stopped around each training window. after_training: called after
    the last evaluation, before the optional profiler window (cfg.profile), which writes its
    trace to profile_dir. warmup_plan: the shapes to compile before the first window (job.py
    builds it from the data); None = derive the lengths from max_length (every multiple)."""
    collectors = collectors or CollectorSet()
    precision = Precision(cfg.precision, device)
    attention_ctx = sdpa_backends(cfg)
    adaptive = cfg.accumulation == "adaptive"
    # adaptive: the first window has accumulation_max micro-batches, later ones what eq. 6 says.
    k = cfg.accumulation_max if adaptive else cfg.accumulation
    next_window_k = [k]
    model.to(device)
    apply_checkpointing(model, cfg.train.gradient_checkpointing)
    warm_up_device(device)
    result = TrainResult(device_ready_at=time.time())
    graphs_at_start = compiled_graph_count()  # dynamo's counters outlive torch.compiler.reset()
    parallel = data_parallel(model, device)
    step_model = compile_model(parallel or model, cfg)
    no_sync = parallel.no_sync if parallel is not None else nullcontext
    cuda_graphs = uses_cuda_graphs(cfg.compile.mode)
    # A CUDA-graph mode records a graph per concrete shape anyway; a dynamic-length graph
    # underneath only adds symbolic-size kernels (and failed in cudagraph trees on an H200).
    dynamic_length = cfg.compile.mode != "off" and not cuda_graphs and cfg.compile.dynamic_length

    drop_full_mask = cfg.compile.mode == "off"  # model_inputs: why compiled runs keep the mask

    def prepare(batch: Dict[str, torch.Tensor]) -> None:
        if dynamic_length:
            mark_length_dynamic(batch)

    # adaptive: windows have at least 2 micro-batches, so ceil(len/2) bounds the steps; the
    # schedule then runs over micro-batches, the one count known in advance.
    steps_per_epoch = math.ceil(len(train_loader) / (2 if adaptive else k))
    if cfg.train.max_steps_per_epoch:
        steps_per_epoch = min(steps_per_epoch, cfg.train.max_steps_per_epoch)
    total_steps = cfg.train.epochs * (len(train_loader) if adaptive else steps_per_epoch)
    micro_batches_done = 0
    global_step = 0
    optimizer = None
    trainable_params: List[torch.Tensor] = []
    graphs: Optional[StepGraphs] = None  # compile.step_graph: captured once the optimizer exists
    phases: Optional[PhaseClock] = None  # the current window's one-step breakdown
    # The linear scaling rule counts the global batch: per-rank batch x accumulation x ranks.
    # (adaptive: k is accumulation_max here, the window's largest.)
    base_lr = scaled_lr(cfg.optimizer, cfg.train.batch_size * k * distributed.world_size())
    # compile=reduce-overhead with accumulation: the first micro-batch's gradients would be the
    # CUDA graph's output buffers, overwritten by the next micro-batch's replay before autograd
    # adds to them. Gradients in buffers of our own (zeroed, not freed, per step) make autograd
    # add into them in place. Without accumulation the optimizer reads them before any replay.
    graph_grad_buffers = cuda_graphs and k > 1

    def optimizer_step(window: List[Dict[str, torch.Tensor]]) -> torch.Tensor:
        """Forward+backward over one window, then the update; returns the window's mean loss."""
        if graphs is not None:
            return graphs.step(window, sum(real_rows(b) for b in window))
        if phases is not None:
            phases.begin_step()
        variance = GradVariance(trainable_params) if adaptive else None
        if variance is not None:
            variance.begin()
        window_loss = accumulate_window(step_model, window, precision, device, attention_ctx, prepare, drop_full_mask,
                                        no_sync, phases, variance)
        if variance is not None:
            # Gradients carry the fp16 loss scale: sigma^2 scales with its square. (A host sync,
            # which only this mode pays.)
            sigma2 = variance.sigma2()
            if sigma2 is not None:
                sigma2 /= float(precision.scaler.get_scale()) ** 2 if precision.scaler.is_enabled() else 1.0
                next_window_k[0] = next_k(sigma2, cfg.accumulation_target_variance, cfg.accumulation_max)
            result.accumulation_k.append(len(window))
            result.grad_variance.append(sigma2)
        if cfg.optimizer.max_grad_norm:
            precision.scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(trainable_params, cfg.optimizer.max_grad_norm)
        precision.scaler.step(optimizer)
        precision.scaler.update()
        optimizer.zero_grad(set_to_none=not graph_grad_buffers)
        if phases is not None:
            phases.step_done()
        return window_loss

    every_length = padded_lengths(cfg.dataset.max_length, cfg.train.pad_to_multiple_of)
    plan = warmup_plan or WarmupPlan(cfg.train.batch_size, cfg.train.eval_batch_size, every_length, every_length)
    has_triton = cfg.attention.swap == "triton" and device.type == "cuda"
    result.compiled_anything = cfg.compile.mode != "off" or has_triton or cfg.compile.step_graph
    with dynamo_settings(cfg, len(plan.train_lengths) + len(plan.eval_lengths)):
        if result.compiled_anything:
            # Everything the loop will run, for every shape, before the first window.
            reset_kernel_caches()  # this run loads or compiles its own Triton variants
            if cuda_graphs:
                # CUDA-graph trees: warm-up call, recording call, first replay (a copy: the
                # caller's plan is not changed under it).
                plan = dataclasses.replace(plan, repeats=3)
            result.compile_time_s = run_warmup(
                model, plan,
                lambda b: accumulate_window(step_model, [b], precision, device, attention_ctx, prepare, drop_full_mask),
                lambda b: eval_batch(step_model, b, precision, device, attention_ctx, prepare, drop_full_mask), device)
            what = [f"torch.compile mode={cfg.compile.mode}" + (" (length dynamic)" if dynamic_length else "")
                    ] if cfg.compile.mode != "off" else []
            what += ["Triton attention kernels"] if has_triton else []
            what += ["CUDA graphs of the whole step per length"] if cfg.compile.step_graph else []
            result.compile_time_source = (f"wall clock of the warm-up before the first training window "
                                          f"({' + '.join(what)}): {plan.describe()}")
        elif parallel is not None:
            # Nothing to compile, but DDP has one-time costs of its own: NCCL creates its
            # communicators on the first all-reduce and DDP rebuilds its gradient buckets in the
            # second forward. Two eager steps at the longest length pay them before the window
            # (measured on 2 H200s: 0.45 s of a 4.4 s window went to such first-step costs).
            eager = WarmupPlan(cfg.train.batch_size, cfg.train.eval_batch_size, plan.train_lengths[-1:], [], repeats=2)
            result.compile_time_s = run_warmup(
                model, eager,
                lambda b: accumulate_window(step_model, [b], precision, device, attention_ctx, prepare, drop_full_mask),
                lambda b: None, device)
            result.compile_time_source = (f"nothing compiled (compile=off); wall clock of the data-parallel warm-up "
                                          f"before the first window (NCCL/gloo communicators, DDP bucket rebuild): "
                                          f"{eager.describe()}")
        else:
            result.compile_time_source = (f"nothing compiled (compile=off, attention={cfg.attention.name}"
                                          f"{' on CPU: interpreter' if cfg.attention.swap == 'triton' else ''})")
        for epoch in range(cfg.train.epochs):
            apply_freezing(model, cfg.freezing.name, epoch)
            if optimizer is None or cfg.freezing.name != "none":
                # Rebuilt over the parameters trainable this epoch (seed 000, section 3.2).
                optimizer = build_optimizer(model, cfg.optimizer, capturable=cfg.compile.step_graph, lr=base_lr)
            if cfg.compile.step_graph and graphs is None:
                # Part of the warm-up (its time counts in compile_time_s), before the first window.
                t_capture = time.perf_counter()
                graphs = StepGraphs(step_model, model, optimizer, precision.autocast, attention_ctx,
                                    cfg.optimizer.max_grad_norm, device, drop_full_mask)
                graphs.capture(plan.train_rows, plan.train_lengths)
                result.compile_time_s += time.perf_counter() - t_capture
            trainable = count_trainable(model)
            trainable_params = [p for p in model.parameters() if p.requires_grad]
            if graph_grad_buffers:
                for p in trainable_params:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
            model.train()
            loss_sum = torch.zeros((), device=device)
            samples = steps = 0
            tokens = TokenCounts()
            clock = StepClock(device)
            phases = PhaseClock(device)
            bar = tqdm(total=None if adaptive else steps_per_epoch, desc=f"epoch {epoch + 1}/{cfg.train.epochs}", unit="step",
                       dynamic_ncols=True, mininterval=1.0,
                       disable=distributed.rank() != 0)  # one bar per job, not per rank
            distributed.start_together(device)
            _sync(device)
            compiles_before = compile_events(device)
            collectors.start()
            window_start_unix = time.time()
            if result.first_window_opened_at is None:
                result.first_window_opened_at = window_start_unix
            t0 = time.perf_counter()
            try:
                clock.mark()
                for window in windows(train_loader, lambda: next_window_k[0]):
                    if steps == steps_per_epoch:
                        break
                    if result.first_step_started_at is None:
                        result.first_step_started_at = time.time()
                    lr_now = base_lr * lr_factor(cfg.optimizer.schedule,
                                                 micro_batches_done if adaptive else global_step, total_steps,
                                                 cfg.optimizer.warmup_ratio, cfg.optimizer.min_lr_ratio)
                    result.lr_per_step.append(lr_now)
                    set_lr(optimizer, lr_now)
                    window_loss = optimizer_step(window)
                    micro_batches_done += len(window)
                    clock.mark()
                    n = 0
                    for batch in window:  # shapes and masks are on the host: no device sync
                        tokens.add(batch)
                        n += real_rows(batch)
                    loss_sum += window_loss * n
                    samples += n
                    steps += 1
                    global_step += 1
                    if steps % cfg.train.log_every_steps == 0 or steps == steps_per_epoch:
                        # One host sync every few steps: the NaN check and the bar, not every step.
                        mean_loss = float(loss_sum) / samples
                        if not math.isfinite(mean_loss):
                            raise NonFiniteLoss(f"non-finite training loss ({mean_loss}) by optimizer step "
                                                f"{global_step} (epoch {epoch + 1})")
                        bar.set_postfix(loss=f"{mean_loss:.4f}",
                                        samples_s=f"{samples / (time.perf_counter() - t0):.1f}")
                    bar.update(1)
                _sync(device)
                train_time_s = time.perf_counter() - t0
                phases_in_window, phases = phases, None  # the profiler window after training is not timed
                window_end_unix = time.time()
            finally:
                collectors.stop()  # also when the window ends in an exception: no sampler left running
                bar.close()
            in_window = new_events(compiles_before, compile_events(device))
            compiles_in_window = sum(in_window.values())
            if distributed.active():
                # Whole-job figures: the slowest rank's window, every rank's samples and tokens.
                (train_time_s,) = distributed.max_across([train_time_s], device)
                totals = distributed.sum_across([float(loss_sum), samples, tokens.sequences, tokens.padded_tokens,
                                                 tokens.real_tokens, tokens.attention_pairs], device)
                loss_total, samples = totals[0], int(totals[1])
                loss_sum = torch.tensor(loss_total)
                tokens = TokenCounts(*(int(v) for v in totals[2:]))
            if compiles_in_window:
                kinds = ", ".join(f"{n} {kind}" for kind, n in in_window.items())
                log(f"warning: {compiles_in_window} compile(s) inside the training window of epoch {epoch + 1} "
                    f"({kinds}): its time includes compilation (a shape the warm-up did not cover)")
            epoch_loss = float(loss_sum) / max(samples, 1)
            if not math.isfinite(epoch_loss):
                raise NonFiniteLoss(f"non-finite training loss ({epoch_loss}) in epoch {epoch + 1}")
            t1 = time.perf_counter()
            accuracy = evaluate(model, test_loader, precision, device, attention_ctx, step_model, prepare,
                                drop_full_mask)
            _sync(device)
            eval_time_s = time.perf_counter() - t1
            result.epochs.append(EpochStats(epoch, epoch_loss, accuracy, trainable, train_time_s,
                                            eval_time_s, steps, samples, tokens,
                                            bert_train_flops(model, tokens),
                                            (window_start_unix, window_end_unix), clock.step_ms(),
                                            compiles_in_window, phases_in_window.per_step()))
            result.last_window_end_unix = window_end_unix
            log(f"epoch {epoch + 1}/{cfg.train.epochs}: train_loss={epoch_loss:.4f} test_accuracy={accuracy:.4f} "
                f"train_time_s={train_time_s:.1f} eval_time_s={eval_time_s:.1f} trainable_params={trainable:,}")
        if cfg.compile.mode != "off":
            result.compile_graphs = compiled_graph_count() - graphs_at_start
        if after_training is not None:
            after_training()
        if cfg.layer_timing:
            # After the last evaluation, on the eager model (hooks do not survive compile or
            # CUDA graphs); forward+backward only, the weights are not changed.
            def timing_loss(host_batch: Dict[str, torch.Tensor]) -> torch.Tensor:
                batch = model_inputs(host_batch, device, drop_full_mask)
                with precision.autocast(), attention_ctx():
                    logits = (parallel or model)(input_ids=batch["input_ids"],
                                                 attention_mask=batch["attention_mask"]).logits
                return F.cross_entropy(logits.float(), batch["labels"], ignore_index=IGNORE_INDEX)

            result.backprop = layer_timing.measure(model, timing_loss, train_loader, device, LAYER_TIMING_STEPS)
        if cfg.profile:
            # After the last evaluation: its extra steps change weights nobody reads any more.
            pw = cfg.profile_window
            try:
                result.profile = profile_steps(optimizer_step, windows(train_loader, k), device,
                                               pw.warmup_steps, pw.active_steps, profile_dir or Path("profile"),
                                               pw.top_k)
            except Exception as e:  # noqa: BLE001 - a failed profile costs the profile, not the run
                result.profile_error = f"{type(e).__name__}: {e}"
                log(f"profile failed: {result.profile_error}")
    return result
