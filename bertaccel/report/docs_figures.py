"""The docs' measured figures, generated: each page marks a figure as a block,

    <!-- figure: KEY -->...<!-- /figure -->

(inline inside a sentence, or around a table or an output on lines of their own), and this module
fills every block from its KEY's one computation (report/docs_sources.py: a committed store read
with the report's own functions, or a real command run against a copy of one). A figure shown on
two pages is then the same computation, and a page whose block differs from it is stale.

    python -m bertaccel.report.docs_figures --check    # exit 1 naming each stale or missing block
    python -m bertaccel.report.docs_figures --write    # rewrite the blocks in place

PLACES says which pages hold each figure, so a block deleted (and its number typed back) is
missing, not silently gone.
"""
from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from . import docs_sources as s
from . import thesis_compare as thesis
from .args import OneLineParser
from .scoring import Row

BLOCK = re.compile(r"<!-- figure: ([a-z0-9-]+) -->(.*?)<!-- /figure -->", re.S)
COMMAND = "python -m bertaccel.report.docs_figures --write"


def _table51_rows(src: s.Sources) -> List[Row]:
    """Table 5.1's runs: the one-GPU workloads from the grid's store, the 2-GPU one from its own
    (only Table 5.1 reads both: the grid's figures would count a 2-GPU run as a grid configuration)."""
    return [*src.rows(s.THESIS_GRID), *src.rows(s.THESIS_X2)]


def _options(group: str) -> Callable[[s.Sources], str]:
    def listed(src: s.Sources) -> str:
        from bertaccel.config import CONF_DIR
        from bertaccel.options.reference import Composer

        with Composer(CONF_DIR, None) as composer:
            _, choices = composer.compose()
            names = composer.options(group)
        return ", ".join(f"{n} (default)" if n == choices.get(group) else n for n in names)
    return listed


_NO_X4 = "needs 4 GPUs of one host; the stores were made on one and on two"

# KEY -> its computation. Kept in the order the pages read them.
FIGURES: Dict[str, Callable[[s.Sources], str]] = {
    "card-default-line": s.card_default_line,
    "card-sweep": s.card_sweep,
    "card-report-best": s.card_report_best,
    "card-plan": s.card_plan,
    "card-plan-range": s.card_plan_range,
    "card-fp16-xformers-repeats": lambda src: s.card_repeats_seconds(src, "precision=fp16,attention=xformers"),
    "card-repeats-table": s.card_repeats_table,
    "card-repeats-fp16": lambda src: s.effect(src, s.CARD_REPEATS, "precision", "fp16")["speed-up (geo. mean)"],
    "h100-card-table": s.h100_card_table,
    "h100-triton-compile": s.h100_triton_compile,
    "h100-triton-compile-each": s.h100_triton_compile_each,
    "grid-command": lambda src: f"`{s.GRID.command}`",
    "grid-effects": s.grid_effects,
    "grid-fused-speedup": lambda src: s.effect(src, s.GRID, "encoder", "fused")["speed-up (geo. mean)"],
    "grid-fused-spread": lambda src: s.effect(src, s.GRID, "encoder", "fused")["spread"],
    "grid-fp16-speedup": lambda src: s.effect(src, s.GRID, "precision", "fp16")["speed-up (geo. mean)"],
    "grid-fp16-energy": lambda src: s.effect(src, s.GRID, "precision", "fp16")["energy"].split()[0].lstrip("-") + " %",
    "grid-adan-points": lambda src: s.effect(src, s.GRID, "optimizer", "adan_fused")["accuracy (pts)"].split()[0]
    .lstrip("-"),
    "grid-adan-pairs": lambda src: s.effect(src, s.GRID, "optimizer", "adan_fused")["accuracy (pts)"]
    .split(" ", 1)[1].strip("()"),
    "grid-batch8-speedup": lambda src: s.effect(src, s.GRID, "train.batch_size", "8")["speed-up (geo. mean)"],
    "grid-answer": s.answer_of(s.GRID),
    "grid-answer-floor-083": s.answer_of(s.GRID, "--accuracy-floor", "0.83"),
    "grid-answer-floor-off": s.answer_of(s.GRID, "--accuracy-floor", "off"),
    "fp8-answer-bf16": s.answer_of(s.FP8, "--baseline", "precision=bf16"),
    "grid-map-share-hf-fp32-16": s.map_share(s.GRID, "hf / adamw / fp32 / 16"),
    "card-map-share-fp32-triton": s.map_share(s.CARD, "fp32 / triton"),
    "grid-baseline-out": s.baseline_out(s.GRID),
    "fp8-fused-harness": s.fp8_fused_sentence,
    "fp8-fused-warmup": s.fp8_fused_warmup,
    "fp8-table": s.fp8_table,
    "fp8-sentence": s.fp8_sentence,
    "thesis-caption": lambda src: (f"*{src.device(s.THESIS_GRID)}, {src.dates(s.THESIS_GRID)}; from the committed "
                                   f"store `{s.THESIS_GRID.path}`; Table 5.1's 2-GPU row on two of them, "
                                   f"{src.dates(s.THESIS_X2)}, from `{s.THESIS_X2.path}`.*"),
    "thesis-table51": lambda src: thesis.table51(thesis.ours(_table51_rows(src)), _NO_X4),
    "thesis-steps": lambda src: thesis.steps(thesis.ours(_table51_rows(src))),
    "thesis-table54": lambda src: thesis.table54(thesis.ranked(thesis.ours(_table51_rows(src)))),
    "thesis-tau": lambda src: thesis.tau_summary(thesis.ranked(thesis.ours(_table51_rows(src)))),
    "thesis-grid-slice": lambda src: thesis.grid_slice(src.rows(s.THESIS_GRID)),
    "thesis-grid-coverage": lambda src: thesis.coverage_lines(thesis.coverage(src.rows(s.THESIS_GRID))),
    "thesis-batch-table": lambda src: thesis.batch_table(thesis.batch_pairs(src.rows(s.THESIS_GRID))),
    "thesis-batch-summary": lambda src: thesis.batch_summary(thesis.batch_pairs(src.rows(s.THESIS_GRID))),
    **{f"options-{g}": _options(g) for g in ("precision", "attention", "encoder", "compile", "freezing",
                                               "optimizer", "hardware", "model", "dataset", "preset")},
}

