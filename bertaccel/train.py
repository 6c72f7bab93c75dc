"""The training core: one loop that every option changes by argument, never by shape.

Per epoch: apply the freezing schedule, (re)build the optimizer, run accumulation windows of
`accumulation` micro-batches, then evaluate on the test split. Only the training window is
timed into train_time_s, and only it is measured by the collectors (energy, GPU activity);
evaluation has its own clock (the thesis excludes it too). An optional profiler window runs
after the last evaluation (profiling.py).
"""
from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .attention.warmup import padded_lengths, warm_up_triton_attention
from .collectors import CollectorSet
from .flops import TokenCounts, bert_train_flops
from .freezing import apply_freezing, count_trainable
from .isolation import compiled_graph_count, warm_up_device
from .optim import build_optimizer, lr_factor, set_lr
from .profiling import KernelProfile, profile_steps

AUTOCAST_DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


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


@dataclass
class TrainResult:
    epochs: List[EpochStats] = field(default_factory=list)
    compile_graphs: Optional[int] = None
    first_step_started_at: Optional[float] = None  # time.time() as the first window began
    profile: Optional[KernelProfile] = None
    profile_error: Optional[str] = None
    attention_jit_warmup_s: Optional[float] = None
    attention_jit_warmup_source: str = "null: not run"

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
    names = list(cfg.attention.sdpa_backends) if cfg.attention.name == "sdpa" else []
    if not names:
        return nullcontext
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = [getattr(SDPBackend, n) for n in names]
    return lambda: sdpa_kernel(backends)


class Precision:
    """Autocast context and loss scaler for one precision name."""

    def __init__(self, name: str, device: torch.device):
        dtype = AUTOCAST_DTYPES[name]
        self.device_type = device.type
        self.dtype = dtype
        # Only fp16 needs loss scaling: its 5-bit exponent underflows small gradients.
        self.scaler = torch.amp.GradScaler(device.type, enabled=(name == "fp16"))

    def autocast(self):
        if self.dtype is None:
            return nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)


def windows(batches: Iterable[Dict[str, torch.Tensor]], k: int) -> Iterator[List[Dict[str, torch.Tensor]]]:
    """Group micro-batches into accumulation windows of k; a final shorter window still steps."""
    window: List[Dict[str, torch.Tensor]] = []
    for batch in batches:
        window.append(batch)
        if len(window) == k:
            yield window
            window = []
    if window:
        yield window


