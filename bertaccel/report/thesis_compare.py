"""The thesis' Tables 5.1-5.4 (Hardware Acceleration of Machine Learning, section 5.1) beside ours.

The thesis scored six workloads, each adding one technique to the one before (fused Adan, then
mixed precision, then the LightSeq encoder, then 2 and 4 GPUs), fine-tuning BERT on IMDb for 3
epochs at batch 16 per device. Each workload is mapped here to the configuration of ours that does
the same thing; our figure for it is the mean of the store's finished runs of that configuration.
Both sides are normalized and scored by report/scoring.py, the report's one scoring (the thesis'
own Table 5.1 through it gives its printed Tables 5.2 and 5.4: tests/test_thesis_compare.py), and
the two rankings of the workloads both have are compared per strategy with Kendall's tau.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from .repeats import Interval, t_interval
from .scoring import STRATEGIES, Row, normalized, score

BATCH_SIZE = 16  # "the batch size is 16 for each device" (the thesis, section 4.x, its Adan runs)


@dataclass(frozen=True)
class Workload:
    """One row of the thesis' Table 5.1: its name, its figures, and the configuration of ours that
    does the same (config group -> option; num_gpus as the run logs it)."""
    name: str
    short: str                       # the thesis' own column name in Table 5.4
    choices: Tuple[Tuple[str, str], ...]
    time_s: float
    cost_usd: float
    energy_kwh: float
    occupancy_pct: float
    num_gpus: int = 1

    def row(self) -> Row:
        return Row(name=self.name, time_s=self.time_s, cost_usd=self.cost_usd, energy_kwh=self.energy_kwh,
                   occupancy_pct=self.occupancy_pct)

    def runs(self, rows: Sequence[Row]) -> List[Row]:
        """The store's runs of this workload's configuration."""
        return [r for r in rows if r.batch_size == BATCH_SIZE and (r.num_gpus or 1) == self.num_gpus
                and all(r.choices.get(k) == v for k, v in self.choices)]

    def label(self) -> str:
        gpus = f" num_gpus={self.num_gpus}" if self.num_gpus > 1 else ""
        return " ".join(f"{k}={v}" for k, v in self.choices) + gpus


_FUSED_FP16 = (("encoder", "fused"), ("optimizer", "adan_fused"), ("precision", "fp16"))
# Table 5.1, as printed (time s, cost USD, energy kWh, occupancy %).
THESIS: Tuple[Workload, ...] = (
    Workload("Unfused Single Adan", "Unfused Adan",
             (("encoder", "hf"), ("optimizer", "adan_single"), ("precision", "fp32")), 2286.85, 1.75, 0.1425, 48.66),
    Workload("Fused Multi Adan", "Fused Adan",
             (("encoder", "hf"), ("optimizer", "adan_fused"), ("precision", "fp32")), 2034.45, 1.55, 0.1243, 46.64),
    Workload("Mixed precision", "FP16",
             (("encoder", "hf"), ("optimizer", "adan_fused"), ("precision", "fp16")), 813.34, 0.62, 0.0425, 58.4),
    Workload("FP16 LightSeq", "FP16_ls", _FUSED_FP16, 535.45, 0.41, 0.0325, 41.48),
    Workload("FP16 LightSeq 2GPU", "2GPU", _FUSED_FP16, 457.55, 0.70, 0.0389, 22.37, num_gpus=2),
    Workload("FP16 LightSeq 4GPU", "4GPU", _FUSED_FP16, 281.41, 0.86, 0.0441, 16.43, num_gpus=4),
)
MEAN_COLUMNS = ("time_s", "cost_usd", "energy_kwh", "occupancy_pct", "accuracy")


@dataclass(frozen=True)
class Ours:
    """Our figure for one workload: each column's mean and interval over the store's runs of it."""
    workload: Workload
    runs: Tuple[Row, ...]
    columns: Mapping[str, Interval]

    def row(self) -> Optional[Row]:
        """The means as one row to score, or None when the store has no run of it."""
        if not self.runs:
            return None
        c = self.columns
        return Row(name=self.workload.name, time_s=c["time_s"].mean, cost_usd=c["cost_usd"].mean,
                   energy_kwh=c["energy_kwh"].mean, occupancy_pct=c["occupancy_pct"].mean, accuracy=c["accuracy"].mean)


def ours(rows: Sequence[Row], workloads: Sequence[Workload] = THESIS) -> List[Ours]:
    out = []
    for w in workloads:
        runs = w.runs(rows)
        out.append(Ours(w, tuple(runs), {c: t_interval([v for v in (r.get(c) for r in runs) if v is not None])
                                         for c in MEAN_COLUMNS}))
    return out


@dataclass(frozen=True)
class Ranked:
    """Both sides' scores per strategy over the workloads both measured, and Kendall's tau between them."""
    names: Tuple[str, ...]                         # the workloads both have, in the thesis' order
    thesis: Dict[str, Tuple[float, ...]]            # strategy -> score per name (lower is better)
    ours: Dict[str, Tuple[float, ...]]
    tau: Dict[str, Tuple[float, float]]             # strategy -> (tau, two-sided p)


def scores(rows: Sequence[Row], strategies: Mapping[str, Sequence[float]] = STRATEGIES
           ) -> Dict[str, Tuple[Optional[float], ...]]:
    """Table 5.4 for rows: each strategy's score per row, normalized over these rows (Table 5.2)."""
    norm = normalized(rows)
    return {s: tuple(score(n, w)[0] for n in norm) for s, w in strategies.items()}


