"""vs_hf.py's Trainer row: one epoch of the Hugging Face Trainer (bf16, sdpa, fused AdamW, dynamic
padding) on the --imdb-train CSV, what a user gets from the documented recipe, and its test accuracy
on --imdb-test."""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import torch

# First: it puts the repository on sys.path and sets the offline hub variables.
from vs_hf_common import (SEED, bert_config, load_tokenizer_from, mfu_cell, package_dir, random_bert, read_rows,
                          shuffled_subset, sync)
from bertaccel.data import encode_labels
from bertaccel.measure.flops import TokenCounts, bert_train_flops
from bertaccel.measure.memory import PeakMemory
from vs_hf_table import Row


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


def trainer_what(args) -> str:
    return (f"HF Trainer, 1 epoch: bf16, sdpa, adamw_torch_fused, dynamic padding, B={args.trainer_batch_size}, "
            f"max {args.trainer_max_length}, " +
            (f"pretrained {args.trainer_model_dir}" if args.trainer_model_dir else
             ("tiny" if args.tiny else "BERT-base shape") + " random init"))


def trainer_model(args, tokenizer, num_labels: int):
    from transformers import AutoModelForSequenceClassification

    if args.trainer_model_dir:
        return AutoModelForSequenceClassification.from_pretrained(
            args.trainer_model_dir, num_labels=num_labels, attn_implementation="sdpa",
            dtype=torch.float32)  # transformers 5 would otherwise load a checkpoint's own dtype
    return random_bert(bert_config(args.tiny, len(tokenizer), num_labels), "sdpa")


def make_trainer(args, device, model, train_ds, collator, out_dir: str):
    from transformers import Trainer, TrainingArguments
    from transformers.trainer_callback import PrinterCallback

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
    return trainer


def trainer_part(args, device, profile, energy) -> Row:
    from datasets import Dataset
    from transformers import DataCollatorWithPadding

    row = Row("trainer", trainer_what(args))
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

    model = trainer_model(args, tokenizer, len(names))
    collator = CountingCollator(DataCollatorWithPadding(tokenizer))
    out_dir = tempfile.mkdtemp(prefix="vs_hf-trainer-")  # save_strategy="no": stays empty, removed below
    trainer = make_trainer(args, device, model, train_ds, collator, out_dir)
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
