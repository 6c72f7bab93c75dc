"""What a run's training returns: per-epoch statistics (EpochStats) and the run's TrainResult,
whose properties sum or take steady-state medians over the epochs' timed windows. Apart from the
loop (loop.py) so that readers of a result (record/readings.py, runs/job.py) need not import it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from bertaccel.measure import layer_timing
from bertaccel.measure.flops import TokenCounts
from bertaccel.measure.profiling import KernelProfile
from bertaccel.measure.step_clock import steady_median_ms, steady_phase_medians


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
    phase_ms: List[Dict[str, float]] = field(default_factory=list)  # per step {forward_ms, backward_ms, optimizer_ms}
    compiles_in_eval: int = 0                 # compile events counted inside the evaluation (must be 0)


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
    def compiles_in_eval(self) -> int:
        return sum(e.compiles_in_eval for e in self.epochs)

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
