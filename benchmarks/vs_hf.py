"""Plain Hugging Face against bertaccel, in one process on one GPU: one Markdown table.

    python benchmarks/vs_hf.py --imdb-train .devdata/imdb/train.csv.gz --imdb-test .devdata/imdb/test.csv.gz \
        --bertaccel "precision=bf16 attention=sdpa optimizer=adamw_fused model=bert_base_random dataset=csv \
                     dataset.train_path=.devdata/imdb/train.csv.gz dataset.test_path=.devdata/imdb/test.csv.gz" \
        [--out vs_hf.md]

Every figure is measured in this run; nothing is copied from an earlier one.

1. Plain-HF rungs: BertForSequenceClassification, BERT-base shape, random init, fixed B x S batches
   of real text already on the device, a hand-written loop (zero_grad, forward under autocast,
   backward, AdamW step; no clipping):
   (a) fp32, eager attention, AdamW (foreach); (b) bf16 autocast + sdpa + fused AdamW;
   (c) (b) + torch.compile(model); (d) (b) + torch.compile(model, mode="reduce-overhead");
   (e) (b) with our fused encoder (encoder=fused); (f) (e) with the whole step in one CUDA graph;
   (b') and (d'): (b) and (d) fed by a torch DataLoader with bertaccel's collator, workers and
   pinning, the copy to the device inside the step: what a user's own loop pays for its data.
   The shell needs the primes quoted: --rungs "a,b,b',d,d'".
2. One epoch of the Hugging Face Trainer (bf16, sdpa, fused AdamW, dynamic padding) on the
   --imdb-train CSV, what a user gets from the documented recipe.
3. bertaccel configurations (--bertaccel, repeatable) through the real core, bertaccel.runs.job.execute.

This file is the command line and the order of the rows; each part is a module beside it:
vs_hf_plain.py (1), vs_hf_trainer.py (2), vs_hf_bertaccel.py (3), vs_hf_table.py (the rows and the
table), vs_hf_common.py (the measuring helpers, data and models they share).
"""
from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import traceback
from pathlib import Path
from typing import List

# First: vs_hf_common puts the repository on sys.path and sets the offline hub variables.
from vs_hf_common import REPO, SEED, TOKENIZER_PACKAGE, EnergyMeter, csv_header, free_memory, hardware_profile

import torch

from bertaccel.options.hardware import device_name
from bertaccel.train.isolation import isolated_run
from vs_hf_bertaccel import bertaccel_part
from vs_hf_plain import RUNGS, rungs_part
from vs_hf_table import Row, first_line, header, table
from vs_hf_trainer import trainer_part

log = logging.getLogger("vs_hf")


