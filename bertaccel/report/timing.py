"""One-time costs in the report: what T means (--time), a run projected to a full training
(--project-epochs), and after how many steps compiling pays off (break-even).

The thesis' T is the training windows (train_time_s). A compiled run also pays a one-time
warm-up before its first window (compile_time_s: torch.compile, CUDA-graph capture, Triton
JIT), which `--time total` counts. A short trial (one epoch of a subset) says little about a
full training; `--project-epochs` scales its steady-state step time to the full dataset. The
rows as loaded are never changed: every function here returns new rows or new records.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

from .scoring import Row

TIME_MODES = ("train", "total")
# The default is the thesis' T: training windows only. With compile caches that outlive a run
# (Inductor / Triton caches on disk) the warm-up is paid once per machine, not once per run, so
# charging it to every run would rank compiled configurations by how cold the cache happened to
# be. `--time total` is the view of one cold run, and the break-even table prices the warm-up.
DEFAULT_TIME_MODE = "train"
from bertaccel.config import COMPILE_MODES  # noqa: E402 (the choices in conf/compile/: one home)
# Params a compiled run and its uncompiled twin may differ in: the compile choice itself and where
# its warm-up's results are cached (not what is trained).
COMPILE_PARAMS = ("compile", "compile.mode", "compile.cache")
# The measured inputs of a projection, in the order their absence is reported.
PROJECTION_INPUTS = ("step_time_ms", "train_rows_full", "batch_size", "accumulation", "num_gpus")
NOT_MEASURED = "not measured"


def _why(row: Row, column: str) -> str:
    return row.extra.get(column, NOT_MEASURED)


def pairing_key(params: Mapping[str, str], where_roots: Iterable[str]) -> str:
    """Same key = same configuration except the compile choice. where_roots: the config keys that
    are not a run's identity (tracking.HASH_EXCLUDED_KEYS): a root, left out with everything under
    it, or one field."""
    roots = set(where_roots)
    kept = {k: v for k, v in params.items()
            if k not in COMPILE_PARAMS and k.split(".")[0] not in roots and k not in roots}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Basis:
    """What the scored time, cost and energy columns are: the notes and labels that say so."""
    time_mode: str = DEFAULT_TIME_MODE
    project_epochs: Optional[int] = None

    @property
    def projected(self) -> bool:
        return self.project_epochs is not None

    def label(self, column: str) -> str:
        """Column header (and plot axis) for a scored column on this basis."""
        p = self.projected
        if column == "time_s":
            if self.time_mode == "total":
                return "time_s (warm-up + projected train)" if p else "time_s (warm-up + train)"
            return "time_s (projected)" if p else "time_s"
        if column == "cost_usd":
            if self.time_mode == "total":
                return "cost_usd (projected, warm-up + train)" if p else "cost_usd (warm-up + train)"
            return "cost_usd (projected)" if p else "cost_usd"
        if column == "energy_kwh":
            if p:
                return "energy_kwh (projected" + (", train windows)" if self.time_mode == "total" else ")")
            return "energy_kwh (train windows)" if self.time_mode == "total" else "energy_kwh"
        if column == "accuracy" and p:
            return "accuracy (measured)"
        return column

    @property
    def title_suffix(self) -> str:
        """What a table of scored numbers is on, for its title; "" for the thesis' own basis."""
        if not self.projected:
            return "" if self.time_mode == DEFAULT_TIME_MODE else "T = warm-up + train"
        t = "; T = warm-up + projected train" if self.time_mode == "total" else ""
        return f"projected to {self.project_epochs} epoch(s) of the full train split{t}"

    def notes(self) -> List[str]:
        train = "train_time_s" if not self.projected else "the projected train time_s"
        if self.time_mode == "total":
            out = [f"--time total (the default is {DEFAULT_TIME_MODE}): T = compile_time_s + {train}, the one-time "
                   "warm-up (torch.compile, CUDA-graph capture, Triton JIT before the first window) plus the "
                   "training windows; a row without compile_time_s has no T (never a warm-up of 0). cost_usd is "
                   f"scaled by T / {train}: the GPU is paid while compiling. energy_kwh stays the training "
                   "windows only: warm-up energy is not measured."]
        else:
            out = [f"--time train (the default): T = {train}, the training windows only; the one-time warm-up "
                   "(compile_time_s) is left out, since with caches that outlive a run it is paid once per "
                   "machine, not per run. --time total counts it."]
        if self.projected:
            n = self.project_epochs
            out.append(f"Projected to {n} epoch(s) of the full train split (every 'projected' column): time_s = "
                       f"steps x step_time_ms / 1000, steps = {n} x ceil(train_rows_full / (num_gpus x batch_size x "
                       "accumulation)); energy_kwh and cost_usd = the run's average power and cost rate over its "
                       "training windows (energy_kwh / train_time_s, cost_usd / train_time_s) x the projected "
                       "time_s. Occupancy and accuracy are not projected: they are measured on the run's own data "
                       "(see 'Projection'). Runs without a projection are kept from 'best'.")
        return out