def _scored(value: Optional[float], name: str) -> float:
    """A score to rank by: every compared row has a time (its store says why where it has not)."""
    if value is None:
        raise ValueError(f"{name}: no score (none of time, cost, energy, occupancy measured)")
    return value


def ranked(measured: Sequence[Ours], strategies: Mapping[str, Sequence[float]] = STRATEGIES) -> Ranked:
    """Each side normalized over its own rows (the thesis over its six, as printed; ours over what the
    store has), then both restricted to the workloads both have."""
    from scipy.stats import kendalltau

    mine = [(o.workload.name, o.row()) for o in measured]
    ours_rows = [r for _, r in mine if r is not None]
    common = tuple(n for n, r in mine if r is not None)
    theirs = scores([w.row() for w in THESIS], strategies)
    mine_scores = scores(ours_rows, strategies)
    index = {w.name: i for i, w in enumerate(THESIS)}
    t = {s: tuple(_scored(v[index[n]], n) for n in common) for s, v in theirs.items()}
    o = {s: tuple(_scored(v[i], common[i]) for i in range(len(common))) for s, v in mine_scores.items()}
    tau: Dict[str, Tuple[float, float]] = {}
    for s in strategies:
        result = kendalltau(t[s], o[s])
        tau[s] = (float(result.statistic), float(result.pvalue))
    return Ranked(common, t, o, tau)


# The page's tables (docs/results/thesis-h200.md, filled by report/docs_figures.py).
def _cell(iv: Interval, fmt: str) -> str:
    if iv.mean is None:
        return "-"
    if iv.low is None or iv.high is None:
        return f"{fmt.format(iv.mean)} ({iv.why})"
    return f"{fmt.format(iv.mean)} [{fmt.format(iv.low)}, {fmt.format(iv.high)}]"


_FORMATS = {"time_s": "{:.1f}", "cost_usd": "{:.3f}", "energy_kwh": "{:.4f}", "occupancy_pct": "{:.1f}",
            "accuracy": "{:.4f}"}


def table51(measured: Sequence[Ours], why_missing: str) -> str:
    """Table 5.1, the thesis' figure then ours (mean [95 % t-interval] of n runs) per metric."""
    head = ("| workload (thesis) | ours | n | time s | cost USD | energy kWh | occupancy % | test accuracy |\n"
            "|---|---|---|---|---|---|---|---|")
    lines = [head]
    for o in measured:
        w = o.workload
        if not o.runs:
            lines.append(f"| {w.name} | `{w.label()}` | 0 | {w.time_s} / - | {w.cost_usd} / - | {w.energy_kwh} / - | "
                         f"{w.occupancy_pct} / - | not measured: {why_missing} |")
            continue
        c = o.columns
        lines.append(f"| {w.name} | `{w.label()}` | {len(o.runs)} | {w.time_s} / {_cell(c['time_s'], _FORMATS['time_s'])}"
                     f" | {w.cost_usd} / {_cell(c['cost_usd'], _FORMATS['cost_usd'])}"
                     f" | {w.energy_kwh} / {_cell(c['energy_kwh'], _FORMATS['energy_kwh'])}"
                     f" | {w.occupancy_pct} / {_cell(c['occupancy_pct'], _FORMATS['occupancy_pct'])}"
                     f" | {_cell(c['accuracy'], _FORMATS['accuracy'])} |")
    return "\n".join(lines)


