"""A configuration against its baseline: the means over each one's repeats, and the one way every
surface writes them ("1.89x slower", "+18.6 % energy", "+1.90 pts").

The baseline is its configuration's mean (all its repeats), never its first run: the answer,
the table of every run against the baseline and the charts divide by the same figure.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence, Tuple

from .scoring import Row

CHANGED = ("time_s", "energy_kwh", "cost_usd")


@dataclass
class Change:
    """name's means over base's: ratio per column (run / baseline, per sample where the runs
    trained different amounts) and the accuracy change in points; null parts say why."""
    name: str
    ratio: Dict[str, Optional[float]] = field(default_factory=dict)
    accuracy_pts: Optional[float] = None
    why: Dict[str, str] = field(default_factory=dict)      # column -> why its change is null

    @property
    def speedup(self) -> Optional[float]:
        r = self.ratio.get("time_s")
        return None if not r else 1 / r

    def change_pct(self, column: str) -> Optional[float]:
        r = self.ratio.get(column)
        return None if r is None else (r - 1) * 100


def value(row: Row, column: str, per_sample: bool) -> Tuple[Optional[float], str]:
    """row's column, per sample when the runs trained different amounts; null with why."""
    v = row.get(column)
    if v is None:
        return None, f"{column} null: {row.extra.get(column, 'not measured')}"
    if per_sample:
        if not row.train_samples:
            return None, "train_samples unknown, and the runs trained different amounts"
        v = v / row.train_samples
    return v, ""


def mean(rows: Sequence[Row], members: Sequence[int], column: str, per_sample: bool) -> Tuple[Optional[float], str]:
    """The mean of column over a configuration's runs (one run without repeats); null when a run lacks it."""
    values = []
    for i in members:
        v, why = value(rows[i], column, per_sample)
        if v is None:
            return None, why
        values.append(v)
    return sum(values) / len(values), ""


def change(rows: Sequence[Row], name: str, runs: Sequence[int], base: Sequence[int], per_sample: bool) -> Change:
    """runs' means against base's (each a configuration's runs)."""
    out = Change(name)
    for col in CHANGED:
        b, why = mean(rows, base, col, per_sample)
        r, why_r = mean(rows, runs, col, per_sample)
        if b is None:
            out.why[col] = f"baseline's {why}"
        elif r is None:
            out.why[col] = why_r
        elif b == 0:
            out.why[col] = f"baseline's {col} is 0"
        if r is not None and b is not None and col not in out.why:  # (None set a why above)
            out.ratio[col] = r / b
        else:
            out.ratio[col] = None
    ba, why_b = mean(rows, base, "accuracy", False)
    ra, why_r = mean(rows, runs, "accuracy", False)
    out.accuracy_pts = None if ba is None or ra is None else (ra - ba) * 100
    if out.accuracy_pts is None:
        out.why["accuracy"] = f"baseline's {why_b}" if ba is None else why_r
    return out


def speed_text(s: Optional[float], why: str = "no baseline") -> str:
    """'1.50x faster', '1.89x slower' (never a bare 0.53x under 'speed-up'), 'as fast'."""
    if s is None:
        return f"null ({why})"
    if f"{s:.2f}" == "1.00":
        return "as fast (1.00x)"
    return f"{s:.2f}x faster" if s > 1 else f"{1 / s:.2f}x slower"


def pct_text(c: Change, column: str) -> str:
    pct = c.change_pct(column)
    return f"null ({c.why.get(column, 'no baseline')})" if pct is None else f"{pct:+.1f} %"


def pts_text(c: Change) -> str:
    return f"null ({c.why.get('accuracy', 'no baseline')})" if c.accuracy_pts is None else f"{c.accuracy_pts:+.2f} pts"


def effect_text(c: Change) -> str:
    """'1.89x slower, +18.6 % energy, +89.1 % cost, +1.90 pts accuracy' (null parts left out)."""
    parts = []
    if c.speedup is not None:
        parts.append(speed_text(c.speedup))
    for col, word in (("energy_kwh", "energy"), ("cost_usd", "cost")):
        if c.change_pct(col) is not None:
            parts.append(f"{pct_text(c, col)} {word}")
    if c.accuracy_pts is not None:
        parts.append(f"{c.accuracy_pts:+.2f} pts accuracy")
    return ", ".join(parts) or "no change measured (" + "; ".join(dict.fromkeys(c.why.values())) + ")"