def accumulate_window(model: Callable, window: List[Dict[str, torch.Tensor]], precision: Precision,
                      device: torch.device, attention_ctx: Callable = nullcontext) -> torch.Tensor:
    """Forward+backward over one window; returns the window's mean loss (detached).

    Each micro-batch's summed loss is divided by the window's sample count n, so the gradient
    equals that of one batch of n samples. With k equal micro-batches of b that is the usual
    mean/k scaling; a partial last micro-batch or window is weighted exactly, not by 1/k.
    """
    n = sum(len(b["labels"]) for b in window)
    total = torch.zeros((), device=device)
    for batch in window:
        batch = {key: t.to(device, non_blocking=True) for key, t in batch.items()}
        with precision.autocast(), attention_ctx():
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        loss = F.cross_entropy(logits.float(), batch["labels"], reduction="sum") / n
        precision.scaler.scale(loss).backward()
        total += loss.detach()
    return total


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader: Iterable, precision: Precision, device: torch.device,
             attention_ctx: Callable = nullcontext) -> float:
    model.eval()
    correct = seen = 0
    for batch in loader:
        batch = {key: t.to(device, non_blocking=True) for key, t in batch.items()}
        with precision.autocast(), attention_ctx():
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        correct += int((logits.argmax(-1) == batch["labels"]).sum())
        seen += len(batch["labels"])
    model.train()
    return correct / seen


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(model: torch.nn.Module, train_loader: Any, test_loader: Any, cfg: Any,
          device: torch.device, log: Callable[[str], None] = print,
          collectors: Optional[CollectorSet] = None, profile_dir: Optional[Path] = None,
          after_training: Optional[Callable[[], None]] = None) -> TrainResult:
    """collectors: started/stopped around each training window. after_training: called after
    the last evaluation, before the optional profiler window (cfg.profile), which writes its
    trace to profile_dir."""
    collectors = collectors or CollectorSet()
    precision = Precision(cfg.precision.name, device)
    attention_ctx = sdpa_backends(cfg)
    k = cfg.accumulation
    model.to(device)
    if cfg.train.gradient_checkpointing:
        # Non-reentrant: works with frozen inputs (layer-wise freezing) and torch.compile.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    warm_up_device(device)
    result = TrainResult()
    # Our Triton attention compiles per shape: all of this run's padded lengths, before timing.
    result.attention_jit_warmup_s, result.attention_jit_warmup_source = warm_up_triton_attention(
        model, precision.autocast, padded_lengths(cfg.dataset.max_length, cfg.train.pad_to_multiple_of), device)
    step_model = model if cfg.compile.mode == "off" else torch.compile(
        model, mode=None if cfg.compile.mode == "default" else cfg.compile.mode)
    steps_per_epoch = math.ceil(len(train_loader) / k)
    if cfg.train.max_steps_per_epoch:
        steps_per_epoch = min(steps_per_epoch, cfg.train.max_steps_per_epoch)
    total_steps = cfg.train.epochs * steps_per_epoch
    global_step = 0
    optimizer = None
    trainable_params: List[torch.Tensor] = []

    def optimizer_step(window: List[Dict[str, torch.Tensor]]) -> torch.Tensor:
        """Forward+backward over one window, then the update; returns the window's mean loss."""
        window_loss = accumulate_window(step_model, window, precision, device, attention_ctx)
        if cfg.optimizer.max_grad_norm:
            precision.scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(trainable_params, cfg.optimizer.max_grad_norm)
        precision.scaler.step(optimizer)
        precision.scaler.update()
        optimizer.zero_grad(set_to_none=True)
        return window_loss

    for epoch in range(cfg.train.epochs):
        apply_freezing(model, cfg.freezing.name, epoch)
        if optimizer is None or cfg.freezing.name != "none":
            # Rebuilt over the parameters trainable this epoch (seed 000, section 3.2).
            optimizer = build_optimizer(model, cfg.optimizer)
        trainable = count_trainable(model)
        trainable_params = [p for p in model.parameters() if p.requires_grad]
        model.train()
        loss_sum = torch.zeros((), device=device)
        samples = steps = 0
        tokens = TokenCounts()
        bar = tqdm(total=steps_per_epoch, desc=f"epoch {epoch + 1}/{cfg.train.epochs}", unit="step",
                   dynamic_ncols=True, mininterval=1.0)
        _sync(device)
        collectors.start()
        window_start_unix = time.time()
        t0 = time.perf_counter()
        try:
            for window in windows(train_loader, k):
                if steps == steps_per_epoch:
                    break
                if result.first_step_started_at is None:
                    result.first_step_started_at = time.time()
                set_lr(optimizer, cfg.optimizer.lr * lr_factor(cfg.optimizer.schedule, global_step,
                                                               total_steps, cfg.optimizer.warmup_ratio))
                window_loss = optimizer_step(window)
                for batch in window:  # shapes and masks are on the host: no device sync
                    tokens.add(batch)
                n = sum(len(b["labels"]) for b in window)
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
            window_end_unix = time.time()
        finally:
            collectors.stop()  # also when the window ends in an exception: no sampler left running
            bar.close()
        epoch_loss = float(loss_sum) / max(samples, 1)
        if not math.isfinite(epoch_loss):
            raise NonFiniteLoss(f"non-finite training loss ({epoch_loss}) in epoch {epoch + 1}")
        t1 = time.perf_counter()
        accuracy = evaluate(model, test_loader, precision, device, attention_ctx)
        _sync(device)
        eval_time_s = time.perf_counter() - t1
        result.epochs.append(EpochStats(epoch, epoch_loss, accuracy, trainable, train_time_s,
                                        eval_time_s, steps, samples, tokens,
                                        bert_train_flops(model, tokens),
                                        (window_start_unix, window_end_unix)))
        log(f"epoch {epoch + 1}/{cfg.train.epochs}: train_loss={epoch_loss:.4f} test_accuracy={accuracy:.4f} "
            f"train_time_s={train_time_s:.1f} eval_time_s={eval_time_s:.1f} trainable_params={trainable:,}")
    if cfg.compile.mode != "off":
        result.compile_graphs = compiled_graph_count()
    if after_training is not None:
        after_training()
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
