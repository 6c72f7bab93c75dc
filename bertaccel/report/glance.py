"""Results at a glance: docs/results/at-a-glance.md, generated from the MLflow stores the
benchmarks wrote, one table per store, grouped by GPU.

    python -m bertaccel.report.glance --out docs/results/at-a-glance.md [--manifest docs/results/stores/manifest.yaml]

Each table is the report's own effects table (effects.py: each swept value against its axis's
reference, the other axes held equal), with a verdict that reuses the report's judgements: a
speed-up is "within noise" where the 95 % t-intervals of the two configurations' times overlap
(repeats.py, the test the answer uses for a tie), and an acceleration "costs accuracy" where its
mean change is more than a point below the reference (floor.py's default floor). The GPU and the
dates come from the store (the device_name tag, the runs' start times); the manifest gives what a
store does not carry: a title and the command as a user types it (the recorded overrides hold the
measuring machine's paths and leave out --config-name), checked against the store's overrides.
"""
from __future__ import annotations

import gzip
import shutil
import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from .args import OneLineParser
from .baseline import choose_baselines, named_row
from .data import ReportInputError
from .effects import Effect, Effects, effects, effects_tables
from .floor import DEFAULT_POINTS
from .headline import answer_table, headline
from .labels import relabel
from .repeats import Interval, group_rows, t_interval
from .scoring import Row
from .summary import Answer, decided
from .timing import time_view

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "docs" / "results" / "stores" / "manifest.yaml"
PAGE = ROOT / "docs" / "results" / "at-a-glance.md"
COMMAND = "python -m bertaccel.report.glance --out docs/results/at-a-glance.md"
EXPERIMENT = "bertaccel"
FIELDS = ("store", "sweep", "title", "command")


@dataclass
class Entry:
    store: str      # the .db.gz, relative to the repository root (or absolute)
    sweep: str      # its sweep id
    title: str
    command: str    # as a user types it
    # optional: the run name the report's --baseline would be given (each setting is then
    # measured against that run's value): for sweeps without the config groups' defaults, where
    # the report's own choice is the slowest run
    baseline: Optional[str] = None


@dataclass
class Table:
    entry: Entry
    device: str
    dates: str
    rows: List[Row]
    found: Effects
    cells: List[List[str]]
    headers: List[str]
    answer: Optional[Answer] = None   # the report's answer for this store (summary.decided)


def load_manifest(path: Path) -> List[Entry]:
    import yaml

    if not path.is_file():
        raise ReportInputError(f"--manifest {path}: no such file; give the stores' manifest.yaml")
    try:
        node = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ReportInputError(f"--manifest {path}: not YAML ({str(e).splitlines()[0]})") from None
    stores = node.get("stores") if isinstance(node, dict) else None
    if not isinstance(stores, list) or not stores:
        raise ReportInputError(f"--manifest {path}: expected a list 'stores:' of entries with {', '.join(FIELDS)}")
    out = []
    for k, item in enumerate(stores, 1):
        given = item if isinstance(item, dict) else {}
        missing = [f for f in FIELDS if not (isinstance(given.get(f), str) and given[f].strip())]
        if missing:
            raise ReportInputError(f"--manifest {path}: entry {k} lacks {', '.join(missing)} (each entry needs "
                                   f"{', '.join(FIELDS)})")
        base = given.get("baseline")
        if base is not None and not (isinstance(base, str) and base.strip()):
            raise ReportInputError(f"--manifest {path}: entry {k}'s baseline must be a run name (as the report's "
                                   f"--baseline takes)")
        store, sweep, title, command = (given[f].strip() for f in FIELDS)
        out.append(Entry(store, sweep, title, command, baseline=base.strip() if base else None))
    return out


def _items(text: str) -> Dict[str, str]:
    return dict(w.split("=", 1) for w in text.split() if "=" in w and not w.startswith("-"))


def _same(key: str, mine: str, recorded: str) -> bool:
    """A path is compared by its last two parts: the store names the measuring machine's folders."""
    if key.endswith("_path"):
        return Path(mine).parts[-2:] == Path(recorded).parts[-2:]
    return mine == recorded


