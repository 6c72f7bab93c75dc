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
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Union

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
from .step_graph import StepGraphs
from .warmup import (IGNORE_INDEX, WarmupPlan, compile_events, compiled_graph_count, new_events, padded_lengths,
                     run_warmup)


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


def sdpa_backends(cfg: Any):
    """Context restricting torch SDPA to the configured backends (no-op when none are set)."""
    names = list(cfg.attention.sdpa_backends) if cfg.attention.hf_implementation == "sdpa" else []
    if not names:
        return nullcontext
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = [getattr(SDPBackend, n) for n in names]
    return lambda: sdpa_kernel(backends)


def windows(batches: Iterable[Dict[str, torch.Tensor]], k: Union[int, Callable[[], int]]
            ) -> Iterator[List[Dict[str, torch.Tensor]]]:
    """Group micro-batches into accumulation windows of k; a final shorter window still steps.
    k: a number, or a function read at the start of each window (accumulation=adaptive)."""
    window: List[Dict[str, torch.Tensor]] = []
    size = k() if callable(k) else k
    for batch in batches:
        window.append(batch)
        if len(window) == size:
            yield window
            window = []
            size = k() if callable(k) else k
    if window:
        yield window


def real_rows(batch: Dict[str, torch.Tensor]) -> int:
    """Rows that are data (compiled runs fill a short batch up with ignored rows: warmup.py)."""
    return int((batch["labels"] != IGNORE_INDEX).sum())


def mark_length_dynamic(batch: Dict[str, torch.Tensor]) -> None:
    """One compiled graph for every padded length: dim 1 symbolic instead of a graph per length.
    maybe_: where the model's code specializes on the length, dynamo keeps it static instead of
    failing, and the warm-up then simply compiles one graph per length."""
    for key in ("input_ids", "attention_mask"):
        if batch[key] is not None:  # no mask: the batch has no padding (model_inputs)
            torch._dynamo.maybe_mark_dynamic(batch[key], 1)


def model_inputs(host_batch: Dict[str, torch.Tensor], device: torch.device,
                 drop_full_mask: bool = True) -> Dict[str, Optional[torch.Tensor]]:
    """The batch on the device; drop_full_mask: attention_mask None where the batch has no padding.

    An all-ones mask means "attend everywhere", exactly what no mask means. Eager Hugging Face
    drops it itself, but by reading the device mask (a host sync per forward); here the check is
    made on the host batch before the copy. Compiled runs keep the mask (train() passes False):
    the no-mask variant is the one SDPA could run as flash attention, but on an H200 (torch 2.11)
    Inductor's compile of that variant hung in async_compile.wait and never returned."""
    mask = host_batch["attention_mask"]
    unpadded = drop_full_mask and mask.device.type == "cpu" and bool(mask.all())
    batch = {key: t.to(device, non_blocking=True) for key, t in host_batch.items() if key != "attention_mask"}
    batch["attention_mask"] = None if unpadded else mask.to(device, non_blocking=True)
    return batch


def accumulate_window(model: Callable, window: List[Dict[str, torch.Tensor]], precision: Precision,
                      device: torch.device, attention_ctx: Callable = nullcontext,
                      prepare: Optional[Callable[[Dict[str, torch.Tensor]], None]] = None,
                      drop_full_mask: bool = True,
                      no_sync: Callable[[], Any] = nullcontext,
                      phases: Optional[PhaseClock] = None,
                      grad_variance: Optional[GradVariance] = None) -> torch.Tensor:
    """Forward+backward over one window; returns the window's mean loss (detached).

    Each micro-batch's summed loss is divided by the window's sample count n, so the gradient
    equals that of one batch of n samples. With k equal micro-batches of b that is the usual
    mean/k scaling; a partial last micro-batch or window is weighted exactly, not by 1/k.
    Filler rows (label IGNORE_INDEX) add nothing to the loss, its gradient or n.
    prepare: called on each device batch before the forward (dynamic-length marking).
    drop_full_mask: see model_inputs. no_sync: data parallel, DDP's no_sync: the gradient
    all-reduce runs once, in the window's last backward, not after every micro-batch.
    Under data parallel n is this rank's count and DDP averages over the ranks: the gradient of
    the global batch when ranks have equal counts (every full step; see data.shard).
    phases: marks the forward/backward boundaries of the one-step breakdown (step_clock.py).
    grad_variance: accumulation=adaptive, sees each micro-batch's gradient (adaptive_accumulation.py).
    """
    n = sum(real_rows(b) for b in window)
    total = torch.zeros((), device=device)
    for i, batch in enumerate(window):
        batch = model_inputs(batch, device, drop_full_mask)
        if prepare is not None:
            prepare(batch)
        with (no_sync() if i < len(window) - 1 else nullcontext()):
            with precision.autocast(), attention_ctx():
                logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            loss = F.cross_entropy(logits.float(), batch["labels"], reduction="sum", ignore_index=IGNORE_INDEX) / n
            if phases is not None:
                phases.forward_done()
            precision.scaler.scale(loss).backward()
            if phases is not None:
                phases.backward_done()
            if grad_variance is not None:
                grad_variance.after_backward(real_rows(batch), n)
        total += loss.detach()
    return total


