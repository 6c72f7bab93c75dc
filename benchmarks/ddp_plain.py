"""A plain torch DDP loop on 1 and N GPUs: the reference a bertaccel num_gpus=N run is held to.

    python benchmarks/ddp_plain.py --gpus 1,2,4 [--repeats 3] [--batch 128] [--seq 128] [--steps 50] \
        [--data .devdata/imdb/train.csv.gz]
    python benchmarks/ddp_plain.py --device cpu --tiny --gpus 2     # gloo: checks the script
    [--encoder fused]                  # bertaccel's fused layer in the same plain loop

BertForSequenceClassification (BERT-base shape, random init), bf16 autocast + sdpa + fused
AdamW, per-rank fixed B x S batches of real text already on the device (each rank its own rows),
no clipping, no data loader, nothing logged per step: what scaling the hardware gives with the
least code around it. Prints one Markdown table: world size, ms/step, global samples/s, scaling
vs 1 rank, and NVML energy per sample summed over the ranks' GPUs.
"""
from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))  # vs_hf_common: vs_hf.py's data and model helpers

from vs_hf_common import (EnergyMeter, StepClock, bert_config, csv_header, fixed_batches,  # noqa: E402
                          load_tokenizer_from, package_dir, random_bert, read_rows, shuffled_subset)

from bertaccel.data import encode_labels  # noqa: E402


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, args, queue) -> None:
    cuda = args.device == "cuda"
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                                rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    try:
        device = torch.device("cuda", rank) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        tokenizer = load_tokenizer_from(package_dir())
        texts, raw = read_rows(args.data, [c for c in csv_header(args.data) if c != "label"], "label")
        labels, _, names = encode_labels(raw, raw, args.data)
        texts, labels = shuffled_subset(texts, labels, None, seed=1000 + rank)  # each rank its own rows
        model = random_bert(bert_config(args.tiny, len(tokenizer), len(names)), "sdpa")
        if args.encoder == "fused":  # bertaccel's fused layer (encoder=fused attention=sdpa), nothing else of ours
            from types import SimpleNamespace

            from bertaccel.encoder.swap import fuse_encoder

            # sdpa's core is torch's varlen flash kernel, CUDA only; on the CPU (a check of the
            # script, TRITON_INTERPRET=1) our Triton core stands in.
            fuse_encoder(model, SimpleNamespace(packed=True, fused_kernels=True),
                         SimpleNamespace(swap=None if cuda else "triton", hf_implementation="sdpa"))
        model = model.to(device)
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank] if cuda else None) \
            if world > 1 else model
        opt = torch.optim.AdamW(model.parameters(), lr=5e-5, fused=cuda)
        batches = fixed_batches(tokenizer, texts, labels, args.batch, args.seq, 4, device)
        autocast = torch.autocast(device.type, dtype=torch.bfloat16)

        def step(b):
            opt.zero_grad(set_to_none=True)
            with autocast:
                loss = ddp(**b).loss
            loss.backward()
            opt.step()

        for i in range(args.warmup):
            step(batches[i % len(batches)])
        energy = EnergyMeter(device)
        windows = []
        for _ in range(args.repeats):  # timed windows back to back: the loop's own spread
            clock = StepClock(device, args.steps)
            if cuda:
                torch.cuda.synchronize(device)
            if world > 1:
                dist.barrier()
            start_mj, t0 = energy.read_mj(), time.perf_counter()
            for i in range(args.steps):
                clock.mark(i)
                step(batches[i % len(batches)])
            clock.mark(args.steps)
            if cuda:
                torch.cuda.synchronize(device)
            seconds = time.perf_counter() - t0
            kj = energy.kj(start_mj, energy.read_mj())
            kj = kj if isinstance(kj, float) else float("nan")
            stats = torch.tensor([seconds, kj], dtype=torch.float64, device=device)
            if world > 1:  # the slowest rank's window; energy summed over the GPUs
                secs = stats[:1].clone()
                dist.all_reduce(secs, op=dist.ReduceOp.MAX)
                dist.all_reduce(stats, op=dist.ReduceOp.SUM)
                stats[0] = secs[0]
            windows.append((statistics.median(clock.step_ms()), float(stats[0]), float(stats[1])))
        if rank == 0:
            queue.put(windows)
        if world > 1:
            dist.barrier()
    finally:
        if world > 1:
            dist.destroy_process_group()


def measure(world: int, args) -> tuple:
    queue = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(_worker, args=(world, _port(), args, queue), nprocs=world, join=True, start_method="spawn")
    return queue.get()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--gpus", default="2", help="rank counts, e.g. 1,2,4 (one number N means 1,N)")
    ap.add_argument("--batch", type=int, default=128, help="per-rank batch")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--encoder", default="hf", choices=("hf", "fused"),
                    help="fused: bertaccel's fused encoder layer in the same plain loop (the reference for encoder=fused)")
    ap.add_argument("--repeats", type=int, default=1, help="timed windows per rank count (its spread)")
    ap.add_argument("--data", default=str(Path(__file__).resolve().parent.parent / "bertaccel/samples/ag_news/train.csv.gz"))
    ap.add_argument("--tiny", action="store_true", help="a 2-layer 32-wide BERT (CPU checks of the script)")
    args = ap.parse_args(argv)
    try:
        worlds = sorted({1, *(int(g) for g in args.gpus.split(","))})
        if worlds[0] < 1 or args.repeats < 1:
            raise ValueError
    except ValueError:
        print(f"ddp_plain: --gpus {args.gpus!r} must be positive integers separated by commas, e.g. 1,2,4, "
              f"and --repeats {args.repeats} at least 1", file=sys.stderr)
        return 2
    if args.device == "cuda":
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have < worlds[-1]:
            print(f"ddp_plain: --gpus {args.gpus} needs {worlds[-1]} CUDA devices but this host has {have}", file=sys.stderr)
            return 2
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    rows = {n: measure(n, args) for n in worlds}
    print(f"plain DDP, encoder {args.encoder}, per-rank batch {args.batch} x {args.seq}, {args.steps} steps after {args.warmup}, "
          f"{args.repeats} timed window(s) per rank count; "
          f"{torch.cuda.get_device_name(0) if args.device == 'cuda' else 'CPU (gloo)'}, torch {torch.__version__}\n")
    print(table(rows, args.batch * args.steps))
    return 0


def table(rows: Dict[int, List[Tuple[float, float, float]]], samples_per_rank: int) -> str:
    """Markdown: per rank count the median window's samples/s and scaling, with the windows' range."""
    def rate(n: int, window: Tuple[float, float, float]) -> float:
        return n * samples_per_rank / window[1]

    base = statistics.median(rate(1, w) for w in rows[1])
    lines = ["| ranks | ms/step (median, rank 0) | samples/s (median of windows) | windows' range | scaling | "
             "scaling range | J/sample (all GPUs) |", "|---|---|---|---|---|---|---|"]
    for n, windows in rows.items():
        rates = sorted(rate(n, w) for w in windows)
        mid = statistics.median(rates)
        kj = statistics.median(w[2] for w in windows)
        jps = "null (no NVML energy)" if kj != kj else f"{kj * 1e3 / (n * samples_per_rank):.4f}"
        lines.append(f"| {n} | {statistics.median(w[0] for w in windows):.2f} | {mid:.0f} | {rates[0]:.0f}-{rates[-1]:.0f} | "
                     f"{mid / base:.3f}x | {rates[0] / base:.3f}-{rates[-1] / base:.3f}x | {jps} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
