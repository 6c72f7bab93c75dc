"""What the docs' generated figures are computed from (report/docs_figures.py fills the pages):
the committed stores, read with the report's own functions, and the real commands a user types,
run on this machine against a copy of a committed store.

A GPU sweep cannot run here, but its store can be read, and the commands that only read a store
(the report, the plan) or find every run of a sweep already finished (the sweep itself, resumed)
print on any machine what they printed beside the GPU, with the GPU's figures.
"""
from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from . import load_rows
from .baseline import choose_baselines, named_row
from .effects import effects_tables
from .repeats import group_rows
from .scoring import Row
from .timing import time_view

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENT = "bertaccel"


MANIFEST = ROOT / "docs" / "results" / "stores" / "manifest.yaml"


@dataclass(frozen=True)
class Store:
    path: str        # the .db.gz, relative to the repository root
    sweep: str

    def entry(self) -> Dict[str, str]:
        """Its entry in the stores' manifest: the command that made it, as a user types it (the
        at-a-glance generator checks it there against the overrides the store recorded), and the
        run the report's --baseline is given for it, if any."""
        import yaml

        for entry in yaml.safe_load(MANIFEST.read_text())["stores"]:
            if entry["store"] == self.path and entry["sweep"] == self.sweep:
                return entry
        raise KeyError(f"{self.path} (sweep {self.sweep}) is not in {MANIFEST}")

    @property
    def command(self) -> str:
        return " ".join(self.entry()["command"].split())

    @property
    def baseline(self) -> Optional[str]:
        return self.entry().get("baseline")


CARD = Store("tests/data/h200_card_sweep.db.gz", "config-b32a167b41")
CARD_REPEATS = Store("docs/results/stores/h200-card-repeats.db.gz", "config-b32a167b41")
H100_CARD = Store("docs/results/stores/h100-card.db.gz", "config-b32a167b41")
GRID = Store("docs/results/stores/h200-thesis-grid-repeats.db.gz", "thesis_grid-bf4de72724")
FP8_FUSED = Store("docs/results/stores/h200-fp8-fused-minilm-imdb.db.gz", "config-7abe5912d2")
FP8 = Store("docs/results/stores/h200-fp8-minilm-imdb.db.gz", "config-5e884036e6")
# Four sweeps in one store (docs/results/thesis-h200.md gives their commands): read whole, no sweep id.
THESIS_GRID = Store("docs/results/stores/h200-thesis-grid.db.gz", "")
# Table 5.1's 2-GPU row, measured on two H200s of one host (the grid's store was made on one).
THESIS_X2 = Store("docs/results/stores/h200x2-thesis-table51.db.gz", "")


