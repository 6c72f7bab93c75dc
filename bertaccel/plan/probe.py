"""`plan --probe`: time a few training steps of each distinct configuration on this machine, before
the sweep, so that a plan on an empty store is calibrated by measurement, not by a default MFU.

A probe is the run's own training core (train/loop.py's `train`) on the run's own model shape,
options and batch, fed real row lengths of the run's own batches (synthetic token ids: values do
not change a step's time), with no store, no loaders and no telemetry:
- the warm-up is the run's (WarmupPlan of every padded length the data has, compiled through the
  run's persistent compile cache: cold or warm as the run would find it, and the run then finds it
  warm); when it was cold, a second warm-up in a fresh compile state times the warm one;
- PROBE_STEPS optimizer steps at each of three padded lengths (the 10th, 50th and 90th percentile
  of the run's micro-batches), taking turns step by step, through a DataLoader as the run's (its
  collation, pinning and workers are host time a small model's step is made of), the first round
  dropped (each shape's first allocations);
- one evaluation over up to PROBE_EVAL_BATCHES of the run's evaluation batches, evenly spaced.
A step's time is then fit as overhead + FLOPs / rate (fit.py): the overhead is what a step costs
however little it computes (kernel launches, host work, the optimizer's per-tensor loop), which
is all a small model at a small batch pays, and what a FLOP-only model cannot predict.

Results are cached as JSON under cache_dir/probe/<machine key>/<configuration key>.json; the
machine key names the device and every version that changes a step's speed (torch, Triton, CUDA,
Python, transformers, bertaccel), so another GPU or another torch probes again. Probes are taken
outside any MLflow store: nothing the report reads changes.
"""
from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from omegaconf import OmegaConf

from .fit import fit_overhead

log = logging.getLogger("bertaccel")

PROBE_QUANTILES = (0.1, 0.5, 0.9)  # of the run's micro-batch padded lengths
PROBE_STEPS = 6                    # rounds of optimizer steps over the lengths; the first is dropped
PROBE_EVAL_BATCHES = 8


@dataclass
class ProbeResult:
    key: Dict[str, Any]
    machine: Dict[str, str]
    points: List[Dict[str, float]]       # per probed length: length, window_flops, step_ms (median)
    fit: Dict[str, Any]                  # fit.Fit as a dict
    eval_s_per_batch: Optional[float]    # mean over the probed evaluation batches
    warmup_cold_s: Optional[float]       # None: the cache was warm when probed (cold never seen)
    warmup_warm_s: Optional[float]       # None: nothing is compiled, or not measured
    cache_state: str                     # what the probe's first warm-up met: cold / warm / none / fresh
    model_build_s: float                 # build_model, weights included
    data_s: float                        # the run's data read and token cache (a hit), in a fresh process
    fork_s: float                        # the probe process's start, forked from the runs' forkserver
    device_ready_s: float                # model to the device, CUDA and cuBLAS start-up
    set_up_s: float                      # optimizer, epoch set-up, first batch
    probe_s: float                       # the probe's own wall time
    measured_at: str
    cached: bool = False                 # read from the probe cache, not measured by this call

    @property
    def overhead_ms(self) -> float:
        return float(self.fit["overhead_ms"])

    @property
    def tflops(self) -> Optional[float]:
        return self.fit["tflops"]


def machine_key(device: torch.device) -> Dict[str, str]:
    """What a probe's numbers depend on besides the configuration."""
    from importlib import metadata

    from bertaccel.train.compile_cache import cache_key_parts

    parts = dict(cache_key_parts(device))
    for package in ("transformers", "bertaccel", "xformers"):
        try:
            parts[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            parts[package] = "absent"
    return parts


def probe_key(cfg: Any, config: Any, lengths: Sequence[int], eval_shapes: Sequence[Tuple[int, int]]) -> Dict[str, Any]:
    """The configuration as far as a step's time depends on it, and the shapes probed."""
    c = OmegaConf.to_container(cfg, resolve=True)
    return {
        "model": {k: getattr(config, k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                  "intermediate_size", "vocab_size", "num_labels")},
        "model_source": c["model"].get("source"),
        **{g: c[g] for g in ("precision", "attention", "encoder", "compile", "optimizer", "freezing")},
        "accumulation": c["accumulation"],
        "train": {k: c["train"][k] for k in ("batch_size", "eval_batch_size", "pad_to_multiple_of",
                                             "gradient_checkpointing", "log_every_steps", "seed")},
        "lengths": list(lengths), "eval_shapes": [list(s) for s in eval_shapes],
    }


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cache_path(cache_dir: str, machine: Dict[str, str], key: Dict[str, Any]) -> Path:
    return Path(cache_dir) / "probe" / _digest(machine) / f"{_digest(key)}.json"


def read_cached(path: Path) -> Optional[ProbeResult]:
    """A cached probe, or None (absent, or unreadable: probed again)."""
    try:
        data = json.loads(path.read_text())
        return ProbeResult(**{**data, "cached": True})
    except (OSError, ValueError, TypeError):
        return None


def _write(path: Path, result: ProbeResult) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({k: v for k, v in asdict(result).items() if k != "cached"}, indent=1))
    os.replace(tmp, path)  # (a reader never sees half a file)