def eval_batch(model: Callable, batch: Dict[str, torch.Tensor], precision: Precision, device: torch.device,
               attention_ctx: Callable = nullcontext,
               prepare: Optional[Callable[[Dict[str, torch.Tensor]], None]] = None,
               drop_full_mask: bool = True) -> torch.Tensor:
    """Correct predictions among the batch's data rows (a device scalar: no host sync)."""
    batch = model_inputs(batch, device, drop_full_mask)
    if prepare is not None:
        prepare(batch)
    with torch.no_grad(), precision.autocast(), attention_ctx():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return ((logits.argmax(-1) == batch["labels"]) & (batch["labels"] != IGNORE_INDEX)).sum()


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader: Iterable, precision: Precision, device: torch.device,
             attention_ctx: Callable = nullcontext, step_model: Optional[Callable] = None,
             prepare: Optional[Callable[[Dict[str, torch.Tensor]], None]] = None,
             drop_full_mask: bool = True) -> float:
    """Test accuracy. step_model: the compiled model (its eval graphs were warmed up too)."""
    model.eval()
    correct = torch.zeros((), dtype=torch.long, device=device)
    seen = 0
    for batch in loader:
        correct += eval_batch(model if step_model is None else step_model, batch, precision, device, attention_ctx,
                              prepare, drop_full_mask)
        seen += real_rows(batch)
    model.train()
    # Data parallel: each rank saw its share of the test split (data.make_loader); the accuracy
    # is over the whole split.
    correct_all, seen_all = distributed.sum_across([int(correct), seen], device)
    return correct_all / seen_all


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def uses_fixed_shapes(cfg: Any) -> bool:
    """Compiled runs pad every batch to a fixed row count, so the batch dimension never
    changes and the shape set is just the padded lengths (eager runs gain nothing from it)."""
    return cfg.compile.mode != "off" or cfg.compile.step_graph


def compile_model(model: torch.nn.Module, cfg: Any) -> Callable:
    if cfg.compile.mode == "off":
        return model
    return torch.compile(model, mode=None if cfg.compile.mode == "default" else cfg.compile.mode)


LAYER_TIMING_STEPS = 10  # timed forward+backward passes for layer_timing (after one untimed)


def data_parallel(model: torch.nn.Module, device: torch.device) -> Optional[torch.nn.Module]:
    """DDP around the model when this process is one rank of several (launch.py), else None.

    broadcast_buffers off: BERT's buffers (position ids) never change, and a broadcast per
    forward would make evaluation, where ranks run different batch counts, wait on each other."""
    if not distributed.active():
        return None
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    # torch 2.13 renamed the switch (and deprecated the old name); the GPU image's 2.11 has only the old.
    params = inspect.signature(DistributedDataParallel.__init__).parameters
    no_buffer_sync = {"forward_sync_buffers": False} if "forward_sync_buffers" in params else {"broadcast_buffers": False}
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                   **no_buffer_sync)


def dynamo_settings(cfg: Any, n_shapes: int):
    """Per-run dynamo settings (a context: nothing leaks into the next run of the process).

    - fail_on_recompile_limit_hit: past the recompile limit dynamo would otherwise run new
      shapes eagerly without a word, and the run's timings would silently mix compiled and
      eager steps. The limit is raised to cover the run's own shape set.
    - automatic_dynamic_local_pgo off: dynamo would otherwise remember, in the on-disk cache,
      which dimensions were dynamic in earlier runs, and a run's graphs would depend on what
      ran before it on this machine.
    """
    if cfg.compile.mode == "off":
        return nullcontext()
    limit = max(8, 4 * n_shapes + 8)  # train/eval x padded/unpadded per length, and slack
    return torch._dynamo.config.patch(recompile_limit=limit, accumulated_recompile_limit=max(256, 4 * limit),
                                      fail_on_recompile_limit_hit=True, automatic_dynamic_local_pgo=False)


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
    result = TrainResult()
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