@dataclass
class Sources:
    """One generation's reads: each store gunzipped once into `tmp`, each command run once."""
    tmp: Path
    root: Path = ROOT
    _rows: Dict[Store, List[Row]] = field(default_factory=dict)
    _out: Dict[Tuple[Store, Tuple[str, ...]], str] = field(default_factory=dict)

    def folder(self, store: Store) -> Path:
        """A folder of its own holding the store as mlflow.db, where a user's commands find it."""
        here = self.tmp / Path(store.path).name.replace(".db.gz", "")
        if not (here / "mlflow.db").is_file():
            here.mkdir(parents=True, exist_ok=True)
            with gzip.open(self.root / store.path) as src, open(here / "mlflow.db", "wb") as dst:
                shutil.copyfileobj(src, dst)
        return here

    def rows(self, store: Store) -> List[Row]:
        if store not in self._rows:
            uri = f"sqlite:///{self.folder(store) / 'mlflow.db'}"
            self._rows[store] = time_view(load_rows(uri, EXPERIMENT, store.sweep)).rows
        return self._rows[store]

    def run(self, store: Store, command: str) -> str:
        """The command's stdout, run as a user types it in the store's folder (python: this one)."""
        argv = tuple(command.split())
        if (store, argv) not in self._out:
            env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                   "PYTHONPATH": str(self.root), "XDG_CACHE_HOME": str(self.tmp / "cache")}
            p = subprocess.run([sys.executable, *argv[1:]], cwd=self.folder(store), env=env,
                               capture_output=True, text=True, timeout=600)
            if p.returncode != 0:
                raise RuntimeError(f"`{command}` on {store.path} exited {p.returncode}: {p.stderr[-600:]}")
            self._out[(store, argv)] = p.stdout
        return self._out[(store, argv)]

    def dates(self, store: Store) -> str:
        """The days its runs started, from the store."""
        from bertaccel.record.access import start_times_ms

        starts = start_times_ms(f"sqlite:///{self.folder(store) / 'mlflow.db'}", [r.run_id for r in self.rows(store)])
        days = sorted({datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d") for ms in starts})
        return days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}"

    def device(self, store: Store) -> str:
        return ", ".join(sorted({r.device or "unknown" for r in self.rows(store)}))

    def effect_cells(self, store: Store) -> Tuple[List[str], List[List[str]]]:
        """The report's effects table for the store: headers and cells (one table: one like group)."""
        rows = self.rows(store)
        given = named_row(rows, store.baseline) if store.baseline else None
        ((_, _, headers, cells),) = effects_tables(rows, choose_baselines(rows, given).indices,
                                                   time_view(rows).basis.label)
        return headers, cells


def caption(src: Sources, store: Store, what: str = "") -> str:
    """Where a generated table comes from: GPU, dates, command, store (italic, as the pages' captions)."""
    return (f"*{src.device(store)}, {src.dates(store)}. `{store.command}`{what}; from the committed store "
            f"`{store.path}` (sweep `{store.sweep}`).*")


def quoted(value: Optional[float]) -> float:
    """A figure the docs quote from one of their committed stores, which measured it: None there
    is a broken store, not a run to leave out."""
    assert value is not None, "a docs store lacks a figure the docs quote"
    return value


def span(values: Sequence[float], fmt: str = "{:.1f}") -> str:
    """'3.5-4.4' (one value when they round alike)."""
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo}-{hi}"


def effect(src: Sources, store: Store, axis: str, value: str) -> Dict[str, str]:
    """One row of the report's effects table, by its column names."""
    headers, cells = src.effect_cells(store)
    for c in cells:
        if c[0] == axis and c[1].split(" vs ")[0] == value:
            return dict(zip(headers, c))
    raise KeyError(f"no effect of {axis}={value} in {store.path}")