def _order(names: Sequence[str], values: Sequence[float]) -> str:
    shorts = {w.name: w.short for w in THESIS}
    return " < ".join(shorts[n] for _, n in sorted(zip(values, names)))


def table54(r: Ranked) -> str:
    """Table 5.4 over the workloads both have: each strategy's scores, thesis / ours, the two
    orders (best first) and Kendall's tau between them."""
    shorts = {w.name: w.short for w in THESIS}
    head = ("| strategy | " + " | ".join(shorts[n] for n in r.names) + " | thesis order | our order | Kendall's tau (p) |\n"
            "|---|" + "---|" * len(r.names) + "---|---|---|")
    lines = [head]
    for s in r.thesis:
        cells = " | ".join(f"{t:.3f} / {o:.3f}" for t, o in zip(r.thesis[s], r.ours[s]))
        tau, p = r.tau[s]
        lines.append(f"| {s} | {cells} | {_order(r.names, r.thesis[s])} | {_order(r.names, r.ours[s])} | "
                     f"{tau:+.2f} ({p:.2f}) |")
    return "\n".join(lines)


def tau_summary(r: Ranked) -> str:
    """One sentence: the range of tau over the strategies and how many of them agree on the best."""
    taus = [t for t, _ in r.tau.values()]
    same_best = sum(1 for s in r.thesis if min(zip(r.thesis[s], r.names))[1] == min(zip(r.ours[s], r.names))[1])
    lo, hi = min(taus), max(taus)
    spread = f"{lo:+.2f}" if round(lo, 2) == round(hi, 2) else f"{lo:+.2f} to {hi:+.2f}"
    return (f"Kendall's tau between the thesis' order and ours is {spread} over the {len(r.thesis)} strategies "
            f"({len(r.names)} workloads, so tau moves in steps of {4 / (len(r.names) * (len(r.names) - 1)):.2f}; "
            f"smallest two-sided p {min(p for _, p in r.tau.values()):.2f}); the best workload is the same under "
            f"{same_best} of {len(r.thesis)} strategies")


def grid_axes() -> Dict[str, List[str]]:
    """The thesis grid's axes as its study file sweeps them (bertaccel/sweeps/thesis_grid.yaml)."""
    from pathlib import Path

    import yaml

    study = Path(__file__).resolve().parents[1] / "sweeps" / "thesis_grid.yaml"
    params = yaml.safe_load(study.read_text())["hydra"]["sweeper"]["params"]
    return {k: [v.strip() for v in str(text).split(",")] for k, text in params.items()}


def _in_grid(r: Row, axes: Mapping[str, Sequence[str]]) -> bool:
    have = {**r.choices, "train.batch_size": str(r.batch_size)}
    return all(have.get(k) in values for k, values in axes.items())


@dataclass(frozen=True)
class Configuration:
    """One configuration of the thesis grid that the store has: its value on each swept axis, its
    runs and each column's mean and interval over them."""
    values: Tuple[Tuple[str, str], ...]          # swept axis -> value, in the study file's order
    runs: Tuple[Row, ...]
    columns: Mapping[str, Interval]

    def name(self, without: Sequence[str] = ()) -> str:
        return " / ".join(v for k, v in self.values if k not in without)

    @property
    def batch(self) -> str:
        return dict(self.values)["train.batch_size"]


def configurations(rows: Sequence[Row], axes: Optional[Mapping[str, Sequence[str]]] = None) -> List[Configuration]:
    """The store's runs that are configurations of the thesis grid, one entry per configuration
    (report/repeats.group_rows: the repeats of one configuration together), in the store's order."""
    from .repeats import group_rows

    axes = grid_axes() if axes is None else axes
    keys = [k for k in axes if len(axes[k]) > 1]
    mine = [r for r in rows if _in_grid(r, axes)]
    out = []
    for g in group_rows(mine):
        runs = tuple(mine[i] for i in g.members)
        first = {**runs[0].choices, "train.batch_size": str(runs[0].batch_size)}
        iv = {c: t_interval([v for v in (r.get(c) for r in runs) if v is not None]) for c in MEAN_COLUMNS}
        out.append(Configuration(tuple((k, first[k]) for k in keys), runs, iv))
    return out