# The pages each figure is shown on (paths from the repository root).
PLACES: Dict[str, Sequence[str]] = {
    "card-default-line": ("README.md", "docs/getting-started.md"),
    "card-sweep": ("README.md", "docs/getting-started.md"),
    "card-report-best": ("README.md", "docs/getting-started.md"),
    "card-plan": ("docs/getting-started.md",),
    "card-plan-range": ("README.md",),
    "card-fp16-xformers-repeats": ("README.md",),
    "card-repeats-table": ("docs/results/index.md",),
    "card-repeats-fp16": ("docs/results/index.md",),
    "h100-card-table": ("docs/results/attention-backends.md",),
    "h100-triton-compile": ("docs/results/attention-backends.md",),
    "h100-triton-compile-each": ("docs/accelerations.md",),
    "grid-command": ("docs/concepts.md",),
    "grid-effects": ("docs/results/index.md", "docs/report.md"),
    "grid-fused-speedup": ("docs/results/index.md", "docs/results/fused-encoder.md", "docs/first-report.md"),
    "grid-fused-spread": ("docs/first-report.md",),
    "grid-fp16-speedup": ("docs/first-report.md",),
    "grid-fp16-energy": ("docs/first-report.md",),
    "grid-adan-points": ("docs/accelerations.md", "docs/results/fused-encoder.md", "docs/first-report.md"),
    "grid-adan-pairs": ("docs/first-report.md",),
    "grid-batch8-speedup": ("docs/first-report.md",),
    "grid-answer": ("docs/first-report.md",),
    "grid-answer-floor-083": ("docs/first-report.md",),
    "grid-answer-floor-off": ("docs/first-report.md",),
    "fp8-answer-bf16": ("docs/report.md",),
    "grid-map-share-hf-fp32-16": ("docs/first-report.md",),
    "card-map-share-fp32-triton": ("docs/first-report.md",),
    "grid-baseline-out": ("docs/first-report.md",),
    "fp8-fused-harness": ("docs/accelerations.md",),
    "fp8-fused-warmup": ("docs/accelerations.md",),
    "fp8-table": ("docs/accelerations.md",),
    "fp8-sentence": ("docs/accelerations.md",),
    **{k: ("docs/results/thesis-h200.md",) for k in ("thesis-caption", "thesis-table51", "thesis-steps",
                                                     "thesis-table54", "thesis-tau", "thesis-grid-slice",
                                                     "thesis-grid-coverage", "thesis-batch-table",
                                                     "thesis-batch-summary")},
    **{f"options-{g}": ("docs/options.md",) for g in ("precision", "attention", "encoder", "compile", "freezing",
                                                       "optimizer", "hardware", "model", "dataset", "preset")},
}


