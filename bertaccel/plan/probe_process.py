"""The probe's own process (plan/probe.py orchestrates and caches): forked from the runs'
forkserver as a run is, it does what a run does up to its first window (data read and token
cache, model build, device start, the warm-up through the run's compile cache), then trains
PROBE_STEPS rounds of steps over three of the run's padded lengths, taking turns step by step,
through a DataLoader built as the run's, and one evaluation over up to PROBE_EVAL_BATCHES of the
run's evaluation batches. It reports times; the fit and the cache are probe.py's.
"""
from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from multiprocessing.context import ForkServerContext, ForkServerProcess
from multiprocessing.queues import SimpleQueue
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, TypedDict, TypeVar

import torch

from bertaccel.config import RunConfig
from bertaccel.options.accumulation import is_adaptive

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from .work import DataShape

log = logging.getLogger("bertaccel")

PROBE_QUANTILES = (0.1, 0.5, 0.9)  # of the run's micro-batch padded lengths
PROBE_STEPS = 6                    # rounds of optimizer steps over the lengths; the first is dropped
PROBE_EVAL_BATCHES = 8


class ProbeJob(TypedDict):
    """One configuration for a probe process (probe.py _job): sent as it is, a dataclass pickles."""
    cfg: RunConfig
    data: DataShape
    config: PretrainedConfig  # the model's, as the run builds it
    device: str               # torch.device's name
    warm_only: bool           # only the warm-up: the compile caches' fill


