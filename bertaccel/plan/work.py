"""The work of a configuration before it runs: batches, padded tokens, optimizer steps, FLOPs.

Nothing is estimated where it can be counted. The train split is tokenized with the run's own
tokenizer through data/tokens.py's token cache (the file a run of the same data reads; the full train
split after dataset.train_subset, no sample), and the run's own batch sampler
(data.LengthGroupedBatches / ShuffledBatches, same seed, every epoch, every rank) is replayed on
the token lengths alone, padding each batch as data.PadCollator does (longest sequence rounded
up to train.pad_to_multiple_of; compiled runs fill short batches up to batch_size). So the
padded tokens and B*S^2 of every epoch are the ones the run will train on, and flops.py counts
their FLOPs on a model built on the meta device (no weights, no memory) with the freezing
schedule of each epoch applied.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, NamedTuple, Optional, Tuple, Union

import torch

from bertaccel.config import RunConfig
from bertaccel.options.accumulation import is_adaptive
from bertaccel.options.train import fits_batch
from bertaccel.measure.flops import TokenCounts, bert_train_flops

from .roofline import Trained, trained

if TYPE_CHECKING:
    from transformers import PretrainedConfig  # (bertaccel.data: imported where the batches are made)
    from ..data import LengthGroupedBatches, ShuffledBatches

WORK_SOURCE = ("data/batches.py's batch sampler replayed on the tokenized train split (same seed, epochs, ranks), "
               "batches padded as data.PadCollator pads; FLOPs by flops.py on the meta-device model, "
               "freezing schedule applied per epoch")


@dataclass
class Work:
    train_rows: int                   # rows of the train split after dataset.train_subset
    epochs: int
    micro_batches: int                # over all epochs and ranks
    optimizer_steps: Optional[int]    # None: accumulation=adaptive decides them while it runs
    tokens: TokenCounts               # over all epochs and ranks
    model_flops: float
    samples: int                      # rows trained (filler rows not counted)
    why_no_steps: str = ""
    # What the probe (probe.py) and the wall-time prediction (wall.py) need of the shapes:
    rows_per_batch: int = 0           # rows of a train micro-batch (filler rows included)
    micro_lengths: List[int] = field(default_factory=list)  # rank 0's padded length per micro-batch, all epochs
    eval_batches: List[Tuple[int, int]] = field(default_factory=list)  # rank 0's (rows, padded length), one evaluation
    # What trains in each epoch (freezing applied): the optimizer's and the backward's share of
    # the memory-bound work that plan/roofline.py counts. Empty: not counted (no roofline).
    trained: List[Trained] = field(default_factory=list)


@dataclass
class DataShape:
    """What the work needs of the data: the train split's token lengths and the label count."""
    lengths: torch.Tensor
    num_labels: int
    vocab_size: int
    key: str = ""
    test_lengths: Optional[torch.Tensor] = None  # the test split's token lengths (its evaluation's shapes)


def data_shape(cfg: RunConfig, memo: Optional[Dict[str, DataShape]] = None) -> DataShape:
    """Token lengths of the configuration's train split (data/: load_raw, the model's tokenizer,
    tokenize_cached under cfg.cache_dir). memo: configurations of one grid that share the data
    share one tokenization. Raises data.DataError / DatasetUnavailable / model.ModelUnavailable."""
    from ..data import load_raw, tokenize_cached
    from ..model import load_tokenizer

    key = json.dumps([asdict(cfg.dataset), asdict(cfg.model), cfg.cache_dir], sort_keys=True, default=str)
    if memo is not None and key in memo:
        return memo[key]
    raw = load_raw(cfg.dataset, cfg.cache_dir)
    tokenizer = load_tokenizer(cfg.model)
    data = tokenize_cached(raw, tokenizer, cfg.dataset.max_length, cfg.cache_dir)
    shape = DataShape(data.train.lengths, raw.num_labels, len(tokenizer), key, data.test.lengths)
    if memo is not None:
        memo[key] = shape
    return shape


def meta_model(config: PretrainedConfig) -> torch.nn.Module:
    """The classifier's modules on the meta device: shapes for flops.py, no memory, no init."""
    from transformers import AutoModelForSequenceClassification

    with torch.device("meta"):
        model: torch.nn.Module = AutoModelForSequenceClassification.from_config(config)
    return model


def _sampler(lengths: torch.Tensor, cfg: RunConfig, rank: int, world: int
             ) -> Union[LengthGroupedBatches, ShuffledBatches]:
    from ..data import LengthGroupedBatches, ShuffledBatches

    generator = torch.Generator().manual_seed(cfg.train.seed)  # make_loader's: one per loader, all epochs
    if cfg.train.group_by_length:
        return LengthGroupedBatches(lengths, cfg.train.batch_size, generator, rank, world)
    return ShuffledBatches(len(lengths), cfg.train.batch_size, generator, rank, world)


