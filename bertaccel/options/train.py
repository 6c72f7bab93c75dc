"""The `train` block's checks: the batch (a count or auto, bertaccel/train/batch_fit.py), the
device, the loader's workers and activation checkpointing (bertaccel/train/checkpointing.py)."""
from __future__ import annotations

from typing import Any, Optional

from bertaccel.config import DEVICES, GRADIENT_CHECKPOINTING, not_count_or, not_one_of


def check(cfg: Any) -> Optional[str]:
    """Refuses a batch_size that is neither an integer >= 1 nor auto, auto with num_gpus > 1 (the
    search runs in one process), an unknown device or gradient_checkpointing, and a
    prefetch_factor without loader workers."""
    tr = cfg.train
    why = not_count_or("train.batch_size", tr.batch_size, "auto")
    if why:
        return why
    if tr.batch_size == "auto" and cfg.num_gpus > 1:
        return (f"train.batch_size=auto with num_gpus={cfg.num_gpus}: the search runs in one process; "
                "use num_gpus=1, or give the batch found by a num_gpus=1 run (metric batch_size_used)")
    why = not_one_of("train.device", tr.device, DEVICES)
    if why:
        return why
    if tr.prefetch_factor is not None and tr.num_workers == 0:
        return (f"train.prefetch_factor={tr.prefetch_factor} needs loader workers: set train.num_workers > 0 "
                "(without workers batches are made in the training loop, nothing is prefetched)")
    return not_one_of("train.gradient_checkpointing", tr.gradient_checkpointing, GRADIENT_CHECKPOINTING)