def probe_lengths(cfg: Any, train_lengths: torch.Tensor) -> List[List[int]]:
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


def _batch(row_lengths: Sequence[int], rows: Optional[int], multiple: int, vocab: int,
           generator: torch.Generator) -> Dict[str, torch.Tensor]:
    """A host batch as data.PadCollator makes it from rows of these lengths (filler rows to `rows`)."""
    lengths = torch.tensor(list(row_lengths), dtype=torch.long)
    s = -(-int(lengths.max()) // multiple) * multiple
    fill = max(0, (rows or 0) - len(lengths))
    lengths = torch.cat([lengths, torch.ones(fill, dtype=torch.long)])
    mask = (torch.arange(s)[None, :] < lengths[:, None]).long()
    ids = torch.randint(1, vocab, (len(lengths), s), generator=generator) * mask
    labels = torch.zeros(len(lengths), dtype=torch.long)
    labels[len(lengths) - fill:] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _window_flops(config: Any, cfg: Any, batch: Dict[str, torch.Tensor], k: int) -> float:
    """FLOPs of one optimizer step at this batch (k micro-batches), epoch 0's freezing applied,
    counted as flops.py counts a run's (so the fit's rate and a run's model_flops agree)."""
    from bertaccel.measure.flops import TokenCounts, bert_train_flops
    from bertaccel.options.freezing import apply_freezing

    from .work import meta_model

    model = meta_model(config)
    apply_freezing(model, cfg.freezing.name, 0)
    counts = TokenCounts()
    counts.add(batch)
    return k * bert_train_flops(model, counts)


def _probe_cfg(cfg: Any) -> Any:
    """The run's configuration with one epoch, no step cap, no profiler or layer timing."""
    c = copy.deepcopy(cfg)
    OmegaConf.set_struct(c, False)
    c.train.epochs = 1
    c.train.max_steps_per_epoch = None
    c.profile = False
    c.layer_timing = False
    return c


def _train_once(cfg: Any, num_labels: int, vocab: int, device: torch.device, train_batches: Any,
                eval_batches: Any, plan: Any) -> Tuple[Any, float, str]:
    """One call of the run's train(): (result, model build s, compile cache state)."""
    from bertaccel.model import build_model
    from bertaccel.train.compile_cache import compile_caches
    from bertaccel.train.isolation import isolated_run
    from bertaccel.train.loop import train

    with isolated_run(cfg.train.seed, shared_process=False), \
            compile_caches(cfg.cache_dir, cfg.compile.cache, device) as ccache:
        t0 = time.perf_counter()
        model, _ = build_model(cfg.model, num_labels, cfg.attention, vocab, cfg.encoder)
        build_s = time.perf_counter() - t0
        result = train(model, train_batches, eval_batches, cfg, device, log=log.debug, warmup_plan=plan)
        ccache.mark_warmed_up()
        state = ccache.state(result.compiled_anything)
    return result, build_s, state


def _loader(batches: List[List[int]], cfg: Any, rows: Optional[int], vocab: int, pad_id: int, generator: torch.Generator,
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
    extra = {"prefetch_factor": cfg.train.prefetch_factor} if workers > 0 and cfg.train.prefetch_factor else {}
    return DataLoader(split, batch_sampler=order, collate_fn=PadCollator(pad_id, int(cfg.train.pad_to_multiple_of), rows),
                      num_workers=workers, pin_memory=pin, persistent_workers=bool(cfg.train.persistent_workers) and workers > 0,
                      **extra)


def _probe_here(cfg: Any, data: Any, config: Any, device: torch.device, warm_only: bool) -> Dict[str, Any]:
    """The body of a probe process: what a run does up to its windows, then the probe's steps
    through the run's kind of loader, the lengths taking turns step by step (as a run's shuffled
    length groups change shape from one step to the next).
    warm_only: the warm-up alone (one step), to time it against the cache an earlier probe filled."""
    from bertaccel.data import load_raw, tokenize_cached
    from bertaccel.model import load_tokenizer
    from bertaccel.train.step import uses_fixed_shapes
    from bertaccel.train.warmup import WarmupPlan, data_lengths

    from .work import eval_row_lengths

    t0 = time.perf_counter()
    # The run's own data read and token cache (a hit: the plan tokenized this data already).
    raw = load_raw(cfg.dataset, cfg.cache_dir)
    tokenizer = load_tokenizer(cfg.model)
    tokenize_cached(raw, tokenizer, cfg.dataset.max_length, cfg.cache_dir)
    data_s = time.perf_counter() - t0
    c = _probe_cfg(cfg)
    multiple = max(1, int(c.train.pad_to_multiple_of))
    rows = int(c.train.batch_size) if uses_fixed_shapes(c) else None
    k = 2 if c.accumulation == "adaptive" else int(c.accumulation)
    vocab, pad_id = int(config.vocab_size), int(tokenizer.pad_token_id or 0)
    g = torch.Generator().manual_seed(int(c.train.seed))
    chosen = probe_lengths(c, data.lengths)
    flops, lengths = [], []
    for row_lengths in chosen:
        batch = _batch(row_lengths, rows, multiple, vocab, g)
        lengths.append(int(batch["input_ids"].shape[1]))
        flops.append(_window_flops(config, c, batch, k))
    rounds = 1 if warm_only else PROBE_STEPS
    train_rows = [b for _ in range(rounds) for b in chosen for _ in range(k)]
    if warm_only:
        train_rows = train_rows[:k]
    # The evaluation's batches: evenly spaced over the run's own.
    picks = _spread(eval_row_lengths(data.test_lengths, c), 1 if warm_only else PROBE_EVAL_BATCHES)
    plan = WarmupPlan(int(c.train.batch_size), int(c.train.eval_batch_size),
                      data_lengths(data.lengths, multiple), data_lengths(data.test_lengths, multiple))
    train_loader = _loader(train_rows, c, rows, vocab, pad_id, g, device)
    eval_loader = _loader(picks, c, int(c.train.eval_batch_size) if rows else None, vocab, pad_id, g, device)
    t_called = time.time()
    result, build_s, state = _train_once(c, data.num_labels, vocab, device, train_loader, eval_loader, plan)
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


def _worker(job: Dict[str, Any], results: Any) -> None:
    """A probe process, forked from the runs' forkserver as a run is (module level: picklable)."""
    entered = time.time()
    try:
        out = _probe_here(OmegaConf.create(job["cfg"]), job["data"], job["config"], torch.device(job["device"]),
                          job["warm_only"])
        results.put(("ok", {**out, "entered_at": entered}))
    except Exception as e:  # noqa: BLE001 - said in the plan, one line
        text = str(e).strip().splitlines()
        results.put(("error", f"{type(e).__name__}: {text[0][:300] if text else ''}"))


def _in_process(ctx: Any, job: Dict[str, Any], timeout_s: float) -> Tuple[Dict[str, Any], float]:
    """Run one probe process; (its result, seconds from its start to its code: a later run's fork)."""
    results = ctx.SimpleQueue()
    t0 = time.time()
    proc = ctx.Process(target=_worker, args=(job, results))
    proc.start()
    deadline = time.monotonic() + timeout_s
    try:
        while results.empty():
            if not proc.is_alive() and results.empty():
                raise RuntimeError(f"the probe's process ended without a result (exit code {proc.exitcode})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the probe took longer than launcher.timeout_s={timeout_s:g} s")
            time.sleep(0.05)
        status, out = results.get()
    finally:
        if proc.is_alive() and results.empty():
            proc.kill()
        proc.join()
    if status != "ok":
        raise RuntimeError(out)
    return out, out["entered_at"] - t0


def run_probe(cfg: Any, data: Any, config: Any, device: torch.device, ctx: Any) -> Tuple[ProbeResult, List[float]]:
    """Probe one configuration in processes of the runs' kind (ctx: the forkserver context the
    runs start from, its preload imported); data: work.DataShape. Also returns the forks' times."""
    t_start = time.perf_counter()
    job = {"cfg": OmegaConf.to_container(cfg, resolve=True), "data": data, "config": config, "device": str(device),
           "warm_only": False}
    timeout_s = float(cfg.launcher.timeout_s)
    out, fork_s = _in_process(ctx, job, timeout_s)
    forks = [fork_s]
    fit = fit_overhead([p["window_flops"] for p in out["points"]], [p["step_ms"] / 1e3 for p in out["points"]])
    state = out["state"]
    cold_s = out["compile_time_s"] if state in ("cold", "fresh") else None
    warm_s = out["compile_time_s"] if state == "warm" else None
    if state == "cold" and cfg.compile.cache == "persistent":
        # The runs will find the cache this probe filled, each in a fresh process: time that too.
        again, fork_s = _in_process(ctx, {**job, "warm_only": True}, timeout_s)
        warm_s = again["compile_time_s"]
        forks.append(fork_s)
    return ProbeResult(
        key={}, machine={}, points=out["points"], fit=asdict(fit), eval_s_per_batch=out["eval_s_per_batch"],
        warmup_cold_s=cold_s, warmup_warm_s=warm_s, cache_state=state, model_build_s=out["build_s"],
        device_ready_s=out["device_ready_s"], set_up_s=out["set_up_s"], data_s=out["data_s"], fork_s=forks[0],
        probe_s=time.perf_counter() - t_start, measured_at=time.strftime("%Y-%m-%dT%H:%M:%S%z")), forks


def _spread(items: List, n: int) -> List:
    """n items evenly spaced over the list (all when it has no more)."""
    if len(items) <= n:
        return items
    return [items[round(i * (len(items) - 1) / (n - 1))] for i in range(n)] if n > 1 else items[:1]


@dataclass
class Prober:
    """The probes of one plan: each distinct key probed once, cached on disk across plans."""
    enabled: bool = False
    notes: List[str] = field(default_factory=list)
    seen: Dict[str, Optional[ProbeResult]] = field(default_factory=dict)
    probe_s: float = 0.0   # measured this time (not cache hits)

    def get(self, cfg: Any, data: Any, config: Any, work: Any, profile: Dict[str, Any],
            read_only: bool = False, runs_machine: Any = None) -> Tuple[Optional[ProbeResult], str]:
        """(the probe of this configuration, '' ) or (None, why there is none). read_only: from the
        cache only (a run's own prediction never probes)."""
        from bertaccel.options.hardware import probe as machine_probe
        from bertaccel.options.hardware import profile_mismatch, resolve_device, skip_reason

        from ..config import ConfigError

        if not (self.enabled or read_only):
            return None, "no probe (plan --probe times each configuration here first)"
        try:
            device = resolve_device(cfg.train.device)
        except ConfigError as e:
            return None, f"not probed: {e}"
        elsewhere = profile_mismatch(profile, _device_label(device), device.type)
        if elsewhere or profile.get("what_if"):
            return None, (f"not probed: the prediction is for '{profile['name']}', this machine has "
                          f"{_device_label(device)}")
        reason = skip_reason(cfg, device, machine_probe())
        if reason:
            return None, f"not probed: this machine cannot run it ({reason})"
        if int(cfg.num_gpus) > 1 and not read_only:
            note = "num_gpus>1: one GPU probed (the all-reduce is not in the probe)"
            if note not in self.notes:
                self.notes.append(note)
        test_lengths = getattr(data, "test_lengths", None)
        if test_lengths is None:
            return None, "not probed: the test split's lengths are not known here"
        machine = machine_key(device)
        key = probe_key(cfg, config, [max(r) for r in probe_lengths(cfg, data.lengths)], work.eval_batches)
        path = cache_path(cfg.cache_dir, machine, key)
        memo = str(path)
        if memo in self.seen:
            return self.seen[memo], ""
        found = read_cached(path)
        if found is None and not read_only:
            # (on stderr as it happens: a plan's probes take minutes on a GPU with compiled configurations)
            print(f"[probe] {_device_label(device)}: {_short(cfg)} ...", file=sys.stderr, flush=True)
            try:
                found, forks = run_probe(cfg, data, config, device, runs_machine.context())
                runs_machine.later_process_s += forks
            except Exception as e:  # noqa: BLE001 - one configuration that cannot be probed is said, not fatal
                self.seen[memo] = None
                return None, f"not probed: the probe failed ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
            found.key, found.machine = key, machine
            self.probe_s += found.probe_s
            _write(path, found)
            print(f"[probe] done in {found.probe_s:.1f} s: {found.fit['how']}; warm-up cold "
                  f"{found.warmup_cold_s}, warm {found.warmup_warm_s}", file=sys.stderr, flush=True)
        self.seen[memo] = found
        return (found, "") if found is not None else (None, "no probe in the cache (plan --probe)")


def _device_label(device: torch.device) -> str:
    from bertaccel.options.hardware import device_name

    return device_name(device)


def _short(cfg: Any) -> str:
    return (f"precision={cfg.precision.name} attention={cfg.attention.name} encoder={cfg.encoder.name} "
            f"compile={cfg.compile.mode} batch={cfg.train.batch_size}")

