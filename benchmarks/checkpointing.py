"""Activation checkpointing none / every / sqrt side by side: memory kept for the backward, step time.

    python benchmarks/checkpointing.py [--device cuda] [--batch 32] [--seq 128] [--steps 10]
    python benchmarks/checkpointing.py --device cpu --tiny     # a check of the script

BERT-base shape (random init), fp32, one forward+backward per step (no optimizer: checkpointing
changes only what the backward keeps and recomputes). Columns:
- saved MiB: bytes of the tensors autograd keeps for the backward during one forward, counted
  by a saved-tensors pack hook (the activation memory checkpointing trades away; any device;
  weights a matmul saves are counted too, though they cost no extra memory);
- peak GiB: torch.cuda.max_memory_allocated over a step (GPU only, null on a CPU);
- ms/step: median step time (CUDA events / host clock);
- vs none: step time relative to no checkpointing (the recompute's price).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from bertaccel.config import GRADIENT_CHECKPOINTING as MODES  # noqa: E402
from bertaccel.train.checkpointing import apply_checkpointing  # noqa: E402


def _model(tiny: bool, mode: str, device: torch.device):
    from transformers import BertConfig, BertForSequenceClassification

    cfg = (BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=4, num_attention_heads=2, intermediate_size=128)
           if tiny else BertConfig())
    torch.manual_seed(0)
    model = BertForSequenceClassification(cfg).to(device).train()
    apply_checkpointing(model, mode)
    return model


def measure(mode: str, tiny: bool, device: torch.device, batch: int, seq: int, steps: int) -> dict:
    model = _model(tiny, mode, device)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (batch, seq), device=device)
    labels = torch.zeros(batch, dtype=torch.long, device=device)
    saved = [0]

    def pack(t):
        saved[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    model.zero_grad(set_to_none=True)
    times = []
    peak = None
    for i in range(steps + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        model(input_ids=ids, labels=labels).loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            peak = torch.cuda.max_memory_allocated(device) / 2 ** 30
        if i:  # the first step warms up
            times.append(1000 * (time.perf_counter() - t0))
        model.zero_grad(set_to_none=True)
    return {"saved_mib": saved[0] / 2 ** 20, "peak_gib": peak, "ms": statistics.median(times)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--tiny", action="store_true")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA GPU is visible; use --device cpu --tiny for a check", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    rows = {m: measure(m, args.tiny, device, args.batch, args.seq, args.steps) for m in MODES}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"activation checkpointing, {'tiny BERT (4 layers)' if args.tiny else 'BERT-base (12 layers)'}, fp32, "
          f"B={args.batch} S={args.seq}; {name}, torch {torch.__version__}; median of {args.steps} steps")
    print("\n| mode | saved MiB (pack hook) | peak GiB | ms/step | vs none |\n|---|---|---|---|---|")
    base = rows["none"]["ms"]
    for mode, r in rows.items():
        peak = "null: CPU (no allocator peak)" if r["peak_gib"] is None else f"{r['peak_gib']:.2f}"
        print(f"| {mode} | {r['saved_mib']:.1f} | {peak} | {r['ms']:.1f} | {r['ms'] / base:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
