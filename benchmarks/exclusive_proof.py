"""Does sweep.concurrent's projection hold? The same sweep run twice, into two stores: one run at a
time (sweep.concurrent=1, each run timed over its whole training) and several runs sharing the
GPU (sweep.concurrent=N, each run's train time and energy projected from its exclusive window).
Per configuration, the alone runs' mean and 95 % t-interval over their repeats beside the shared
runs' projected mean: the projection holds where it falls inside the alone interval (issue 62).

    python benchmarks/exclusive_proof.py --alone sqlite:///alone.db --shared sqlite:///shared.db [--out t.md]

Also the two sweeps' wall times (their parent runs' start to end) and their training windows, so
the mode's gain is read from the same table.
"""
from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bertaccel.record.access import reader, sweep_parents  # noqa: E402
from bertaccel.record.tracking import search_runs  # noqa: E402
from bertaccel.report.repeats import Interval, t_interval  # noqa: E402

SEED = re.compile(r"(^|,)train\.seed=[^,]*")
FIGURES = ("train_time_s", "energy_kwh")


def finished(uri: str, experiment: str) -> Dict[str, List[Any]]:
    """The store's finished (trained) runs, by configuration: the run name without its seed."""
    groups: Dict[str, List[Any]] = defaultdict(list)
    for run in search_runs(uri, experiment, "tags.status = 'finished'"):
        if "train_time_s" in run.data.metrics:
            groups[SEED.sub("", run.info.run_name or "").strip(",") or "(default)"].append(run)
    return groups


def sweep_wall_s(uri: str, experiment: str) -> Optional[float]:
    """The sweeps' wall time: each parent run's start to end, summed (a resumed sweep: each part)."""
    parents = sweep_parents(uri, experiment)
    walls = [(p.info.end_time - p.info.start_time) / 1000 for p in parents if p.info.end_time]
    return sum(walls) if walls else None


def _iv(values: List[float]) -> Interval:
    return t_interval(values)


def _fmt(iv: Interval, scale: float = 1.0, digits: int = 2) -> str:
    if iv.mean is None:
        return "n/a"
    if iv.low is None or iv.high is None:
        return f"{iv.mean * scale:.{digits}f} (n={iv.n}: {iv.why})"
    return f"{iv.mean * scale:.{digits}f} [{iv.low * scale:.{digits}f}, {iv.high * scale:.{digits}f}]"


def verdict(alone: Interval, shared: Interval) -> str:
    if alone.mean is None or shared.mean is None:
        return "n/a"
    if alone.low is None or alone.high is None:
        return f"{shared.mean / alone.mean:.3f}x (no interval: {alone.why})"
    inside = alone.low <= shared.mean <= alone.high
    return f"{shared.mean / alone.mean:.3f}x, {'inside' if inside else 'OUTSIDE'}"


def table(alone_uri: str, shared_uri: str, experiment: str) -> Tuple[str, int, int]:
    alone, shared = finished(alone_uri, experiment), finished(shared_uri, experiment)
    rows = ["| configuration | n | train_time_s alone [95% CI] | projected (shared) | | energy J alone [95% CI] "
            "| projected (shared) | | accuracy alone / shared |",
            "|---|---|---|---|---|---|---|---|---|"]
    inside = total = 0
    for name in sorted(set(alone) & set(shared)):
        a = {f: _iv([r.data.metrics[f] for r in alone[name] if r.data.metrics.get(f) is not None]) for f in FIGURES}
        s = {f: _iv([r.data.metrics[f] for r in shared[name] if r.data.metrics.get(f) is not None]) for f in FIGURES}
        acc = [_iv([r.data.metrics.get("test_accuracy", float("nan")) for r in g[name]]) for g in (alone, shared)]
        cells = []
        for f, scale in (("train_time_s", 1.0), ("energy_kwh", 3.6e6)):
            v = verdict(a[f], s[f])
            total += v != "n/a" and "no interval" not in v
            inside += v.endswith("inside")
            cells += [_fmt(a[f], scale), _fmt(s[f], scale), v]
        rows.append(f"| {name} | {len(alone[name])}/{len(shared[name])} | " + " | ".join(cells)
                    + f" | {acc[0].mean:.4f} / {acc[1].mean:.4f} |")
    walls = []
    for label, uri, groups in (("alone", alone_uri, alone), ("shared", shared_uri, shared)):
        runs = [r for g in groups.values() for r in g]
        timed = sum(r.data.metrics["train_time_s"] for r in runs)  # (shared: projected to each whole run)
        windows = sum(r.data.metrics.get("window_time_s", r.data.metrics["train_time_s"]) for r in runs)
        wall = sweep_wall_s(uri, experiment)
        line = f"- {label}: {len(runs)} finished runs; train_time_s summed {timed:.1f} s; timed windows {windows:.1f} s"
        walls.append(line + ("; no sweep parent run with an end" if wall is None
                             else f"; sweep wall {wall:.1f} s ({wall / windows:.2f}x its windows)"))
    return "\n".join(rows + [""] + walls), inside, total


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--alone", required=True, help="tracking URI of the sweep.concurrent=1 runs")
    ap.add_argument("--shared", required=True, help="tracking URI of the sweep.concurrent=N runs")
    ap.add_argument("--experiment", default="bertaccel")
    ap.add_argument("--out", help="also write the table here (Markdown)")
    args = ap.parse_args(argv)
    for uri in (args.alone, args.shared):
        reader(uri)  # (a URI that is no store: its one line, from the record's door)
    text, inside, total = table(args.alone, args.shared, args.experiment)
    text += f"\n\nprojection inside the alone runs' interval: {inside} of {total} figures"
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
