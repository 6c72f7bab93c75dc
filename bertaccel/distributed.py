"""One rank of a data-parallel job (num_gpus=N): its process group, device and reductions.

The launcher (launch.py) starts N processes and hands each a `Rank`; nothing here reads or
writes process-wide environment variables, so the sweep process that launches jobs is never
changed by them. Backend: NCCL on GPUs, gloo on the CPU (num_gpus=N on a CPU host runs N
processes on its cores: the data-parallel logic, not a speed-up).
"""
from __future__ import annotations

import datetime
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Rank:
    rank: int
    world_size: int
    init_method: str            # file://<job dir>/store (the launcher's), or tcp://host:port
    timeout_s: float            # a collective waiting longer fails (a hung or dead peer)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def backend_for(device_type: str) -> str:
    return "nccl" if device_type == "cuda" else "gloo"


@contextmanager
def process_group(rank: Optional[Rank], device_type: str) -> Iterator[None]:
    """The job's process group for the duration of the run (nothing for a 1-process run)."""
    if rank is None or rank.world_size == 1:
        yield
        return
    dist.init_process_group(backend_for(device_type), init_method=rank.init_method, rank=rank.rank,
                            world_size=rank.world_size, timeout=datetime.timedelta(seconds=rank.timeout_s))
    try:
        yield
        # Leave together: rank 0 hosts the rendezvous store, and a rank still tearing down its
        # group after rank 0 has exited waits on that store for good (seen in a 2-rank CPU test).
        dist.barrier()
    finally:
        dist.destroy_process_group()


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    return dist.get_world_size() if active() else 1


def rank() -> int:
    return dist.get_rank() if active() else 0


def _reduce(values: Sequence[float], op, device: torch.device) -> List[float]:
    if not active():
        return [float(v) for v in values]
    # NCCL reduces device tensors only; gloo takes CPU ones.
    where = device if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=where)
    dist.all_reduce(t, op=op)
    return t.tolist()


def sum_across(values: Sequence[float], device: torch.device) -> List[float]:
    return _reduce(values, dist.ReduceOp.SUM if dist.is_available() else None, device)


def max_across(values: Sequence[float], device: torch.device) -> List[float]:
    return _reduce(values, dist.ReduceOp.MAX if dist.is_available() else None, device)


def start_together(device: torch.device) -> None:
    """Every rank here before any goes on (nothing in a 1-process run). Called just before a
    training window starts: rank 0 alone logs to MLflow between epochs, and a rank that entered
    its window first would otherwise count rank 0's logging, as a wait in its first all-reduce,
    in the window whose maximum over ranks is train_time_s."""
    if not active():
        return
    # A small all-reduce rather than dist.barrier(): on NCCL it is ordered on the device's stream
    # like the training collectives, and it does not need the rank-to-GPU guess barrier() makes.
    _reduce([0.0], dist.ReduceOp.SUM, device)


def shard(items: Sequence, rank: int, world: int, equal: bool) -> list:
    """Rank `rank`'s share of a list every rank built identically: items r, r+N, r+2N, ...
    equal=True drops the last len % N items so every rank gets the same count (training: each
    step's all-reduce needs every rank; what is dropped is at most N-1 batches per epoch)."""
    if world == 1:
        return list(items)
    if equal:
        items = items[:len(items) // world * world]
    return list(items[rank::world])
