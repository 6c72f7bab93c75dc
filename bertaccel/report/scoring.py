"""The thesis' weighted score (Hardware Acceleration of Machine Learning, section 5.1): max-normalize, weight, rank.

Score = w1*T + w2*C + w3*E - w4*O (+ w5*CO2e), each metric divided by its column maximum first
(Table 5.2); lower is better. The fifth term, carbon (co2e_kg, bertaccel/measure/carbon.py), is ours, not
the thesis': a strategy of four weights has w5 = 0 and scores exactly as the thesis does. A row missing a metric is scored over the metrics it has, with the weights
of those metrics scaled up so their absolute sum equals the strategy's (never as if the
missing value were 0), and the row is listed as affected.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

METRICS = ("time_s", "cost_usd", "energy_kwh", "occupancy_pct", "co2e_kg")  # T, C, E, O, CO2e
SIGNS = (1.0, 1.0, 1.0, -1.0, 1.0)  # occupancy is a benefit
THESIS_TERMS = 4  # T, C, E, O: the thesis' strategies give these; w5 (carbon) is then 0

# Thesis Table 5.3: (w1 time, w2 cost, w3 energy, w4 occupancy).
STRATEGIES: Dict[str, Tuple[float, float, float, float]] = {
    "balance": (0.3, 0.3, 0.3, 0.1),
    "time_cost_energy": (0.5, 0.3, 0.1, 0.1),
    "time_energy_cost": (0.5, 0.1, 0.3, 0.1),
    "cost_time_energy": (0.3, 0.5, 0.1, 0.1),
    "cost_energy_time": (0.1, 0.5, 0.3, 0.1),
    "energy_time_cost": (0.3, 0.1, 0.5, 0.1),
    "energy_cost_time": (0.1, 0.3, 0.5, 0.1),
}


@dataclass
class Row:
    name: str
    time_s: Optional[float] = None
    cost_usd: Optional[float] = None
    energy_kwh: Optional[float] = None
    occupancy_pct: Optional[float] = None
    accuracy: Optional[float] = None
    hardware: str = ""
    precision: str = ""
    run_id: str = ""
    extra: Dict[str, str] = field(default_factory=dict)  # column -> why it is null (or how it was filled)
    # Inputs of --time total, break-even and --project-epochs (report/timing.py), not scored
    # themselves; as loaded, time_s is the training windows (train_time_s), and timing.py derives
    # new rows with another T rather than changing these.
    compile_time_s: Optional[float] = None   # one-time warm-up before the first window (0.0 = nothing compiled)
    step_time_ms: Optional[float] = None     # median ms per optimizer step in steady state
    optimizer_steps: Optional[int] = None
    epochs: Optional[float] = None           # epochs the run trained
    train_rows: Optional[int] = None         # rows trained per epoch (after any subset)
    train_rows_full: Optional[int] = None    # rows of the full train split
    batch_size: Optional[int] = None         # per device
    accumulation: Optional[int] = None
    num_gpus: Optional[int] = None
    train_samples: Optional[int] = None      # samples trained in all (epochs x rows, or fewer under a step cap)
    compile_mode: str = ""                   # off | default | max-autotune | reduce-overhead; "" = unknown
    compile_cache: str = ""                  # cold | warm | fresh | none: a warm cache shortens compile_time_s
    config_key: str = ""                     # same key = same configuration but for compile; "" = unknown
    # Repeats, the O choice, time to a target accuracy and the comparability gate (report/repeats.py,
    # occupancy.py, target.py, gate.py).
    seed: str = ""                           # train.seed; "" = unknown
    group: str = ""                          # same group = same configuration but for the seed; "" = unknown
    sm_active_pct: Optional[float] = None    # the other two candidates for O (--occupancy-metric)
    tensor_active_pct: Optional[float] = None
    device: str = ""                         # what it ran on (the tag device_name), dataset and energy
    dataset: str = ""                        # source: runs that differ in them are not ranked together
    energy_source: str = ""                  # silently (gate.py); "" = unknown
    test_rows: Optional[int] = None          # rows accuracy was measured on (None = unknown or the full split)
    epoch_accuracy: Tuple[float, ...] = ()   # test accuracy after each epoch, in order
    epoch_time_s: Tuple[float, ...] = ()     # each epoch's training window in seconds
    co2e_kg: Optional[float] = None          # carbon (bertaccel/measure/carbon.py), the optional fifth score term
    # The summary's baseline and the gate's sweep check (report/baseline.py, gate.py).
    choices: Dict[str, str] = field(default_factory=dict)  # config group -> option, as the run logged them
    sweep: str = ""                          # the sweep_id tag; "" = a single run or a CSV row
    settings: Dict[str, str] = field(default_factory=dict)  # every logged setting, flattened (MLflow rows)

    def get(self, metric: str) -> Optional[float]:
        return getattr(self, metric)


def full_weights(weights: Sequence[float]) -> Tuple[float, ...]:
    """A strategy's weights for all of METRICS: four (the thesis' form) get w5 = 0."""
    return tuple(weights) + (0.0,) * (len(METRICS) - len(weights))


def column_max(rows: Sequence[Row]) -> Dict[str, Optional[float]]:
    out: Dict[str, Optional[float]] = {}
    for m in METRICS:
        values = [v for v in (r.get(m) for r in rows) if v is not None]
        out[m] = max(values) if values else None
    return out


def _over(value: Optional[float], top: Optional[float]) -> Optional[float]:
    """value / top; None stays None, and so does a value over a 0 (or missing) maximum."""
    return None if value is None or not top else value / top


def normalized(rows: Sequence[Row]) -> List[Dict[str, Optional[float]]]:
    """Table 5.2: each metric over its column maximum (None stays None; a 0 max stays 0)."""
    mx = column_max(rows)
    table = []
    for r in rows:
        table.append({m: _over(r.get(m), mx[m]) for m in METRICS})
    return table


def score(norm: Mapping[str, Optional[float]], weights: Sequence[float]) -> Tuple[Optional[float], List[str]]:
    """(score, metrics left out). None when no weighted metric is present. Four weights: w5 = 0."""
    weights = full_weights(weights)
    # metric index -> its value, where there is one (a 4-term table: no CO2e)
    present = {i: v for i, v in enumerate(norm.get(m) for m in METRICS) if v is not None}
    missing = [METRICS[i] for i in range(len(METRICS)) if i not in present and weights[i] > 0]
    total = sum(abs(w) for w in weights)
    have = sum(abs(weights[i]) for i in present)
    if have == 0:
        return None, missing
    scale = total / have if missing else 1.0
    return scale * sum(SIGNS[i] * weights[i] * v for i, v in present.items()), missing


@dataclass(frozen=True)
class OneRanking:
    """Strategies that rank the runs alike, so one best run stands for them all, and why."""
    strategies: List[str]
    reason: str


def time_ranking(rows: Sequence[Row], strategies: Mapping[str, Sequence[float]],
                 best: Mapping[str, Optional[int]]) -> Optional[OneRanking]:
    """When no run has energy or occupancy and cost is time times one rate for every run (one
    price per device-second), each strategy's score is its weight sum x time / max time: every
    strategy weighing time or cost ranks by time alone. None when that does not hold (or when
    ties let two of them pick different runs)."""
    if any(r.energy_kwh is not None or r.occupancy_pct is not None for r in rows):
        return None
    costs = any(r.cost_usd is not None for r in rows)
    if not costs:
        cause = "no run has energy_kwh, occupancy_pct or cost_usd"
    else:
        if any((r.cost_usd is None) != (r.time_s is None) or r.time_s == 0 for r in rows):
            return None
        # (cost and time are both set or both missing: checked above)
        rates = [c / t for c, t in ((r.cost_usd, r.time_s) for r in rows) if c is not None and t is not None]
        if not all(math.isclose(x, rates[0], rel_tol=1e-9) for x in rates):
            return None
        cause = (f"no run has energy_kwh or occupancy_pct, and every run's cost_usd is time_s x one rate "
                 f"({rates[0]:.4g} USD/s)")
    group = [s for s, w in strategies.items() if w[0] > 0 or (costs and w[1] > 0)]
    if len(group) < 2 or len({best[s] for s in group}) != 1:
        return None
    who = "every strategy" if len(group) == len(strategies) else "every strategy that weighs time" + (
        " or cost" if costs else "")
    return OneRanking(group, f"{cause}, so {who} ranks the runs by time alone (score = its weight sum x time_s / "
                             f"the largest time_s): one best run for all {len(group)}")


@dataclass
class Scored:
    strategies: Dict[str, Sequence[float]]
    normalized: List[Dict[str, Optional[float]]]
    scores: Dict[str, List[Optional[float]]]          # strategy -> score per row
    affected: Dict[int, List[str]]                      # row index -> metrics renormalized away
    eligible: List[bool]                                # passes the accuracy floor
    ineligible_reason: Dict[int, str]
    best: Dict[str, Optional[int]]                      # strategy -> row index
    one_ranking: Optional[OneRanking] = None            # strategies that rank alike (time_ranking)

    def best_lines(self) -> List[Tuple[str, List[str], Optional[int]]]:
        """(label, strategies, best row) to print: strategies that rank alike share one line."""
        one = self.one_ranking
        lines = []
        for s, b in self.best.items():
            if one is None or s not in one.strategies:
                lines.append((s, [s], b))
            elif s == one.strategies[0]:
                label = f"all {len(one.strategies)} strategies" if len(one.strategies) == len(self.best) \
                    else ", ".join(one.strategies)
                lines.append((label, list(one.strategies), b))
        return lines


def score_rows(rows: Sequence[Row], strategies: Mapping[str, Sequence[float]],
               accuracy_floor: Optional[float] = None, excluded: Optional[Mapping[int, str]] = None) -> Scored:
    """excluded: row index -> why that row may not be "best" (scored and shown all the same)."""
    norm = normalized(rows)
    scores: Dict[str, List[Optional[float]]] = {}
    affected: Dict[int, List[str]] = {}
    for name, w in strategies.items():
        scores[name] = []
        for i, n in enumerate(norm):
            s, missing = score(n, w)
            scores[name].append(s)
            if missing:
                affected[i] = sorted(set(affected.get(i, [])) | set(missing), key=METRICS.index)
    eligible, why = [], {}
    for i, r in enumerate(rows):
        ok = True
        if accuracy_floor is not None:
            if r.accuracy is None:
                ok, why[i] = False, "accuracy unknown"
            elif r.accuracy < accuracy_floor:
                ok, why[i] = False, f"accuracy {r.accuracy:.4f} < floor {accuracy_floor}"
        if excluded and i in excluded:
            ok, why[i] = False, "; ".join(filter(None, (why.get(i), excluded[i])))
        eligible.append(ok)
    best = {}
    for name, values in scores.items():
        candidates = [(v, i) for i, v in enumerate(values) if v is not None and eligible[i]]
        best[name] = min(candidates)[1] if candidates else None
    return Scored(dict(strategies), norm, scores, affected, eligible, why, best, time_ranking(rows, strategies, best))