# ---------------------------------------------------------------- main

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--steps", type=int, default=50, help="measured steps per rung")
    ap.add_argument("--warmup-steps", type=int, default=10,
                    help="unmeasured steps per rung first (compile included; reduce-overhead records its "
                         "CUDA graphs in the first ~3)")
    ap.add_argument("--batch-sizes", default="32,256", help="rung batch sizes, comma-separated")
    ap.add_argument("--seq", type=int, default=128, help="rung sequence length S (pad/truncate)")
    ap.add_argument("--rungs", default="a,b,b',c,d,d',e,f",
                    help="subset of a,b,b',c,d,d',e,f (quote it in a shell: --rungs \"b,b',d,d'\")")
    ap.add_argument("--rung-batches", type=int, default=4, help="distinct fixed batches the rung steps cycle through")
    ap.add_argument("--data", help="CSV for the rungs' text (default: --imdb-train, else the bundled AG News sample)")
    ap.add_argument("--text-columns", help="comma-separated, joined by a space (default: every column but the label)")
    ap.add_argument("--label-column", default="label")
    ap.add_argument("--tokenizer-dir", help=f"default: the {TOKENIZER_PACKAGE} package's model dir")
    ap.add_argument("--skip-trainer", action="store_true")
    ap.add_argument("--imdb-train", help="CSV(.gz) with text,label for the Trainer epoch")
    ap.add_argument("--imdb-test", help="CSV(.gz) for the Trainer's test accuracy (optional)")
    ap.add_argument("--trainer-max-length", type=int, default=256)
    ap.add_argument("--trainer-batch-size", type=int, default=32)
    ap.add_argument("--trainer-subset", type=int, help="train rows (seeded random subset)")
    ap.add_argument("--trainer-test-subset", type=int, help="test rows (seeded random subset)")
    ap.add_argument("--trainer-model-dir", help="pretrained model dir instead of random init")
    ap.add_argument("--tiny", action="store_true", help="hidden 32 / 2 layers / 2 heads / 64 (CPU tests)")
    ap.add_argument("--bertaccel", action="append", default=[], metavar="OVERRIDES",
                    help="one bertaccel row: space-separated Hydra overrides (repeatable)")
    ap.add_argument("--out", help="also write the table here (Markdown), rewritten after every row")
    args = ap.parse_args(argv)
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b]
    args.rungs = [r for r in args.rungs.split(",") if r]
    bad = [r for r in args.rungs if r not in RUNGS]
    if bad:
        ap.error(f"--rungs: unknown {','.join(bad)} (choose from {','.join(RUNGS)})")
    if not args.skip_trainer and not args.imdb_train:
        ap.error("the Trainer epoch needs --imdb-train (or pass --skip-trainer)")
    if args.data is None:
        args.data = args.imdb_train or str(REPO / "bertaccel" / "samples" / "ag_news" / "train.csv.gz")
    if args.text_columns is None:
        cols = csv_header(args.data)
        args.text_columns = [c for c in cols if c != args.label_column]
    else:
        args.text_columns = [c for c in args.text_columns.split(",") if c]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA GPU is visible; use --device cpu", file=sys.stderr)
        return 2
    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
    profile, profile_note = hardware_profile(device)
    energy = EnergyMeter(device)
    import transformers

    context = (f"device: {device_name(device)}; torch {torch.__version__}, transformers {transformers.__version__}; "
               f"hardware profile {profile_note}")
    rows: List[Row] = []
    print(context, flush=True)
    print(header(), flush=True)

    store: List[str] = []  # made on first use: rows that name tracking.uri need none

    def default_store() -> str:
        if not store:
            store.append(f"sqlite:///{tempfile.mkdtemp(prefix='vs_hf-mlflow-')}/mlflow.db")
        return store[0]

    def emit(row: Row) -> None:
        rows.append(row)
        print(row.render(), flush=True)
        if args.out:  # rewritten per row: a run cut off by a time limit still leaves its rows
            Path(args.out).write_text(table(context, rows, args, store) + "\n")

    if args.rungs and args.batch_sizes:
        rungs_part(args, device, profile, energy, emit)
    if not args.skip_trainer:
        with isolated_run(SEED, shared_process=True):
            try:
                row = trainer_part(args, device, profile, energy)
            except Exception as e:  # noqa: BLE001
                log.error(f"Trainer epoch failed:\n{traceback.format_exc()}")
                row = Row("trainer", "HF Trainer, 1 epoch", notes=[f"failed: {first_line(e)}"])
            free_memory()
        emit(row)
    for i, spec in enumerate(args.bertaccel, start=1):
        try:
            row = bertaccel_part(i, spec, default_store, device)
        except Exception as e:  # noqa: BLE001 - bad overrides (ConfigError, DataError, Hydra's) included
            log.error(f"bertaccel row {i} failed:\n{traceback.format_exc()}")
            row = Row(f"bertaccel {i}", f"bertaccel: {spec}", notes=[f"failed: {first_line(e)}"])
        free_memory()
        emit(row)
    print("\n" + table(context, rows, args, store), flush=True)
    measured = any(isinstance(v, float) for r in rows for v in r.cells.values())
    return 0 if measured or not rows else 1


if __name__ == "__main__":
    sys.exit(main())