def grid_slice(rows: Sequence[Row]) -> str:
    """The store's runs that are configurations of the thesis grid: one line per configuration
    (mean [95 % t-interval] of its runs), fastest first."""
    axes = grid_axes()
    keys = [k for k in axes if len(axes[k]) > 1]
    lines = ["| " + " / ".join(keys) + " | n | time s | energy kWh | test accuracy |", "|---|---|---|---|---|"]
    for c in sorted(configurations(rows, axes), key=lambda c: (c.columns["time_s"].mean or 0.0, c.name())):
        iv = c.columns
        lines.append(f"| {c.name()} | {len(c.runs)} | {_cell(iv['time_s'], '{:.1f}')} | "
                     f"{_cell(iv['energy_kwh'], '{:.4f}')} | {_cell(iv['accuracy'], '{:.4f}')} |")
    return "\n".join(lines)


@dataclass(frozen=True)
class Coverage:
    """How much of the grid at one batch size the store has, with 3 repeats the goal."""
    batch: str
    configurations: int                 # the grid's configurations at this batch size
    present: Tuple[Configuration, ...]  # those the store has a finished run of
    missing: Tuple[str, ...]            # those it has none of (names without the batch size)
    repeats: int = 3

    @property
    def runs(self) -> int:
        return sum(min(len(c.runs), self.repeats) for c in self.present)

    def short(self) -> Dict[int, int]:
        """Run count -> how many present configurations have that many, for those under the repeats."""
        counts: Dict[int, int] = {}
        for c in self.present:
            if len(c.runs) < self.repeats:
                counts[len(c.runs)] = counts.get(len(c.runs), 0) + 1
        return counts


def coverage(rows: Sequence[Row], axes: Optional[Mapping[str, Sequence[str]]] = None,
             repeats: int = 3) -> List[Coverage]:
    """Per batch size of the grid: its configurations the store has, their runs, those missing."""
    import itertools

    axes = grid_axes() if axes is None else axes
    keys = [k for k in axes if len(axes[k]) > 1 and k != "train.batch_size"]
    have = configurations(rows, axes)
    out = []
    for batch in axes["train.batch_size"]:
        present = tuple(c for c in have if c.batch == batch)
        names = {c.name(("train.batch_size",)) for c in present}
        every = [" / ".join(v) for v in itertools.product(*(axes[k] for k in keys))]
        out.append(Coverage(batch, len(every), present, tuple(n for n in every if n not in names), repeats))
    return out


def _span(values: Sequence[float], fmt: str) -> str:
    """'1.25-1.78', '-0.19 to +0.25' (one value when they round alike)."""
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo} to {hi}" if lo.startswith(("-", "+")) else f"{lo}-{hi}"


def _mean(iv: Interval, fmt: str) -> str:
    return "-" if iv.mean is None else fmt.format(iv.mean)


def _runs_word(n: int) -> str:
    return {1: "once", 2: "twice"}.get(n, f"{n} times")


def coverage_lines(cov: Sequence[Coverage]) -> str:
    """One line per batch size: how much of the grid the store has, and what it lacks."""
    lines = []
    for c in cov:
        head = (f"- batch {c.batch}: {len(c.present)} of its {c.configurations} configurations, "
                f"{c.runs} of its {c.repeats * c.configurations} runs with {c.repeats} repeats")
        lacks = []
        if not c.present:
            lacks.append("no run yet")
        elif c.missing:
            lacks.append("no run of " + ", ".join(c.missing))
        lacks += [f"{k} configuration{'s' if k > 1 else ''} ran {_runs_word(n)}"
                  for n, k in sorted(c.short().items())]
        lines.append(head + (f" ({'; '.join(lacks)})" if lacks else ""))
    total = sum(c.configurations for c in cov)
    lines.append(f"- the whole grid: {sum(len(c.present) for c in cov)} of {total} configurations, "
                 f"{sum(c.runs for c in cov)} of {cov[0].repeats * total} runs")
    return "\n".join(lines)


