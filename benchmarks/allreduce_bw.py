"""All-reduce bus bandwidth on this host: the number `python -m bertaccel.plan.predict_dp` asks for.

    python benchmarks/allreduce_bw.py --gpus 2 [--sizes-mib 1,8,64,256] [--iters 20]
    python benchmarks/allreduce_bw.py --device cpu --gpus 2      # gloo, checks the script

Starts N processes (one per GPU, NCCL; or N gloo processes on the CPU), all-reduces fp32 buffers
of each size and prints one Markdown table: median time per all-reduce, algorithm bandwidth
(bytes / time) and bus bandwidth (algbw x 2(N-1)/N, the ring convention of nccl-tests, which is
what predict_dp's ring model takes). The largest size's busbw is the one to pass on; small
sizes show the latency floor (predict_dp's --latency-ms).
"""
from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import sys
import time
from typing import List

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, device_type: str, sizes_mib: List[int], iters: int, queue) -> None:
    backend = "nccl" if device_type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        if device_type == "cuda":
            torch.cuda.set_device(rank)
        device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
        rows = []
        for mib in sizes_mib:
            buf = torch.ones(mib * 2**20 // 4, dtype=torch.float32, device=device)
            for _ in range(3):  # NCCL sets up its rings/channels on the first calls
                dist.all_reduce(buf)
            times = []
            for _ in range(iters):
                if device_type == "cuda":
                    torch.cuda.synchronize(device)
                dist.barrier()
                t0 = time.perf_counter()
                dist.all_reduce(buf)
                if device_type == "cuda":
                    torch.cuda.synchronize(device)
                times.append(time.perf_counter() - t0)
            # Every rank must agree that the sum is right, or the figure is for a broken collective.
            expected = float(world) ** (3 + iters)
            ok = bool(torch.allclose(buf[:8].double().cpu(), torch.full((8,), expected, dtype=torch.float64), rtol=1e-4))
            rows.append((mib, statistics.median(times), ok))
            del buf
        if rank == 0:
            queue.put(rows)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--gpus", type=int, default=2, help="ranks (GPUs, or gloo processes on the CPU)")
    ap.add_argument("--sizes-mib", default="1,8,64,256")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args(argv)
    if args.gpus < 2:
        ap.error("--gpus must be >= 2: an all-reduce over one rank moves no data")
    sizes = [int(s) for s in args.sizes_mib.split(",") if s]
    if not sizes or min(sizes) < 1:
        ap.error("--sizes-mib: comma-separated whole MiB >= 1")
    if args.device == "cuda":
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have < args.gpus:
            print(f"allreduce_bw: --gpus {args.gpus} but this host has {have} CUDA device(s); "
                  f"use --gpus {max(have, 2)} or --device cpu", file=sys.stderr)
            return 2
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off, as bertaccel's launcher does
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(args.gpus, _port(), args.device, sizes, args.iters, queue),
                       nprocs=args.gpus, join=True, start_method="spawn")
    rows = queue.get()
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU (gloo)"
    print(f"all-reduce, {args.gpus} ranks, {name}, torch {torch.__version__}; median of {args.iters}\n")
    print("| size MiB | ms | algbw GB/s | busbw GB/s | sum correct |")
    print("|---|---|---|---|---|")
    factor = 2 * (args.gpus - 1) / args.gpus
    for mib, seconds, ok in rows:
        algbw = mib * 2**20 / seconds / 1e9
        print(f"| {mib} | {seconds * 1e3:.3f} | {algbw:.1f} | {algbw * factor:.1f} | {'yes' if ok else 'NO'} |")
    return 0 if all(ok for _, _, ok in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
