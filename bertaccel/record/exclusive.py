"""What a run of sweep.concurrent > 1 records: its time, energy and rates from its exclusive window
(train/exclusive.py), projected to the whole run's steps, each projection's source saying so and
its arithmetic; the window's own measured figures beside them; the shared training's wall time,
named as such. Accuracy and losses come from the full training, as in any run.

The projection: a figure F measured over the window's K steps stands for F x N / K over the run's
N optimizer steps (train_time_s, energy_kwh); a rate (samples/s, power, GPU activity) is the
window's own. Outside the mode nothing here is called.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field, fields
from typing import Any, Dict, Mapping, Optional, Tuple

from bertaccel.measure.collectors import Reading
from bertaccel.measure.step_clock import PHASES, steady_phase_medians
from bertaccel.train.exclusive import WindowFigures
from bertaccel.train.result import TrainResult


def projected_from(fig: WindowFigures) -> str:
    return f"projected from an exclusive window of {fig.steps} steps"


def over(fig: WindowFigures) -> str:
    return f"over an exclusive window of {fig.steps} steps (the other runs paused at a step boundary)"


@dataclass
class ProjectedResult(TrainResult):
    """A TrainResult whose train time and step time are the exclusive window's (projected); the
    rest (epochs, losses, accuracy, samples, tokens, FLOPs) is the full training's."""
    projected_train_time_s: float = 0.0
    window_step_ms: Optional[float] = None
    window_phase_ms: Dict[str, Optional[float]] = field(default_factory=dict)

    @property
    def train_time_s(self) -> float:
        return self.projected_train_time_s

    @property
    def step_time_ms(self) -> Optional[float]:
        return self.window_step_ms

    @property
    def phase_ms(self) -> Dict[str, Optional[float]]:
        return self.window_phase_ms

    @property
    def shared_train_time_s(self) -> float:
        """The full training's windows, as the loop timed them (shared with the other runs)."""
        return sum(e.train_time_s for e in self.epochs)


def projection(fig: WindowFigures, total_steps: int) -> float:
    """N / K: what a window figure is multiplied by to stand for the whole run."""
    return total_steps / fig.steps


def projected_result(result: TrainResult, fig: WindowFigures) -> ProjectedResult:
    """The result with the window's time projected, and its step and phase medians over the window's
    steps alone (the other steps shared the device: their times are not this run's speed)."""
    span = slice(fig.first_step, fig.first_step + fig.steps)
    steps = result.epochs[0].step_ms[span] if result.epochs else []
    phases = result.epochs[0].phase_ms[span] if result.epochs else []
    marked = bool(phases) and any(phases[0].values())  # (none under step graphs: TrainResult.phase_ms)
    return ProjectedResult(**{f.name: getattr(result, f.name) for f in fields(TrainResult)},
                           projected_train_time_s=fig.time_s * projection(fig, result.optimizer_steps),
                           window_step_ms=statistics.median(steps) if steps else None,
                           window_phase_ms=(steady_phase_medians([phases], skip=0) if marked
                                            else dict.fromkeys(PHASES)))


def window_readings(readings: Mapping[str, Reading], fig: WindowFigures, total_steps: int) -> Dict[str, Reading]:
    """The collectors' readings, taken over the window: energy projected (the window's beside it),
    the rates as measured there."""
    out = {k: Reading(r.value, r.source if r.value is None else f"{over(fig)}: {r.source}") for k, r in readings.items()}
    energy = readings.get("energy_kwh")
    if energy is not None:
        out["window_energy_kwh"] = out["energy_kwh"]
        if energy.value is not None:
            out["energy_kwh"] = Reading(energy.value * projection(fig, total_steps),
                                        f"{projected_from(fig)}: window_energy_kwh x optimizer_steps / window_steps "
                                        f"= {energy.value:.6g} x {total_steps} / {fig.steps}")
    return out


def window_record(fig: WindowFigures, projected: ProjectedResult,
                  timer_source: str) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """The window's own figures (metrics) and the sources of the metrics it changes (tags)."""
    k, n, shared_train_time_s = fig.steps, projected.optimizer_steps, projected.shared_train_time_s
    arithmetic = f"window_time_s x optimizer_steps / window_steps = {fig.time_s:.6g} x {n} / {k}"
    metrics = {"window_steps": k, "window_time_s": fig.time_s, "window_samples": fig.samples,
               "window_throughput_samples_s": fig.samples / fig.time_s if fig.time_s > 0 else None,
               "window_start_unix": fig.start_unix, "window_end_unix": fig.end_unix,
               "window_wait_s": fig.waited_s, "shared_train_time_s": shared_train_time_s}
    projected_note = f" ({projected_from(fig)}: train_time_s = {arithmetic})"
    tags = {
        "train_time_s_source": f"{projected_from(fig)}: {arithmetic}; the window timed by {timer_source}",
        "throughput_samples_s_source": f"samples trained / train_time_s{projected_note}",
        "step_time_ms_source": f"median over the exclusive window's {k} steps (first epoch, steps {fig.first_step + 1}"
                               f"-{fig.first_step + k}); CUDA events or time.perf_counter between optimizer steps",
        "step_time_mean_ms_source": f"train_time_s / optimizer steps{projected_note}",
        **{f"{p}_source": f"one-step breakdown (step_clock.PhaseClock): median over the exclusive window's {k} steps"
           for p in PHASES if projected.phase_ms.get(p) is not None},
        "window_steps_source": "optimizer steps timed with the device to this run alone"
                               + (f" ({fig.note})" if fig.note else ""),
        "window_time_s_source": f"{timer_source}, {over(fig)}",
        "window_samples_source": "rows of the window's micro-batches",
        "window_throughput_samples_s_source": "window_samples / window_time_s",
        "window_start_unix_source": "time.time() as the window's clock started (its exclusive lock taken)",
        "window_end_unix_source": "time.time() as the window's clock stopped (device synchronized)",
        "window_wait_s_source": "from the run's own step boundary to its exclusive lock: the others' steps yielding",
        "shared_train_time_s_source": ("the full training's windows, shared with the sweep's other runs "
                                       "(sweep.concurrent): time.perf_counter (device synchronized at window edges)"),
        "exclusive_projection": f"F x optimizer_steps / window_steps = F x {n} / {k} for train_time_s and energy_kwh; "
                                "rates (samples/s, power, GPU activity) are the window's own",
        "exclusive_window_unix": json.dumps([fig.start_unix, fig.end_unix]),
        "exclusive_holds_unix": json.dumps(fig.holds_unix),
        "exclusive_holds_unix_source": ("[start, end] of each stretch this run held the sweep's shared lock (its "
                                        "warm-up, steps and evaluations fall inside them; no other run's window does)"),
    }
    return metrics, tags


# Figures computed from train_time_s or energy_kwh (record/readings.py, measure/carbon.py co2e).
FROM_PROJECTED = ("cost_usd", "achieved_tflops", "mfu", "energy_per_sample_j", "samples_per_kwh", "co2e_kg")


def from_projected(fig: WindowFigures, metrics: Mapping[str, Any], sources: Mapping[str, str]) -> Dict[str, str]:
    """The sources of the figures computed from a projection, saying so."""
    return {f"{k}_source": f"{sources[f'{k}_source']} ({projected_from(fig)})" for k in FROM_PROJECTED
            if metrics.get(k) is not None and f"{k}_source" in sources}