def batch_pairs(rows: Sequence[Row], small: str = "16", large: str = "32"
                ) -> List[Tuple[Configuration, Configuration]]:
    """The configurations the store has at both batch sizes, each as (at small, at large), in the
    study file's order of the other axes."""
    axes = grid_axes()
    have = configurations(rows, axes)
    at = {b: {tuple(kv for kv in c.values if kv[0] != "train.batch_size"): c for c in have if c.batch == b}
          for b in (small, large)}

    def order(values: Tuple[Tuple[str, str], ...]) -> Tuple[int, ...]:
        return tuple(list(axes[k]).index(v) for k, v in values)
    return [(at[small][v], at[large][v]) for v in sorted(at[small], key=order) if v in at[large]]


def _change(small: Configuration, large: Configuration) -> Tuple[float, float, float]:
    """The larger batch against the smaller: speed-up, energy ratio, accuracy change in points."""
    t, e, a = ((small.columns[k].mean or 0.0, large.columns[k].mean or 0.0)
               for k in ("time_s", "energy_kwh", "accuracy"))
    return t[0] / (t[1] or 1.0), e[1] / (e[0] or 1.0), 100 * (a[1] - a[0])


def batch_table(pairs: Sequence[Tuple[Configuration, Configuration]]) -> str:
    """Each configuration at both batch sizes: runs, mean time, energy and accuracy (mean [95 %
    t-interval] where it has 2 runs or more), the speed-up and whether the two time intervals overlap."""
    if not pairs:
        return "No configuration has runs at both batch sizes yet."
    a, b = pairs[0][0].batch, pairs[0][1].batch
    lines = [f"| encoder / optimizer / precision | n at {a} / {b} | time s at {a} | time s at {b} | "
             f"speed-up | energy kWh at {a} / {b} | test accuracy at {a} / {b} |",
             "|---|---|---|---|---|---|---|"]
    for s, l in pairs:
        ts, tl = s.columns["time_s"], l.columns["time_s"]
        overlap = {True: ", intervals overlap", False: ", intervals apart", None: ""}[ts.overlaps(tl)]
        both = [f"{_mean(s.columns[k], '{:.4f}')} / {_mean(l.columns[k], '{:.4f}')}" for k in ("energy_kwh", "accuracy")]
        lines.append(f"| {s.name(('train.batch_size',))} | {len(s.runs)} / {len(l.runs)} | "
                     f"{_cell(ts, '{:.1f}')} | {_cell(tl, '{:.1f}')} | "
                     f"{_change(s, l)[0]:.2f}x{overlap} | {both[0]} | {both[1]} |")
    return "\n".join(lines)


def batch_summary(pairs: Sequence[Tuple[Configuration, Configuration]]) -> str:
    """One sentence over the pairs: the range of speed-ups, of energy ratios and of accuracy changes."""
    if not pairs:
        return "no configuration has runs at both batch sizes yet"
    a, b = pairs[0][0].batch, pairs[0][1].batch
    speed, energy, points = zip(*(_change(s, l) for s, l in pairs))
    n = len(pairs)
    return (f"over the {n} configuration{'s' if n > 1 else ''} run at both, batch {b} trains "
            f"{_span(speed, '{:.2f}')}x as fast as batch {a} with {_span(energy, '{:.2f}')} of its energy, "
            f"and its test accuracy differs by {_span(points, '{:+.2f}')} points")


def steps(measured: Sequence[Ours]) -> str:
    """Each workload against the one before it (the thesis adds one technique per row): the thesis'
    speed-up and energy saving beside ours, and whether our two time intervals overlap (then the
    step is within the run-to-run noise of our repeats)."""
    have = [o for o in measured if o.runs]
    lines = ["| step | thesis: speed-up / energy ratio | ours: speed-up / energy ratio | our times' intervals |",
             "|---|---|---|---|"]
    for before, after in zip(have, have[1:]):
        a, b = before.workload, after.workload
        t_ours = (before.columns["time_s"].mean or 0.0) / (after.columns["time_s"].mean or 1.0)
        e_ours = (after.columns["energy_kwh"].mean or 0.0) / (before.columns["energy_kwh"].mean or 1.0)
        overlap = before.columns["time_s"].overlaps(after.columns["time_s"])
        noise = {True: "overlap: within the noise", False: "apart", None: "no interval"}[overlap]
        lines.append(f"| {a.short} -> {b.short} | {a.time_s / b.time_s:.2f}x / {b.energy_kwh / a.energy_kwh:.2f} | "
                     f"{t_ours:.2f}x / {e_ours:.2f} | {noise} |")
    return "\n".join(lines)
