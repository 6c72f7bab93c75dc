"""The papers the tool's options come from, in one home: the config reference's table of them
(options/reference.py) and the links from each citation in an option's text to that table.

An option's text (a comment in config/, a YAML option's leading comment, a check's docstring)
cites a paper by its `short` title and a section, equation or table, e.g. "Systematic Training
Compute Optimization, section III-B, eq. 6": a title a reader can look up, where the paper's
number alone ("seed 001") could not be. The numbers stay only where they are names: the preset
files (`preset=seed001_k4`), and values a run records (changing those would change what a run
is, its config_hash).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Iterable, List, Tuple

ANCHOR = "papers-cited"  # the table's heading on the reference page, linked to from each citation


@dataclass(frozen=True)
class Paper:
    label: str    # the number the tool's file names use: preset=seed001_k4 is "seed 001"
    title: str    # as on its title page
    short: str    # the title as option texts cite it
    authors: str  # as on its title page
    year: str     # as on its title page ("no year given" where it gives none)
    found: str    # what it found, in a sentence, and what of it the tool uses


PAPERS: Tuple[Paper, ...] = (
    Paper("seed 000", "Profiling and Optimizing Training Performance of BERT-Base",
          "Profiling and Optimizing Training Performance of BERT-Base", "authors not named", "no year given",
          "Fine-tuning BERT-base on AG News at 50 tokens, gradient accumulation (section 3.1), "
          "layer-wise unfreezing of one encoder layer per epoch (3.2) and an xFormers attention rewrite "
          "with fp16 and torch.compile (3.3) gave 1.26x, 2.87x and 1.38x per epoch, 5.07x together for "
          "5 points of accuracy (Table 1). Here: freezing=layerwise, and its preset."),
    Paper("seed 001", "Systematic Training Compute Optimization for Large-Scale AI Models: "
          "A Dynamic Resource Allocation Approach", "Systematic Training Compute Optimization",
          "Mamta Nallaretnam, Uthayasankar Thayasivam (University of Moratuwa)", "no year given",
          "Gradient accumulation with a variance-aware k (section III-B, eq. 6-7), warm-up then cosine "
          "learning rate (eq. 10) with linear lr scaling (eq. 11), mixed precision and activation "
          "checkpointing every sqrt(L) layers (III-E) cut time to convergence by 23-28% and memory by "
          "25% at comparable accuracy; Table III adds them one at a time. Here: accumulation=adaptive, "
          "optimizer.schedule=cosine, optimizer.scale_lr=linear, train.gradient_checkpointing, and "
          "Table III's ladder as presets."),
    Paper("seed 003", "Demystifying BERT: System Design Implications", "Demystifying BERT",
          "Suchita Pati, Shaizeen Aga, Nuwan Jayasena, Matthew D. Sinclair "
          "(University of Wisconsin-Madison; AMD)", "no year given",
          "In BERT training, GEMMs dominate but differ widely in shape, memory-bound operations take a "
          "large share, and LAMB's update (section 2.4) is the second largest contributor, 7-25% of the "
          "time (section 3.2). Here: optimizer=lamb, and the profile's kernel categories (profile=true)."),
    Paper("seed 004", "Hardware Acceleration of Machine Learning: Evaluation and comparison of "
          "different hardware-aware optimization techniques", "Hardware Acceleration of Machine Learning",
          "Fangzhou Chen, William Sköld (master's thesis, Chalmers University of Technology and "
          "University of Gothenburg)", "2023",
          "Fine-tuning BERT-base on IMDb, a fused Adan kernel (section 3.1), multi-tensor access (3.2), "
          "mixed precision and LightSeq's layers each cut time, energy and cost; LightSeq with fused "
          "Adan and mixed precision was best in every scenario (74% less time and energy on their own "
          "dataset). Here: optimizer=adan_fused and its single-tensor baselines, encoder=fused, "
          "layer_timing's backprop estimate (3.5.2), the hardware=v100 price (4.1.5)."),
)


def link_citations(text: str) -> str:
    """Markdown text with each paper's short title made a link to the papers table (once per
    paper per text: the first mention is enough to find it)."""
    for paper in PAPERS:
        pattern = re.compile(re.escape(paper.short) + r"(?!\])")
        text = pattern.sub(f"[*{paper.short}*](#{ANCHOR})", text, count=1)
    return text


def papers_table(presets: Iterable[str], cell: Callable[[str], str] = lambda s: s) -> List[str]:
    """The page's table of the papers: title, authors and year as the paper gives them, the number
    the tool's names use and the presets named after it, and what it found that the tool uses."""
    presets = list(presets)
    out = ["| Paper | What it found, and what the tool uses |", "|---|---|"]
    for paper in PAPERS:
        prefix = paper.label.replace(" ", "")
        named = ", ".join([f"`{paper.label}`"] + [f"`{p}`" for p in presets if p.startswith(prefix)])
        out.append(f"| *{cell(paper.title)}*<br>{cell(paper.authors)}; {paper.year}<br>named {named} | "
                   f"{cell(paper.found)} |")
    return out