def probe_lengths(cfg: RunConfig, train_lengths: torch.Tensor) -> List[List[int]]:
    """Row lengths of the run's own rank-0 micro-batches at the PROBE_QUANTILES of their padded
    length (first epoch's order, the run's sampler and seed): what the probe feeds the loop."""
    from .work import _sampler

    multiple = max(1, int(cfg.train.pad_to_multiple_of))
    batches = list(_sampler(train_lengths, cfg, 0, int(cfg.num_gpus)))
    if not batches:
        return []
    padded = sorted(((-(-int(train_lengths[b].max()) // multiple) * multiple), i) for i, b in enumerate(batches))
    chosen, seen = [], set()
    for q in PROBE_QUANTILES:
        length, i = padded[min(len(padded) - 1, int(q * len(padded)))]
        if length not in seen:
            seen.add(length)
            chosen.append(train_lengths[batches[i]].tolist())
    return chosen


def _window_flops(model: torch.nn.Module, batch: Dict[str, torch.Tensor], k: int) -> float:
    """FLOPs of one optimizer step at this batch (k micro-batches), counted as flops.py counts a
    run's (so the fit's rate and a run's model_flops agree); model: the meta-device copy, epoch
    0's freezing applied."""
    from bertaccel.measure.flops import TokenCounts, bert_train_flops

    counts = TokenCounts()
    counts.add(batch)
    return k * bert_train_flops(model, counts)


def _probe_cfg(cfg: RunConfig) -> RunConfig:
    """The run's configuration with one epoch, no step cap, no profiler or layer timing."""
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, epochs=1, max_steps_per_epoch=None),
                               profile=False, layer_timing=False)


def _train_once(cfg: RunConfig, num_labels: int, vocab: int, device: torch.device, train_batches: Any,
                eval_batches: Any, plan: Any, shared: bool, start_from: Dict[str, Any]) -> Tuple[Any, float, str]:
    """One call of the run's train(): (result, model build s, compile cache state). shared: other
    probes run in this process too; start_from: model.build_model's (this model's tensors, filled
    by its first build in this process)."""
    from bertaccel.model import build_model
    from bertaccel.train.compile_cache import compile_caches
    from bertaccel.train.isolation import isolated_run
    from bertaccel.train.loop import train

    with isolated_run(cfg.train.seed, shared_process=shared), \
            compile_caches(cfg.cache_dir, cfg.compile, device) as ccache:
        t0 = time.perf_counter()
        model, _ = build_model(cfg.model, num_labels, cfg.attention, vocab, cfg.encoder, start_from=start_from)
        build_s = time.perf_counter() - t0
        result = train(model, train_batches, eval_batches, cfg, device, log=log.debug, warmup_plan=plan)
        ccache.mark_warmed_up()
        state = ccache.state(result.compiled_anything)
    return result, build_s, state


def _loader(batches: List[List[int]], cfg: RunConfig, rows: Optional[int], vocab: int, pad_id: int, generator: torch.Generator,
            device: torch.device) -> Any:
    """A DataLoader as data.make_loader builds the run's (PadCollator, pinning, workers) over rows
    of these lengths (synthetic ids), yielding these batches in this order."""
    from torch.utils.data import DataLoader

    from bertaccel.data.batches import PadCollator
    from bertaccel.data.tokens import TokenizedSplit

    lengths = torch.tensor([n for b in batches for n in b], dtype=torch.long)
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.long)
    offsets[1:] = torch.cumsum(lengths, 0)
    ids = torch.randint(1, vocab, (int(offsets[-1]),), generator=generator, dtype=torch.int32)
    split = TokenizedSplit(ids, offsets, torch.zeros(len(lengths), dtype=torch.long))
    order, start = [], 0
    for b in batches:
        order.append(list(range(start, start + len(b))))
        start += len(b)
    workers = int(cfg.train.num_workers)
    pin = device.type == "cuda" if cfg.train.pin_memory is None else bool(cfg.train.pin_memory)
    prefetch = cfg.train.prefetch_factor if workers > 0 and cfg.train.prefetch_factor else None  # (None: torch's own)
    return DataLoader(split, batch_sampler=order, collate_fn=PadCollator(pad_id, int(cfg.train.pad_to_multiple_of), rows),
                      num_workers=workers, pin_memory=pin, persistent_workers=bool(cfg.train.persistent_workers) and workers > 0,
                      prefetch_factor=prefetch)


def _read_data(cfg: RunConfig, read: Dict[str, Tuple[Any, float]]) -> Tuple[Any, float]:
    """(the tokenizer, seconds): the run's own data read and token cache (a hit: the plan
    tokenized this data already), as a fresh run process does it; read: this process's earlier
    reads, by data and tokenizer. A later probe of the same data in this process does not read it
    again: the time is the first's (a run's, in its fresh process), and only the tokenizer's pad
    id is used here."""
    from bertaccel.data import load_raw, tokenize_cached
    from bertaccel.model import load_tokenizer, tokenizer_source

    key = repr((cfg.dataset, tokenizer_source(cfg.model), cfg.cache_dir))
    if key not in read:
        t0 = time.perf_counter()
        raw = load_raw(cfg.dataset, cfg.cache_dir)
        tokenizer = load_tokenizer(cfg.model)
        tokenize_cached(raw, tokenizer, cfg.dataset.max_length, cfg.cache_dir)
        read[key] = (tokenizer, time.perf_counter() - t0)
    return read[key]


def _probe_here(cfg: RunConfig, data: DataShape, config: PretrainedConfig, device: torch.device, warm_only: bool,
                shared: bool = False, start_from: Optional[Dict[str, Any]] = None,
                read: Optional[Dict[str, Tuple[Any, float]]] = None) -> Dict[str, Any]:
    """The body of a probe process: what a run does up to its windows, then the probe's steps
    through the run's kind of loader, the lengths taking turns step by step (as a run's shuffled
    length groups change shape from one step to the next).
    warm_only: the warm-up alone (one step), to time it against the cache an earlier probe filled.
    start_from, read: this process's model tensors and data reads, shared by its probes."""
    from bertaccel.data.batches import PadCollator
    from bertaccel.options.freezing import apply_freezing
    from bertaccel.train.step import uses_fixed_shapes
    from bertaccel.train.warmup import WarmupPlan, data_lengths

    from .work import eval_row_lengths, meta_model

    tokenizer, data_s = _read_data(cfg, {} if read is None else read)
    c = _probe_cfg(cfg)
    multiple = max(1, int(c.train.pad_to_multiple_of))
    rows = int(c.train.batch_size) if uses_fixed_shapes(c) else None
    k = 2 if is_adaptive(c.accumulation) else int(c.accumulation)
    vocab, pad_id = int(config.vocab_size), int(tokenizer.pad_token_id or 0)
    g = torch.Generator().manual_seed(int(c.train.seed))
    chosen = probe_lengths(c, data.lengths)
    # Each probed batch's shape and FLOPs, collated as the loader below collates it.
    collate = PadCollator(pad_id, multiple, rows)
    meta = meta_model(config)
    apply_freezing(meta, c.freezing.name, 0)
    flops, lengths = [], []
    for row_lengths in chosen:
        batch = collate([(torch.ones(n, dtype=torch.int32), torch.tensor(0)) for n in row_lengths])
        lengths.append(int(batch["input_ids"].shape[1]))
        flops.append(_window_flops(meta, batch, k))
    rounds = 1 if warm_only else PROBE_STEPS
    train_rows = [b for _ in range(rounds) for b in chosen for _ in range(k)]
    if warm_only:
        train_rows = train_rows[:k]
    assert data.test_lengths is not None  # (probe.py requests no probe of data without them)
    # The evaluation's batches: evenly spaced over the run's own.
    picks = _spread(eval_row_lengths(data.test_lengths, c), 1 if warm_only else PROBE_EVAL_BATCHES)
    plan = WarmupPlan(int(c.train.batch_size), int(c.train.eval_batch_size),
                      data_lengths(data.lengths, multiple), data_lengths(data.test_lengths, multiple))
    train_loader = _loader(train_rows, c, rows, vocab, pad_id, g, device)
    eval_loader = _loader(picks, c, int(c.train.eval_batch_size) if rows else None, vocab, pad_id, g, device)
    t_called = time.time()
    result, build_s, state = _train_once(c, data.num_labels, vocab, device, train_loader, eval_loader, plan, shared,
                                         {} if start_from is None else start_from)
    out = {"data_s": data_s, "build_s": build_s, "state": state, "compile_time_s": result.compile_time_s,
           "compiled_anything": result.compiled_anything,
           "device_ready_s": max(0.0, result.device_ready_at - t_called - build_s),
           "set_up_s": max(0.0, result.first_step_started_at - result.device_ready_at - result.compile_time_s)}
    if not warm_only:
        steps, n = result.epochs[0].step_ms, len(lengths)
        # step i ran length i % n; the first round is dropped (each length's first appearance)
        out["points"] = [{"length": length, "window_flops": f, "step_ms": statistics.median(steps[j::n][1:])}
                         for j, (length, f) in enumerate(zip(lengths, flops))]
        out["eval_s_per_batch"] = result.epochs[0].eval_time_s / len(picks) if picks else None
    return out


def _worker(jobs: List[ProbeJob], results: SimpleQueue[Any]) -> None:
    """A probe process, forked from the runs' forkserver as a run is (module level: picklable):
    its jobs one after the other, each one's result or error (one line) in order. Several jobs
    share the process as runs of launcher=inline share theirs (train/isolation.py resets what it
    can between them): only configurations that compile nothing are put together (probe.py)."""
    entered = time.time()
    outs: List[Tuple[str, Any]] = []
    # Per model: its tensors and its first build's time. A run builds its model in a fresh process,
    # as the first probe of that model here did; a later one starts from the same tensors (BERT-base's
    # init alone: 0.9 s on a CPU) and reports the first's build time.
    weights: Dict[str, Dict[str, Any]] = {}
    builds: Dict[str, float] = {}
    read: Dict[str, Tuple[Any, float]] = {}
    for i, job in enumerate(jobs):
        t0 = time.perf_counter()
        try:
            model = repr((job["cfg"].model, job["data"].num_labels, job["config"].vocab_size))
            # The first runs as in a fresh run process (nothing to reset); each later one is reset first.
            out = _probe_here(job["cfg"], job["data"], job["config"], torch.device(job["device"]),
                              job["warm_only"], shared=i > 0, start_from=weights.setdefault(model, {}), read=read)
            out["build_s"] = builds.setdefault(model, out["build_s"])
            outs.append(("ok", {**out, "own_s": time.perf_counter() - t0}))
        except Exception as e:  # noqa: BLE001 - said in the plan, one line
            text = str(e).strip().splitlines()
            outs.append(("error", f"{type(e).__name__}: {text[0][:300] if text else ''}"))
    results.put((entered, outs))


def in_probe_process(ctx: ForkServerContext, jobs: List[ProbeJob], timeout_s: float) -> Tuple[List[Tuple[str, Any]], float]:
    """Run one probe process over its jobs; (each job's ("ok", result) or ("error", why), seconds
    from the process's start to its code: a later run's fork). timeout_s: per job."""
    results = ctx.SimpleQueue()
    t0 = time.time()
    proc = ctx.Process(target=_worker, args=(jobs, results))
    proc.start()
    deadline = time.monotonic() + timeout_s * len(jobs)
    try:
        while results.empty():
            if not proc.is_alive() and results.empty():
                raise RuntimeError(f"the probe's process ended without a result (exit code {proc.exitcode})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the probe took longer than launcher.timeout_s={timeout_s:g} s per configuration")
            time.sleep(0.05)
        entered, outs = results.get()
    finally:
        if proc.is_alive() and results.empty():
            proc.kill()
        proc.join()
    return outs, entered - t0


def side_by_side(ctx: ForkServerContext, jobs: List[ProbeJob], at_once: int, timeout_s: float) -> List[Tuple[str, Any]]:
    """Each job in a process of its own, at most at_once at a time: each one's ("ok", result) or
    ("error", why), in order. For work whose time is not what is measured (the compile caches'
    fill, probe.py): processes side by side share the host's cores."""
    pending = list(enumerate(jobs))
    running: Dict[int, Tuple[ForkServerProcess, SimpleQueue[Any], float]] = {}  # (process, its result, deadline)
    outs: List[Tuple[str, Any]] = [("error", "not run")] * len(jobs)
    while pending or running:
        while pending and len(running) < max(1, at_once):
            i, job = pending.pop(0)
            queue = ctx.SimpleQueue()
            proc = ctx.Process(target=_worker, args=([job], queue))
            proc.start()
            running[i] = (proc, queue, time.monotonic() + timeout_s)
        for i, (proc, queue, deadline) in list(running.items()):
            if not queue.empty():
                outs[i] = queue.get()[1][0]
            elif not proc.is_alive() and queue.empty():
                outs[i] = ("error", f"RuntimeError: its process ended without a result (exit code {proc.exitcode})")
            elif time.monotonic() > deadline:
                proc.kill()
                outs[i] = ("error", f"RuntimeError: it took longer than launcher.timeout_s={timeout_s:g} s")
            else:
                continue
            proc.join()
            del running[i]
        time.sleep(0.05)
    return outs


T = TypeVar("T")


def _spread(items: List[T], n: int) -> List[T]:
    """n items evenly spaced over the list (all when it has no more)."""
    if len(items) <= n:
        return items
    return [items[round(i * (len(items) - 1) / (n - 1))] for i in range(n)] if n > 1 else items[:1]