def markdown_table(headers: Sequence[str], cells: Sequence[Sequence[str]]) -> str:
    return "\n".join(["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
                     + ["| " + " | ".join(c) + " |" for c in cells])


def fenced(text: str) -> str:
    return "```text\n" + text.strip("\n") + "\n```"


def grid_effects(src: Sources) -> str:
    return caption(src, GRID, ", then `python -m bertaccel.report`: its effects table, each configuration the mean "
                   "of its 3 repeats") + "\n\n" + markdown_table(*src.effect_cells(GRID))


def card_repeats_table(src: Sources) -> str:
    rows = src.rows(CARD_REPEATS)
    cells = []
    for g in group_rows(rows):
        runs = sorted((rows[i] for i in g.members), key=lambda r: r.seed)
        cells.append([g.label, " / ".join(f"{r.time_s:.1f}" for r in runs),
                      ", ".join(f"{r.accuracy:.4f}" for r in runs)])
    seeds = ", ".join(sorted({r.seed for r in rows}))
    return (caption(src, CARD_REPEATS, f": {len(rows)} runs over seeds {seeds}") + "\n\n"
            + markdown_table(["configuration", "training window s, by seed", "test accuracy, by seed"], cells))


def h100_card_table(src: Sources) -> str:
    cells = [[r.name, f"{r.compile_time_s:.1f}" + (f" ({r.compile_cache})" if r.compile_cache else ""),
              f"{r.time_s:.1f}", f"{quoted(r.train_samples) / quoted(r.time_s):.0f}", f"{r.accuracy:.4f}"]
             for r in src.rows(H100_CARD)]
    return (caption(src, H100_CARD, " with fresh caches") + "\n\n"
            + markdown_table(["run", "compile_time_s (cache)", "train_time_s", "samples/s", "test_accuracy"], cells))


def h100_triton_compile(src: Sources) -> str:
    return span([quoted(r.compile_time_s) for r in src.rows(H100_CARD) if "attention=triton" in r.name]) + " s"


def card_sweep(src: Sources) -> str:
    """The README's sweep, run again on the committed store: its first lines, then its summary."""
    out = src.run(CARD, CARD.command).splitlines()
    head = [line for line in out[:out.index("== sweep summary ==")] if line.startswith("[sweep] ")][:2]
    return fenced("\n".join([*head, "...", *out[out.index("== sweep summary =="):]]))


def answer_of(store: Store, *args: str):
    """The report's answer for a store as the console prints it (the headline and its lines, not
    the report's path), with the report's own options (e.g. --accuracy-floor off); a source."""
    def source(src: Sources) -> str:
        out = src.run(store, " ".join(["python -m bertaccel.report --sweep", store.sweep, *args]))
        return fenced("\n".join(line for line in out.splitlines() if line.strip() and not line.startswith("report: ")))
    return source


def _decided(src: Sources, store: Store):
    """The report's decision for the store, its runs named as the report names them."""
    import dataclasses

    from .labels import relabel
    from .summary import decided

    rows = [dataclasses.replace(r) for r in src.rows(store)]  # (relabel renames in place: a copy)
    labels = relabel(rows)
    given = named_row(rows, store.baseline, labels.ids_of(store.baseline)) if store.baseline else None
    return decided(time_view(rows), given)


def map_share(store: Store, label: str):
    """The share of weight space a configuration wins (the report's weight-sensitivity table); a source."""
    def source(src: Sources) -> str:
        from .weights import weight_map

        scored, v, _ = _decided(src, store)
        wm = weight_map(scored.normalized, [g.members for g in v.groups], [g.label for g in v.groups], v.why_out)
        k = [g.label for g in v.groups].index(label)
        return f"{wm.share(wm.won.get(k, 0)):.0%}".replace("%", " %")
    return source


def baseline_out(store: Store):
    """Why the floor keeps the store's baseline configuration from winning, as the report says it; a source."""
    def source(src: Sources) -> str:
        _, v, ans = _decided(src, store)
        return v.why_out[v.of_row(ans.baselines.indices[0])]
    return source


def card_report_best(src: Sources) -> str:
    out = src.run(CARD, f"python -m bertaccel.report --sweep {CARD.sweep}").splitlines()
    return fenced("\n".join(line for line in out if line.strip()))


PLAN = "python -m bertaccel.plan precision=fp16,fp32 attention=xformers,triton hardware=h200"


def _plan_table(src: Sources) -> List[str]:
    out = src.run(CARD, PLAN).splitlines()
    start = out.index("== Predicted time, cost and energy (before running) ==")
    return [line.rstrip() for line in out[start:out.index("", start)]]


def card_plan(src: Sources) -> str:
    return fenced("\n".join(_plan_table(src)))


def card_plan_range(src: Sources) -> str:
    """'predicted A-B s of training for runs that took C-D s': the plan's train_time_s column against the store."""
    table = _plan_table(src)
    col = table[1].index("train_time_s")
    predicted = [float(line[col:].split()[0]) for line in table[2:]]
    measured = [quoted(r.time_s) for r in src.rows(CARD)]
    return f"{span(predicted)} s of training for runs that took {span(measured)} s"


def card_default_line(src: Sources) -> str:
    """The default job's last line (bertaccel/run.py prints it) with the store's figures of that run."""
    (r,) = [r for r in src.rows(CARD) if r.name == "defaults"]
    return fenced(f"test_accuracy={r.accuracy:.4f} train_time_s={r.time_s:.1f} mlflow_run_id=... "
                  "(store sqlite:///mlflow.db, experiment bertaccel)")


def card_repeats_seconds(src: Sources, name: str) -> str:
    return span([quoted(r.time_s) for r in src.rows(CARD_REPEATS) if r.name == name]) + " s"


def fp8_fused_sentence(src: Sources) -> str:
    rows = src.rows(FP8_FUSED)
    mean = {g.label: (sum(quoted(rows[i].accuracy) for i in g.members) / len(g.members),
                      sum(quoted(rows[i].time_s) for i in g.members) / len(g.members)) for g in group_rows(rows)}
    fp8, bf16 = mean["precision=fp8_rowwise"], mean["precision=bf16"]
    e = effect(src, FP8_FUSED, "precision", "fp8_rowwise")
    return (f"accuracy {fp8[0]:.4f} against fused bf16's {bf16[0]:.4f} ({e['accuracy (pts)'].split()[0]} points), "
            f"train time {fp8[1]:.1f} s against {bf16[1]:.1f} s ({e['speed-up (geo. mean)']}; "
            f"{src.device(FP8_FUSED)}, {src.dates(FP8_FUSED)})")



def fp8_fused_warmup(src: Sources) -> str:
    return span([quoted(r.compile_time_s) for r in src.rows(FP8_FUSED)], "{:.0f}") + " s"


def _warm(rows: Sequence[Row], cache: str) -> List[float]:
    return [quoted(r.compile_time_s) for r in rows if r.compile_cache == cache]


def fp8_table(src: Sources) -> str:
    """bf16 against fp8 (torchao) over the seeds: accuracy, train time, warm-up by cache state."""
    rows = src.rows(FP8)
    by = {p: sorted((r for r in rows if r.name == f"precision={p}"), key=lambda r: r.seed) for p in ("bf16", "fp8")}
    speed = effect(src, FP8, "precision", "fp8")["speed-up (geo. mean)"]

    def acc(p: str) -> str:
        runs = by[p]
        return " / ".join(f"{r.accuracy:.4f}" for r in runs) + f" (mean {sum(quoted(r.accuracy) for r in runs) / len(runs):.4f})"

    def warm(p: str) -> str:
        return ", ".join(f"{span(_warm(by[p], c), '{:.1f}')} s {c}" for c in ("cold", "warm") if _warm(by[p], c))

    seeds = " / ".join(r.seed for r in by["bf16"])
    cells = [[f"test accuracy, seeds {seeds}", acc("bf16"), acc("fp8")],
             ["train time (2 epochs)", " / ".join(f"{r.time_s:.1f}" for r in by["bf16"]) + " s",
              " / ".join(f"{r.time_s:.1f}" for r in by["fp8"]) + f" s ({speed})"],
             ["compile warm-up (one-time; the compile cache cold for the first seed, warm after)", warm("bf16"),
              warm("fp8")]]
    return caption(src, FP8) + "\n\n" + markdown_table(["", "bf16", "fp8 tensorwise"], cells)


def fp8_sentence(src: Sources) -> str:
    e = effect(src, FP8, "precision", "fp8")
    rows = src.rows(FP8)
    fp8 = _warm([r for r in rows if r.name == "precision=fp8"], "warm")
    bf16 = _warm([r for r in rows if r.name == "precision=bf16"], "warm")
    ratio = (sum(fp8) / len(fp8)) / (sum(bf16) / len(bf16))
    return (f"FP8 costs no accuracy here ({e['accuracy (pts)'].split()[0]} points) and is {e['speed-up (geo. mean)']} "
            f"as fast, with {e['energy'].split()[0].lstrip('+')} % more GPU energy. Its warm-up stays about "
            f"{ratio:.0f}x bf16's with the compile cache warm ({span(fp8, '{:.0f}')} s against {span(bf16)} s)")


def h100_triton_compile_each(src: Sources) -> str:
    """Each precision's Triton compile on a cold cache, with where it was measured."""
    each = [f"{r.compile_time_s:.1f} s ({r.choices.get('precision', '?')})"
            for r in src.rows(H100_CARD) if "attention=triton" in r.name]
    return f"{' and '.join(each)} ({src.device(H100_CARD)}, {src.dates(H100_CARD)}, store `{H100_CARD.path}`)"
