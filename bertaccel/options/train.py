"""The `train` block's checks: the batch (a count or auto, bertaccel/train/batch_fit.py), the
device, the loader's workers and activation checkpointing (bertaccel/train/checkpointing.py)."""
from __future__ import annotations

from typing import TYPE_CHECKING, List

from bertaccel.config import DEVICES, GRADIENT_CHECKPOINTING, TrainConfig
from bertaccel.option import not_count_or, not_one_of
from bertaccel.option import Option, problems

if TYPE_CHECKING:
    from bertaccel.config import RunConfig


def fits_batch(train_cfg: TrainConfig) -> bool:
    """train.batch_size=auto: the batch is found by trying on the GPU (train/batch_fit.py)."""
    return bool(train_cfg.batch_size == "auto")


def checkpoints(train_cfg: TrainConfig) -> bool:
    """Whether activations are recomputed in backward (gradient checkpointing other than none)."""
    return train_cfg.gradient_checkpointing != "none"


class TrainOption(Option):
    section, schema = "train", TrainConfig

    def check(self, cfg: "RunConfig") -> List[str]:
        """Refuses a batch_size that is neither an integer >= 1 nor auto, an unknown device or
        gradient_checkpointing, and a prefetch_factor without loader workers (batch_size=auto with
        num_gpus > 1: a rule, options/rules.py)."""
        tr = cfg.train
        found = problems(not_count_or("train.batch_size", tr.batch_size, "auto"),
                         not_one_of("train.device", tr.device, DEVICES))
        if tr.prefetch_factor is not None and tr.num_workers == 0:
            found.append(f"train.prefetch_factor={tr.prefetch_factor} needs loader workers: set train.num_workers > 0 "
                         "(without workers batches are made in the training loop, nothing is prefetched)")
        return found + problems(not_one_of("train.gradient_checkpointing", tr.gradient_checkpointing,
                                           GRADIENT_CHECKPOINTING))


OPTION = TrainOption()