def _batch_counts(lengths: torch.Tensor, batch: List[int], multiple: int, rows: Optional[int]) -> TokenCounts:
    """data.PadCollator's shape for these rows: longest length rounded up, filler rows to `rows`."""
    longest = int(lengths[batch].max())
    s = -(-longest // multiple) * multiple
    b = max(len(batch), rows or 0)
    # Filler rows attend to one token each and are not text (flops.TokenCounts.add).
    real = lengths[batch]
    fillers = b - len(batch)  # one token each, computed like a row of length 1
    return TokenCounts(sequences=b, padded_tokens=b * s, real_tokens=int(real.sum()), attention_pairs=b * s * s,
                       real_attention_pairs=int((real * real).sum()) + fillers,
                       split_attention_pairs=int((real * real + (s - real) * (s - real)).sum())
                       + fillers * (1 + (s - 1) * (s - 1)))


class EpochBatches(NamedTuple):
    """What epoch_batches counts, as train/loop.py's loop takes the batches."""
    tokens: List[TokenCounts]  # per epoch: the tokens trained (all ranks)
    micro_batches: List[int]   # per epoch: micro-batches (all ranks)
    optimizer_steps: List[int]  # per epoch
    samples: int               # the rows trained in all (filler rows not counted)
    rank0_lengths: List[int]   # rank 0's micro-batches, each as its padded length


def epoch_batches(lengths: torch.Tensor, cfg: RunConfig) -> EpochBatches:
    """Per epoch: the tokens trained (all ranks), micro-batches (all ranks) and optimizer steps;
    and the rows trained in all (filler rows not counted), and rank 0's padded lengths,
    as train/loop.py's loop takes them (windows of `accumulation`, train.max_steps_per_epoch)."""
    from bertaccel.train.step import uses_fixed_shapes

    world = int(cfg.num_gpus)
    adaptive = is_adaptive(cfg.accumulation)
    k = 2 if adaptive else int(cfg.accumulation)  # train/loop.py: adaptive k is at least 2
    rows = cfg.train.batch_size if uses_fixed_shapes(cfg) else None
    samplers = [_sampler(lengths, cfg, r, world) for r in range(world)]
    per_rank = len(samplers[0])
    steps = math.ceil(per_rank / k)
    if cfg.train.max_steps_per_epoch:
        steps = min(steps, cfg.train.max_steps_per_epoch)
    taken = per_rank if adaptive else min(per_rank, steps * k)  # micro-batches per rank per epoch
    tokens: List[TokenCounts] = []
    micro: List[int] = []
    opt_steps: List[int] = []
    samples = 0
    rank0_lengths: List[int] = []
    for _ in range(cfg.train.epochs):
        counts = TokenCounts()
        for r, sampler in enumerate(samplers):
            for i, batch in enumerate(sampler):
                if i == taken:
                    break
                one = _batch_counts(lengths, batch, cfg.train.pad_to_multiple_of, rows)
                counts += one
                samples += len(batch)
                if r == 0:
                    rank0_lengths.append(one.padded_tokens // one.sequences)
        tokens.append(counts)
        micro.append(taken * world)
        opt_steps.append(steps)
    return EpochBatches(tokens, micro, opt_steps, samples, rank0_lengths)


def eval_row_lengths(test_lengths: Optional[torch.Tensor], cfg: RunConfig) -> List[List[int]]:
    """Rank 0's evaluation batches as row lengths, as data.make_loader cuts the test split (sorted
    by length when train.group_by_length, in order otherwise; every rank's share)."""
    from bertaccel.distributed import shard

    if test_lengths is None or not len(test_lengths):
        return []
    size = int(cfg.train.eval_batch_size)
    order = torch.argsort(test_lengths, stable=True) if cfg.train.group_by_length else torch.arange(len(test_lengths))
    batches = [order[i:i + size] for i in range(0, len(order), size)]
    return [test_lengths[b].tolist() for b in shard(batches, 0, int(cfg.num_gpus), equal=False)]


def eval_batches(test_lengths: Optional[torch.Tensor], cfg: RunConfig) -> List[Tuple[int, int]]:
    """Rank 0's evaluation batches as (rows, padded length), as PadCollator pads them."""
    from bertaccel.train.step import uses_fixed_shapes

    multiple = max(1, int(cfg.train.pad_to_multiple_of))
    rows = int(cfg.train.eval_batch_size) if uses_fixed_shapes(cfg) else 0
    return [(max(len(r), rows), -(-max(r) // multiple) * multiple) for r in eval_row_lengths(test_lengths, cfg)]


def work_of(cfg: RunConfig, data: DataShape, config: PretrainedConfig) -> Work:
    """The configuration's whole training: every epoch's tokens and FLOPs (freezing per epoch)."""
    from bertaccel.options.freezing import apply_freezing

    if fits_batch(cfg.train):
        raise ValueError("train.batch_size=auto: the batch is found by trying sizes on the GPU when the run starts, so "
                         "its work cannot be counted beforehand; plan at the batch an auto run of this configuration "
                         "logged (metric batch_size_used), e.g. train.batch_size=512")
    if is_adaptive(cfg.accumulation) and cfg.train.max_steps_per_epoch:
        raise ValueError("accumulation=adaptive with train.max_steps_per_epoch: how many micro-batches run depends "
                         "on the gradient variance measured while training")
    tokens, micro, steps, samples, micro_lengths = epoch_batches(data.lengths, cfg)
    model = meta_model(config)
    flops, total, trains = 0.0, TokenCounts(), []
    for epoch, counts in enumerate(tokens):
        apply_freezing(model, cfg.freezing.name, epoch)
        flops += bert_train_flops(model, counts)
        total += counts
        trains.append(trained(model))
    adaptive = is_adaptive(cfg.accumulation)
    return Work(train_rows=len(data.lengths), epochs=int(cfg.train.epochs), micro_batches=sum(micro),
                optimizer_steps=None if adaptive else sum(steps), tokens=total, model_flops=flops,
                samples=samples, trained=trains,
                why_no_steps="accumulation=adaptive: k is chosen from the gradient variance while training"
                if adaptive else "",
                rows_per_batch=int(cfg.train.batch_size), micro_lengths=micro_lengths,
                eval_batches=eval_batches(data.test_lengths, cfg))