def pages(root: Path = s.ROOT) -> List[Path]:
    """The user pages: the README and docs/ but for the dated lab notebook and the generated reference."""
    return [root / "README.md"] + sorted((root / "docs").glob("*.md")) + sorted((root / "docs" / "results").glob("*.md"))


def framed(value: str) -> str:
    """A block's text: inline as it is, a value of several lines on lines of its own (Markdown
    then reads a table or a fence after the comment, not inside it)."""
    return f"\n\n{value}\n\n" if "\n" in value else value


def fill(text: str, values: Dict[str, str]) -> str:
    return BLOCK.sub(lambda m: m.group(0) if m.group(1) not in values else
                     f"<!-- figure: {m.group(1)} -->{framed(values[m.group(1)])}<!-- /figure -->", text)


def problems(texts: Dict[str, str], values: Dict[str, str]) -> List[str]:
    """What is wrong with the pages (relative path -> text) against the figures' values: a block of
    an unknown KEY, a stale block (its text is not its KEY's value), a page missing a block PLACES gives it."""
    said = []
    for page, text in texts.items():
        for m in BLOCK.finditer(text):
            key = m.group(1)
            if key not in values:
                said.append(f"{page}: figure '{key}' is no figure this generator knows ({', '.join(sorted(values))})")
            elif m.group(2) != framed(values[key]):
                shown = " ".join(m.group(2).split())[:80]
                said.append(f"{page}: figure '{key}' is stale: shows '{shown}', the source gives "
                            f"'{' '.join(values[key].split())[:80]}'")
        have = {m.group(1) for m in BLOCK.finditer(text)}
        said += [f"{page}: no block <!-- figure: {k} --> (this page shows that figure)"
                 for k, where in PLACES.items() if page in where and k not in have]
    return said


def compute(keys: Optional[Sequence[str]] = None, root: Path = s.ROOT) -> Dict[str, str]:
    """Each figure's value, computed once (keys: only these)."""
    with tempfile.TemporaryDirectory() as tmp:
        src = s.Sources(Path(tmp), root)
        return {k: f(src) for k, f in FIGURES.items() if keys is None or k in keys}


def read_pages(root: Path = s.ROOT) -> Dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in pages(root)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = OneLineParser(prog="python -m bertaccel.report.docs_figures",
                       description="Fill or check the docs' generated figures (<!-- figure: KEY --> blocks).")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 naming each stale or missing block")
    mode.add_argument("--write", action="store_true", help="rewrite every block from its source")
    # The pages' checkout (the stores are always this package's): a copy of the pages can be checked.
    ap.add_argument("--root", type=Path, default=s.ROOT, help="the folder holding README.md and docs/ "
                    "(default: %(default)s)")
    a = ap.parse_args(argv)
    if not (a.root / "README.md").is_file() or not (a.root / "docs").is_dir():
        print(f"error: --root {a.root}: no README.md and docs/ there; give the repository's folder", file=sys.stderr)
        return 2
    texts = read_pages(a.root)
    values = compute()
    if a.write:
        for page, text in texts.items():
            new = fill(text, values)
            if new != text:
                (a.root / page).write_text(new)
                print(f"wrote {page}")
        texts = read_pages(a.root)
    found = problems(texts, values)
    for line in found:
        print(line, file=sys.stderr)
    if found and a.check:
        print(f"fix: {COMMAND} (and add a missing block where the page states that figure)", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
