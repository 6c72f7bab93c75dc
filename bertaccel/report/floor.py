"""The accuracy floor: which runs the answer may pick (issue 44, item 1).

A fast run that learned less is not an acceleration: the thesis compares encoders at the same
accuracy (Hardware Acceleration of Machine Learning, Table 4.8). So by default only runs within 1 point of the best test accuracy
may win: below it a run is still scored in every table (marked "excluded", so the tables stay
comparable with the thesis'), but never "best", and the answer names it. With repeats the best is
the configuration of best mean accuracy and the floor sits 1 point below the low end of its 95 %
interval, so a configuration is not left out for the noise of its own seeds.

    --accuracy-floor 0.85   a floor of your own (test accuracy as a fraction)
    --accuracy-floor off    no floor: every run may win, whatever its accuracy
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple, Union

from .repeats import Interval, group_rows, t_interval
from .scoring import Row

DEFAULT_POINTS = 1.0  # how far below the best a run may be and still win, in accuracy points
OFF = "off"


@dataclass(frozen=True)
class Floor:
    value: Optional[float]   # test accuracy as a fraction; None: no floor
    basis: str               # how it was set, as the report says it

    def passes(self, accuracy: Optional[float]) -> bool:
        return self.value is None or (accuracy is not None and accuracy >= self.value)  # (as score_rows)


def resolve(given: Union[None, str, float], rows: Sequence[Row]) -> Floor:
    """given: None (the default, 1 point below the best), 'off', or a fraction the user set."""
    if given == OFF:
        return Floor(None, "--accuracy-floor off: every run may win, whatever its accuracy")
    if given is not None:
        return Floor(float(given), f"--accuracy-floor {float(given):g}")
    best = _best(rows)
    if best is None:
        return Floor(None, "no floor: no run measured test accuracy")
    top, what = best
    # Rounded: 0.9 - 0.01 is 0.8899999... in binary, and a run at 0.89 sits on the floor, not below it.
    value = max(0.0, round(top - DEFAULT_POINTS / 100, 9))
    return Floor(value, f"{DEFAULT_POINTS:g} point below {what} (--accuracy-floor sets another, or off)")


def _best(rows: Sequence[Row]) -> Optional[Tuple[float, str]]:
    """(the accuracy the floor hangs from, how the report says it), None without any accuracy."""
    groups = group_rows(rows)
    repeated = any(len(g.members) > 1 for g in groups)
    if not repeated:
        scored = [(r.accuracy, r.name) for r in rows if r.accuracy is not None]
        if not scored:
            return None
        acc, name = max(scored)
        return acc, f"the best test accuracy, '{name}' at {acc:.4f}"
    best: Optional[Tuple[float, Interval, str, int]] = None  # (mean, interval, label, runs)
    for g in groups:
        values = [a for a in (rows[i].accuracy for i in g.members) if a is not None]
        if not values:
            continue
        iv = t_interval(values)
        assert iv.mean is not None  # the interval of one value or more has a mean
        if best is None or iv.mean > best[0]:
            best = (iv.mean, iv, g.label, len(values))
    if best is None:
        return None
    mean, iv, label, n = best
    if iv.low is None:  # one run of the best configuration: no interval
        return mean, f"the best test accuracy, '{label}' at {mean:.4f} (one run: no interval)"
    return iv.low, (f"the low end of the best configuration's 95 % interval, '{label}' ({n} runs: "
                    f"{mean:.4f}, interval from {iv.low:.4f})")