def check_command(entry: Entry, recorded: str) -> None:
    """The manifest's command against the store's sweep_overrides: each override it gives was
    given to that sweep (a study's own axes are in the store only), and --config-name X is the
    study the sweep id names."""
    words = entry.command.split()
    if words[:4] != ["python", "-m", "bertaccel.run", "-m"]:
        raise ReportInputError(f"manifest entry {entry.store}: the command should start 'python -m bertaccel.run -m'")
    given, stored = _items(entry.command), _items(recorded)
    wrong = [f"{k}={v}" for k, v in given.items() if k not in stored or not _same(k, v, stored[k])]
    if wrong:
        raise ReportInputError(f"manifest entry {entry.store}: {' '.join(wrong)} is not what sweep {entry.sweep} "
                               f"ran with ({recorded}); fix the command or the store")
    study = words[words.index("--config-name") + 1] if "--config-name" in words[:-1] else "config"
    if not entry.sweep.startswith(f"{study}-"):
        raise ReportInputError(f"manifest entry {entry.store}: sweep {entry.sweep} is not of --config-name {study}")


def _day(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d")


def read(entry: Entry, root: Path = ROOT) -> Table:
    from bertaccel.record.access import start_times_ms, sweep_parents

    from . import load_rows

    path = root / entry.store
    if not path.is_file():
        raise ReportInputError(f"manifest entry {entry.store}: no such file")
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "store.db"
        try:
            with gzip.open(path) as src, db.open("wb") as dst:
                shutil.copyfileobj(src, dst)
        except OSError as e:
            raise ReportInputError(f"manifest entry {entry.store}: not a gzipped store ({e})") from None
        uri = f"sqlite:///{db}"
        loaded = load_rows(uri, EXPERIMENT, entry.sweep)
        labels = relabel(loaded)  # (the report's own names for the runs: the answer names them alike)
        view = time_view(loaded)
        rows = view.rows
        starts = sorted(start_times_ms(uri, [r.run_id for r in rows]))
        parents = sweep_parents(uri, EXPERIMENT, entry.sweep)
    if not parents:
        raise ReportInputError(f"manifest entry {entry.store}: no parent run of sweep {entry.sweep} in it")
    check_command(entry, parents[0].data.params.get("sweep_overrides", ""))
    devices = sorted({r.device or "unknown" for r in rows})
    if len(devices) > 1:
        raise ReportInputError(f"manifest entry {entry.store}: its runs measured on {', '.join(devices)}; "
                               "one GPU per table")
    first, last = _day(starts[0]), _day(starts[-1])
    given = None
    if entry.baseline is not None:
        given = named_row(rows, entry.baseline, labels.ids_of(entry.baseline))
        if given is None:
            raise ReportInputError(f"manifest entry {entry.store}: baseline {entry.baseline!r} is no run of sweep "
                                   f"{entry.sweep} (e.g. {rows[0].name!r})")
    bases = choose_baselines(rows, given).indices  # (one per like-for-like group)
    found = effects(rows, bases)
    ((_, _, headers, cells),) = effects_tables(rows, bases, view.basis.label) or (("", "", [], []),)
    ans = decided(view, given)[2]  # the report's own decision: the same winners and numbers
    return Table(entry, devices[0], first if first == last else f"{first} to {last}", rows, found, cells, headers, ans)


def answer_section(ans: Answer) -> List[str]:
    """The report's answer for a store: its headline and, per line of strategies, the answer
    table's own cells (winner, speed, accuracy change, how sure)."""
    (_, _, headers, cells) = answer_table(ans, time_view([]).basis.label)
    keep = [headers.index(h) for h in ("strategy", "winner", "speed vs baseline", "accuracy change", "how sure")]
    out = [f"**The answer** (the report's, default accuracy floor): {headline(ans)}", "",
           "| " + " | ".join(headers[k] for k in keep) + " |", "|" + "---|" * len(keep)]
    out += ["| " + " | ".join(c[k].replace("|", "/") for k in keep) + " |" for c in cells]
    return out + [""]


def _interval(rows: Sequence[Row], members: Sequence[int], col: str, per_sample: bool) -> Interval:
    values = []
    for i in members:
        v = rows[i].get(col)
        if v is not None and per_sample and col != "accuracy":  # (as effects.py compares them)
            samples = rows[i].train_samples
            v = v / samples if samples else None
        if v is not None:
            values.append(v)
    return t_interval(values)


def _below(a: Interval, b: Interval) -> bool:
    """a's mean below b's, for intervals with ends (those have means)."""
    assert a.mean is not None and b.mean is not None
    return a.mean < b.mean


def _judged(a: Interval, b: Interval) -> str:
    """Time interval a against b: unjudged (either has no ends), within noise, faster or slower."""
    apart = a.overlaps(b)
    return "unjudged" if apart is None else "within noise" if apart else "faster" if _below(a, b) else "slower"


def verdict(rows: Sequence[Row], e: Effect, per_sample: bool) -> str:
    """The speed-up within noise or not, pair by pair, and what it costs in accuracy."""
    n = len(e.pairs)
    if not n:
        return "not measured: no pair"
    count = {"faster": 0, "slower": 0, "within noise": 0, "unjudged": 0}
    lower, deltas = 0, []
    for at, ref in e.pairs:
        a, b = (_interval(rows, c.members, "time_s", per_sample) for c in (at, ref))
        count[_judged(a, b)] += 1
        a, b = (_interval(rows, c.members, "accuracy", False) for c in (at, ref))
        lower += a.overlaps(b) is False and _below(a, b)
        if a.mean is not None and b.mean is not None:
            deltas.append((a.mean - b.mean) * 100)
    judged = n - count["unjudged"]
    if not judged:
        speed = "speed not judged (one run each)"
    else:  # the most frequent judgement first, in bold, with in how many pairs
        said = sorted((k for k in ("within noise", "faster", "slower") if count[k]), key=lambda k: -count[k])
        speed = ", ".join(f"**{k}**{_of(count[k], n)}" if j == 0 else f"{k} ({count[k]})" for j, k in enumerate(said))
        if count["unjudged"]:
            speed += f", not judged ({count['unjudged']}: one run)"
    d = sum(deltas) / len(deltas) if deltas else None
    if d is None:
        acc = "accuracy not measured"
    elif round(d, 9) < -DEFAULT_POINTS:  # (as floor.py: a run exactly at the floor passes it)
        acc = f"**costs {-d:.2f} pts** of accuracy"
    elif lower:
        acc = f"accuracy lower{_of(lower, n)}"
    elif round(d, 9) > DEFAULT_POINTS:
        acc = f"gains {d:.2f} pts of accuracy"
    else:
        acc = f"accuracy within {DEFAULT_POINTS:g} pt"
    return f"{speed}; {acc}"


def _of(k: int, n: int) -> str:
    """In how many of the n pairs: '' for one pair."""
    return "" if n == 1 else " (both)" if k == n == 2 else f" (all {n})" if k == n else f" ({k} of {n})"


def _count(n: int) -> str:
    return f"{n:,}"


def _section(t: Table) -> List[str]:
    groups = group_rows(t.rows)
    sizes = sorted({len(g.members) for g in groups})
    each = (f"{sizes[0]} runs each" if sizes[0] > 1 else "one run each") if len(sizes) == 1 else \
        f"{sizes[0]} to {sizes[-1]} runs each"
    r = t.rows[0]
    data = f"`model={r.choices.get('model', '?')}` on {r.dataset or '?'}"
    if r.train_rows:
        data += f", {_count(r.train_rows)} train rows"
    if r.test_rows:
        data += f", {_count(r.test_rows)} test rows"
    if r.epochs:
        data += f", {r.epochs:g} epoch{'s' if r.epochs != 1 else ''}"
    refs = "; ".join(f"{a.key}: {a.reference} ({a.why})" for a in t.found.axes)
    out = [f"### {t.entry.title}: {t.device}, {t.dates}", "",
           f"- Command: `{t.entry.command}`",
           f"- Store: `{t.entry.store}`, sweep `{t.entry.sweep}`: {len(t.rows)} runs, {len(groups)} configurations, "
           f"{each}; {data}",
           f"- Full report: `gunzip -k {t.entry.store}`, then `python -m bertaccel.report --uri "
           f"sqlite:///{t.entry.store[:-3]} --sweep {t.entry.sweep}"
           + (f" --baseline {t.entry.baseline}`" if t.entry.baseline else "`"),
           f"- In the MLflow UI, with the report on the sweep's parent run: `python -m bertaccel.report.open_store "
           f"{t.entry.store} --to {Path(t.entry.store).name.removesuffix('.db.gz')}`, then the `mlflow ui` command "
           "it prints",
           f"- Each setting against: {refs}", ""]
    if t.answer is not None:
        out += answer_section(t.answer)
    if not t.cells:
        return out + ["No setting varies among these runs: nothing to compare.", ""]
    out += ["What each setting buys:", ""]
    # The report's cells, the spread beside the speed-up: the table fits the page's column.
    heads = ["setting", t.headers[1], "speed-up (spread)"] + t.headers[4:] + ["verdict"]
    out += ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for c, e in zip(t.cells, t.found.found):
        speed = c[2] if c[3] in ("", "one pair") else f"{c[2]} ({c[3]})"
        out.append("| " + " | ".join(c[:2] + [speed] + c[4:] + [verdict(t.rows, e, t.found.per_sample)]) + " |")
    if t.found.per_sample:
        out += ["", "The runs trained different numbers of samples: time and energy are per sample."]
    return out + [""]


HEAD = f"""---
hide:
  - toc
---

# Results at a glance

<!-- Generated by `{COMMAND}` from the stores in docs/results/stores/manifest.yaml: regenerate, do not edit. -->

What each acceleration bought against the baseline on each GPU measured: for every store, the
effects table of the report (`python -m bertaccel.report`, "The effect of each axis"), with a
verdict. Each table names its GPU, dates, the command that made the runs and the store they are
in, so any number here can be checked with the full report ([how to read it](../report.md)).

- *pair*: two configurations that differ in this setting only, each the mean over its repeats.
- *speed-up*: the reference's training time / the value's, the geometric mean over the pairs (above
  1x: faster); in brackets the smallest and the largest pair. *energy*: the change in GPU energy
  (negative: saves). *accuracy*: the change in test accuracy, in percentage points.
- *verdict*, pair by pair (in brackets: in how many pairs): **within noise** where the 95 %
  intervals of the two configurations' training times overlap (the report's test for a tie),
  **faster** or **slower** where they do not. **costs** accuracy where the mean change is more than
  {DEFAULT_POINTS:g} point below the reference (the report's default accuracy floor); *accuracy lower*
  where it is less, but beyond the repeats' noise. With one run per configuration there are no
  intervals, and speed-ups are not judged.
"""


def generate(manifest: Path = MANIFEST, root: Path = ROOT) -> str:
    tables = [read(e, root) for e in load_manifest(manifest)]
    out = [HEAD]
    for device in dict.fromkeys(t.device for t in tables):
        out += [f"## {device}", ""]
        for t in tables:
            if t.device == device:
                out += _section(t)
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = OneLineParser(prog="python -m bertaccel.report.glance",
                       description="Write the results-at-a-glance page from the benchmark stores.")
    ap.add_argument("--manifest", default=str(MANIFEST), help="the stores' manifest (default: %(default)s)")
    # Required: a default of the docs' page rewrote it in whatever checkout the command ran from.
    ap.add_argument("--out", required=True, help=f"the page to write (the docs' page: {COMMAND.split('--out ')[1]})")
    a = ap.parse_args(argv)
    try:
        page = generate(Path(a.manifest))
        Path(a.out).write_text(page)
    except (ReportInputError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