def with_time_mode(rows: Sequence[Row], mode: str) -> List[Row]:
    """Rows whose time_s is T of this mode (rows as loaded: time_s = the training windows).
    total: T = compile_time_s + time_s and cost scaled by T / time_s; energy unchanged."""
    if mode not in TIME_MODES:
        raise ValueError(f"--time {mode!r}: choose one of {', '.join(TIME_MODES)}")
    if mode == "train":
        return [dataclasses.replace(r, extra=dict(r.extra)) for r in rows]
    out = []
    for r in rows:
        extra = dict(r.extra)
        time_s = cost_usd = None
        if r.time_s is None or r.time_s <= 0:  # no windows to add the warm-up to: T null, its reason kept
            if r.time_s is not None:
                extra["time_s"] = f"train_time_s is {r.time_s:g}"
            if r.cost_usd is not None:
                extra["cost_usd"] = f"--time total: cost not scalable by T / train_time_s: {_why(r, 'time_s')}"
        elif r.compile_time_s is None:
            why = f"--time total: compile_time_s {_why(r, 'compile_time_s')} (a missing warm-up is never taken as 0)"
            extra["time_s"] = why
            if r.cost_usd is not None:
                extra["cost_usd"] = why
        else:
            time_s = r.compile_time_s + r.time_s
            cost_usd = None if r.cost_usd is None else r.cost_usd * time_s / r.time_s
        out.append(dataclasses.replace(r, time_s=time_s, cost_usd=cost_usd, extra=extra))
    return out


