"""The train block: the training loop's settings. Its option: bertaccel/options/train.py."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from bertaccel.option import bounded

DEVICES = ("auto", "cpu", "cuda")
GRADIENT_CHECKPOINTING = ("none", "every", "sqrt")  # train.gradient_checkpointing (train/checkpointing.py)


@dataclass
class TrainConfig:
    """The training loop: batches, seed, device and data loading (checks: bertaccel/options/train.py)."""
    epochs: int = bounded(1, gt=0)  # Passes over the training data
    # Rows per micro-batch and device: an integer, or "auto" (the largest power of two that fits the
    # GPU at the dataset's longest padded length, found by trying: bertaccel/train/batch_fit.py).
    # Any-typed so both spellings compose (as accumulation); validate() checks.
    batch_size: Any = 32
    eval_batch_size: int = bounded(128, gt=0)  # Rows per batch when testing
    # The seed of the model's new weights, dropout and the batches' order
    seed: int = bounded(42, ge=0, le=2**32 - 1, note="numpy's seed range; isolation.seed_everything seeds it")
    device: str = "auto"  # Where training runs. auto: a CUDA GPU when one is visible, else the CPU
    num_workers: int = bounded(0, ge=0, note="0: batches made in the training process")  # Loader worker processes making batches
    # Workers kept alive between epochs (num_workers > 0), so each epoch does not pay their start.
    persistent_workers: bool = True
    # Batches each worker prepares ahead (null = torch's default of 2; needs num_workers > 0).
    prefetch_factor: Optional[int] = bounded(None, gt=0, note="null: torch's default")
    # Page-locked host batches (null = on a GPU only): a copy from pageable memory makes the host
    # wait for the GPU stream first, so the loop could never run ahead of the GPU.
    pin_memory: Optional[bool] = None
    # Batches of similar length (shuffled), so dynamic padding pads little; false = plain shuffle.
    group_by_length: bool = True
    # Round each batch's padded length up to this multiple (1 = exact longest sequence): it bounds
    # the distinct shapes that per-shape kernels and torch.compile see.
    pad_to_multiple_of: int = bounded(8, gt=0, note="1: exact longest sequence")
    # Stop an epoch after this many optimizer steps (null = whole epoch); for smoke runs.
    max_steps_per_epoch: Optional[int] = bounded(None, gt=0, note="null: whole epoch")
    # The loss is read back (a host sync) every this many optimizer steps: NaN check + progress bar.
    log_every_steps: int = bounded(10, gt=0)
    # Recompute activations in backward instead of keeping them: none | every (each encoder layer) |
    # sqrt (segments of sqrt(L) layers, as Systematic Training Compute Optimization, section III-E);
    # bertaccel/train/checkpointing.py.
    gradient_checkpointing: str = "none"