def steps_per_epoch(train_rows_full: int, batch_size: int, accumulation: int, num_gpus: int) -> int:
    """Optimizer steps of one epoch over the full split: a step takes num_gpus x batch_size x
    accumulation rows, and a last shorter accumulation window still steps (train/loop.py): a ceiling."""
    return -(-train_rows_full // (num_gpus * batch_size * accumulation))


@dataclass(frozen=True)
class ProjectedRun:
    """One run projected to `epochs` epochs of its full train split (None = not projectable)."""
    epochs: int
    steps: Optional[int]
    time_s: Optional[float]
    energy_kwh: Optional[float]
    cost_usd: Optional[float]
    why: Dict[str, str] = field(default_factory=dict)  # column -> why it is null


def project(row: Row, epochs: int) -> ProjectedRun:
    """Time from the steady-state step time; energy and cost at the run's own average rate over its
    training windows (kWh / s and USD / s of train_time_s): the power draw does not change with the
    length of the run, the number of steps does."""
    missing = [f"{c} {_why(row, c)}" for c in PROJECTION_INPUTS if getattr(row, c) is None]
    if missing:
        reason = "no projection: " + "; ".join(missing)
        return ProjectedRun(epochs, None, None, None, None, {"time_s": reason, "energy_kwh": reason, "cost_usd": reason})
    # (none of PROJECTION_INPUTS is missing)
    assert (row.step_time_ms is not None and row.train_rows_full is not None and row.batch_size is not None
            and row.accumulation is not None and row.num_gpus is not None)
    steps = epochs * steps_per_epoch(row.train_rows_full, row.batch_size, row.accumulation, row.num_gpus)
    time_s = steps * row.step_time_ms / 1000
    why: Dict[str, str] = {}
    rates: Dict[str, float] = {}
    for col in ("energy_kwh", "cost_usd"):
        value = row.get(col)
        if value is None:
            why[col] = _why(row, col)
        elif row.time_s is None or row.time_s <= 0:
            why[col] = f"no average rate: train_time_s {_why(row, 'time_s') if row.time_s is None else row.time_s}"
        else:
            rates[col] = value / row.time_s * time_s
    return ProjectedRun(epochs, steps, time_s, rates.get("energy_kwh"), rates.get("cost_usd"), why)


def with_projection(rows: Sequence[Row], projections: Sequence[ProjectedRun]) -> List[Row]:
    """Rows whose time, energy and cost are the projected ones (occupancy, accuracy: measured),
    and whose train_samples is what the projection trains: its epochs of the full split."""
    out = []
    for r, p in zip(rows, projections):
        extra = {**r.extra, **p.why}
        # (a projection with steps had the row's train_rows_full)
        samples = None if p.steps is None or r.train_rows_full is None else p.epochs * r.train_rows_full
        if samples is None:
            extra["train_samples"] = p.why["time_s"]
        # co2e_kg is energy x a constant (carbon.py): it follows the projected energy.
        co2e = (None if r.co2e_kg is None or p.energy_kwh is None or not r.energy_kwh
                else r.co2e_kg * p.energy_kwh / r.energy_kwh)
        if r.co2e_kg is not None and co2e is None:
            extra["co2e_kg"] = p.why.get("energy_kwh", "energy_kwh not projected")
        out.append(dataclasses.replace(r, time_s=p.time_s, energy_kwh=p.energy_kwh, cost_usd=p.cost_usd,
                                       co2e_kg=co2e, train_samples=samples, extra=extra))
    return out


def break_even_steps(warmup_off_s: float, warmup_compiled_s: float, step_ms_off: float,
                     step_ms_compiled: float) -> float:
    """Optimizer steps after which the compiled run has made up its extra warm-up; math.inf (never)
    when its step is not faster. A compiled warm-up no longer than the uncompiled one pays off from
    the first step: 0, not a negative count."""
    saving_s = (step_ms_off - step_ms_compiled) / 1000
    if saving_s <= 0:
        return math.inf
    return max(0.0, warmup_compiled_s - warmup_off_s) / saving_s


@dataclass(frozen=True)
class BreakEven:
    config: str
    compile_mode: str
    off: int                          # row index of the uncompiled run
    compiled: int                     # row index of the compiled run
    step_ms_off: Optional[float]
    step_ms_compiled: Optional[float]
    saving_ms: Optional[float]        # per optimizer step
    extra_warmup_s: Optional[float]
    steps: Optional[float]            # math.inf = never; None = not computable (see why)
    why: str = ""


def _minus(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or b is None else a - b


def _break_even(off: Row, compiled: Row) -> Optional[float]:
    """break_even_steps of two runs, None when either lacks its step time or compile time."""
    off_s, compiled_s, off_ms, compiled_ms = off.compile_time_s, compiled.compile_time_s, off.step_time_ms, compiled.step_time_ms
    if off_s is None or compiled_s is None or off_ms is None or compiled_ms is None:
        return None
    return break_even_steps(off_s, compiled_s, off_ms, compiled_ms)


def break_even_pairs(rows: Sequence[Row]) -> List[BreakEven]:
    """Every compiled run against every uncompiled run of the same configuration (config_key)."""
    out = []
    for i, c in enumerate(rows):
        if not c.config_key or c.compile_mode in ("", "off"):
            continue
        for j, o in enumerate(rows):
            if o.config_key != c.config_key or o.compile_mode != "off":
                continue
            missing = [f"{c.name if r is c else o.name}: {col} {_why(r, col)}"
                       for r in (o, c) for col in ("step_time_ms", "compile_time_s") if getattr(r, col) is None]
            steps = None if missing else _break_even(o, c)
            out.append(BreakEven(c.config_key, c.compile_mode, j, i, o.step_time_ms, c.step_time_ms,
                                 _minus(o.step_time_ms, c.step_time_ms), _minus(c.compile_time_s, o.compile_time_s),
                                 steps, "; ".join(missing)))
    return sorted(out, key=lambda b: (b.config, b.compile_mode, b.off, b.compiled))


def unpaired_compiled(rows: Sequence[Row]) -> List[int]:
    """Compiled runs with no uncompiled run of the same configuration: no break-even for them."""
    offs = {r.config_key for r in rows if r.config_key and r.compile_mode == "off"}
    return [i for i, r in enumerate(rows) if r.compile_mode not in ("", "off") and r.config_key not in offs]


@dataclass
class TimeView:
    """The rows to score on one basis, and what the report shows about one-time costs."""
    basis: Basis
    measured: List[Row]                 # as loaded
    rows: List[Row]                     # what is scored: T, cost and energy on `basis`
    projections: List[ProjectedRun]     # one per row when projecting, else empty
    break_even: List[BreakEven]
    unpaired: List[int]
    excluded: Dict[int, str]            # row index -> why it is kept from "best"


def time_view(rows: Sequence[Row], time_mode: str = DEFAULT_TIME_MODE,
              project_epochs: Optional[int] = None) -> TimeView:
    if project_epochs is not None and project_epochs <= 0:
        raise ValueError(f"--project-epochs {project_epochs}: give a whole number of epochs > 0")
    measured = list(rows)
    projections = [project(r, project_epochs) for r in measured] if project_epochs is not None else []
    scored = with_time_mode(with_projection(measured, projections) if projections else measured, time_mode)
    # A run with no T on this basis (no projection, no warm-up measured) would be ranked on the
    # metrics it has against runs that have one: kept from "best" (still shown, with its reason)
    # rather than posing as, say, a full training. A T missing as loaded stays the house rule
    # (scored over fewer metrics).
    excluded = {i: s.extra.get("time_s", NOT_MEASURED) for i, (m, s) in enumerate(zip(measured, scored))
                if s.time_s is None and (m.time_s is not None or projections)}
    return TimeView(Basis(time_mode, project_epochs), measured, scored, projections, break_even_pairs(measured),
                    unpaired_compiled(measured), excluded)
