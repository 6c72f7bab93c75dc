"""`plan --probe`: time a few training steps of each distinct configuration on this machine, before
the sweep, so that a plan on an empty store is calibrated by measurement, not by a default MFU.

A probe is the run's own training core (train/loop.py's `train`) on the run's own model shape,
options and batch, fed real row lengths of the run's own batches (synthetic token ids: values do
not change a step's time) through a loader built as the run's, with no store and no telemetry, in
a process forked from the runs' forkserver (probe_process.py; the configurations that compile
nothing share one such process, Prober.ahead):
- the warm-up is the run's (WarmupPlan of every padded length the data has, compiled through the
  run's persistent compile cache, which the runs then find warm). The compiled configurations'
  caches are first filled side by side, a process each (Prober.ahead: a cold compile is minutes of
  mostly one core; 6 of them took 8 minutes one after the other on an H100 host), then each is
  probed in a fresh process, its warm-up warm as the runs' will be. Where the cache was still cold
  (a fill failed), a second warm-up in a fresh process times the warm one;
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

import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from multiprocessing.context import ForkServerContext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

import torch

from ..config import RunConfig, first_line
from ..option import user_path
from ..options.compile import keeps_cache
from .fit import fit_overhead
from .probe_process import ProbeJob, in_probe_process, probe_lengths

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from .wall import Machine
    from .work import DataShape, Work



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
    cold_at_once: int = 1                # fills side by side when warmup_cold_s was measured (1: alone)
    cached: bool = False                 # read from the probe cache, not measured by this call

    @property
    def overhead_ms(self) -> float:
        return float(self.fit["overhead_ms"])

    @property
    def tflops(self) -> Optional[float]:
        tflops: Optional[float] = self.fit["tflops"]  # (fit.py's Fit as a dict: null without two points)
        return tflops


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


def probe_key(cfg: RunConfig, config: PretrainedConfig, lengths: Sequence[int], eval_shapes: Sequence[Tuple[int, int]]) -> Dict[str, Any]:
    """The configuration as far as a step's time depends on it, and the shapes probed."""
    c = asdict(cfg)
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
    return user_path(cache_dir) / "probe" / _digest(machine) / f"{_digest(key)}.json"


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


@dataclass
class Request:
    """One configuration to probe on this machine, and where its probe is cached."""
    cfg: RunConfig
    data: DataShape
    config: PretrainedConfig
    device: torch.device
    key: Dict[str, Any]
    machine: Dict[str, str]
    path: Path


def _job(req: Request, warm_only: bool = False) -> ProbeJob:
    # (the typed config as it is: a dataclass pickles; the probe's process trains it as a run would)
    return {"cfg": req.cfg, "data": req.data, "config": req.config,
            "device": str(req.device), "warm_only": warm_only}


def run_probes(reqs: Sequence[Request], ctx: ForkServerContext, fills: Optional[Dict[str, Dict[str, Any]]] = None
               ) -> Tuple[List[Tuple[Optional[ProbeResult], str]], List[float]]:
    """Probe these configurations in one process of the runs' kind (ctx: the forkserver context
    the runs start from, its preload imported), one after the other: each one's (result, '') or
    (None, why), and the forks' times. What a fresh run process pays once (its fork, data read,
    device start) is the first probe's for all of them: a later probe in the process finds it done.
    fills: by cache path, the compile caches' fills (Prober.fill): their cold warm-ups."""
    t_start = time.perf_counter()
    timeout_s = float(reqs[0].cfg.launcher.timeout_s)
    outs, fork_s = in_probe_process(ctx, [_job(r) for r in reqs], timeout_s)
    forks = [fork_s]
    first = next((out for status, out in outs if status == "ok"), None)
    done: List[Tuple[Optional[ProbeResult], str]] = []
    for i, (req, (status, out)) in enumerate(zip(reqs, outs)):
        if status != "ok":
            done.append((None, out))
            continue
        assert first is not None  # (this job's own result is an "ok" one)
        fit = fit_overhead([p["window_flops"] for p in out["points"]], [p["step_ms"] / 1e3 for p in out["points"]])
        state, fill = out["state"], (fills or {}).get(str(req.path))
        cold_s = out["compile_time_s"] if state in ("cold", "fresh") else None
        warm_s = out["compile_time_s"] if state == "warm" else None
        first_met, at_once = state, 1
        if fill is not None and fill["state"] == "cold" and state in ("warm", "cold"):
            # This plan filled the cache cold (that compile's time), and this probe, in a fresh process
            # after the fill, met it as the runs will: its warm-up is theirs, even where a few graphs
            # miss Inductor's cache every time (then "cold" again; seen on an H200 with attention=eager).
            cold_s, warm_s, first_met, at_once = fill["compile_time_s"], out["compile_time_s"], "cold", fill["at_once"]
        elif state == "cold" and keeps_cache(req.cfg.compile):
            # The runs will find the cache this probe filled, each in a fresh process: time that too.
            again, again_fork_s = in_probe_process(ctx, [_job(req, warm_only=True)], timeout_s)
            if again[0][0] != "ok":
                done.append((None, again[0][1]))
                continue
            warm_s = again[0][1]["compile_time_s"]
            forks.append(again_fork_s)
        done.append((ProbeResult(
            key=req.key, machine=req.machine, points=out["points"], fit=asdict(fit),
            eval_s_per_batch=out["eval_s_per_batch"], warmup_cold_s=cold_s, warmup_warm_s=warm_s, cache_state=first_met,
            model_build_s=out["build_s"], device_ready_s=first["device_ready_s"], set_up_s=out["set_up_s"],
            data_s=first["data_s"], fork_s=forks[0],
            probe_s=(time.perf_counter() - t_start) if len(reqs) == 1 else out["own_s"] + (forks[0] if i == 0 else 0.0),
            measured_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            cold_at_once=at_once), ""))
    return done, forks


@dataclass
class Prober:
    """The probes of one plan: each distinct key probed once, cached on disk across plans."""
    enabled: bool = False
    notes: List[str] = field(default_factory=list)
    seen: Dict[str, Optional[ProbeResult]] = field(default_factory=dict)
    failed: Dict[str, str] = field(default_factory=dict)   # why a probe of this plan failed
    filled: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # compile caches this plan filled (fill)
    probe_s: float = 0.0   # measured this time (not cache hits)

    def request(self, cfg: RunConfig, data: DataShape, config: PretrainedConfig, work: Work, profile: Dict[str, Any],
                read_only: bool = False) -> Tuple[Optional[Request], str]:
        """What probing this configuration here takes, or (None, why it is not probed)."""
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
        return Request(cfg, data, config, device, key, machine, cache_path(cfg.cache_dir, machine, key)), ""

    def get(self, cfg: RunConfig, data: DataShape, config: PretrainedConfig, work: Work, profile: Dict[str, Any],
            read_only: bool = False, runs_machine: Optional[Machine] = None) -> Tuple[Optional[ProbeResult], str]:
        """(the probe of this configuration, '' ) or (None, why there is none). read_only: from the
        cache only (a run's own prediction never probes)."""
        req, why = self.request(cfg, data, config, work, profile, read_only)
        if req is None:
            return None, why
        memo = str(req.path)
        if memo not in self.seen:
            self.seen[memo] = read_cached(req.path)
            if self.seen[memo] is None and not read_only:
                if runs_machine is None:  # (a caller's mistake: only a cache read needs no machine)
                    raise ValueError("Prober.get: probing needs runs_machine, the runs' forkserver (wall.Machine)")
                self._probe([req], runs_machine)
        found = self.seen[memo]
        if found is not None:
            return found, ""
        return None, self.failed.get(memo, "no probe in the cache (plan --probe)")

    def ahead(self, reqs: Sequence[Request], runs_machine: Machine) -> None:
        """Probe together, in one process, the configurations not in the cache that compile
        nothing: one fork, one data read and one device start for all of them, not one each
        (1.5-2.5 s a configuration on an H100 host). Then fill the persistent compile caches of
        the compiled ones side by side (fill); each of those is probed later in a fresh process of
        its own, its warm-up as the runs will meet it."""
        from .wall import compiles

        eager: Dict[str, Request] = {}
        compiled: Dict[str, Request] = {}
        for req in reqs:
            memo = str(req.path)
            if memo in self.seen or memo in eager or memo in compiled:
                continue
            found = read_cached(req.path)
            if found is not None:
                self.seen[memo] = found
            else:
                (compiled if compiles(req.cfg) else eager)[memo] = req
        if len(eager) > 1:
            self._probe(list(eager.values()), runs_machine)
        persistent = [r for r in compiled.values() if keeps_cache(r.cfg.compile)]
        if persistent:
            self.fill(persistent, runs_machine)

    def fill(self, reqs: List[Request], runs_machine: Machine) -> None:
        """The compile caches of these configurations filled as their runs would fill them (the
        warm-up over every shape and one step), a process each, FILL_AT_ONCE at a time: a cold
        compile is mostly one core's Python for minutes (MiniLM, attention=eager: 3.5 min on an H100
        host), and its time is not what the probe measures afterwards. The cold warm-ups' times are
        kept, marked as measured side by side (ProbeResult.cold_at_once)."""
        from .probe_process import side_by_side

        at_once = min(len(reqs), fill_at_once())
        print(f"[probe] filling the compile caches of {len(reqs)} compiled configuration(s), {at_once} at a time ...",
              file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            outs = side_by_side(runs_machine.context(), [_job(r, warm_only=True) for r in reqs], at_once,
                                float(reqs[0].cfg.launcher.timeout_s))
        except Exception as e:  # noqa: BLE001 - each is then probed cold, alone
            outs = [("error", f"{type(e).__name__}: {e}")] * len(reqs)
        self.probe_s += time.perf_counter() - t0
        done = [o["compile_time_s"] for status, o in outs if status == "ok"]
        if done and at_once > 1:
            self.notes.append(f"--probe filled the compile caches of {len(reqs)} compiled configuration(s) {at_once} at "
                              f"a time in {time.perf_counter() - t0:.0f} s before probing each alone (its warm-up then "
                              f"warm, as the runs will find it); their cold warm-ups, {min(done):.1f}-{max(done):.1f} s, "
                              f"were timed side by side, so longer than alone")
        for req, (status, out) in zip(reqs, outs):
            if status == "ok":
                self.filled[str(req.path)] = {"compile_time_s": out["compile_time_s"], "state": out["state"],
                                              "at_once": at_once}
            said = (f"{out['state']} warm-up {out['compile_time_s']:.1f} s" if status == "ok"
                    else f"failed ({out}): probed cold later")
            print(f"[probe] compile cache of {_short(req.cfg)}: {said}", file=sys.stderr, flush=True)

    def _probe(self, reqs: List[Request], runs_machine: Machine) -> None:
        """Probe these now (one process), cache each result, say each on stderr as it happens (a
        plan's probes take minutes on a GPU with compiled configurations)."""
        for req in reqs:
            print(f"[probe] {_device_label(req.device)}: {_short(req.cfg)} ...", file=sys.stderr, flush=True)
        try:
            done, forks = run_probes(reqs, runs_machine.context(), self.filled)
            runs_machine.later_process_s += forks
        except Exception as e:  # noqa: BLE001 - a configuration that cannot be probed is said, not fatal
            why = f"{type(e).__name__}: {first_line(e, limit=200, default='')}"
            if len(reqs) > 1:  # (the shared process died: each is probed alone when predicted)
                print(f"[probe] the shared probe process failed ({why}): probing them one by one",
                      file=sys.stderr, flush=True)
                return
            done = [(None, why)]
        for req, (found, why) in zip(reqs, done):
            memo = str(req.path)
            self.seen[memo] = found
            if found is None:
                self.failed[memo] = f"not probed: the probe failed ({why})"
                print(f"[probe] failed: {_short(req.cfg)}: {why}", file=sys.stderr, flush=True)
                continue
            self.probe_s += found.probe_s
            _write(req.path, found)
            cold = "null" if found.warmup_cold_s is None else f"{found.warmup_cold_s:.1f} s"
            beside = f" ({found.cold_at_once} filled at once)" if found.cold_at_once > 1 else ""
            warm = "null" if found.warmup_warm_s is None else f"{found.warmup_warm_s:.1f} s"
            print(f"[probe] {_short(req.cfg)}: done in {found.probe_s:.1f} s: {found.fit['how']}; warm-up cold "
                  f"{cold}{beside}, warm {warm}", file=sys.stderr, flush=True)


def fill_at_once() -> int:
    """Compile-cache fills side by side: a quarter of the host's cores (each fill's Triton
    compiles use a pool of their own), at most 4; one on a small box."""
    return max(1, min(4, (os.cpu_count() or 1) // 4))


def _device_label(device: torch.device) -> str:
    from bertaccel.options.hardware import device_name

    return device_name(device)


def _short(cfg: RunConfig) -> str:
    return (f"precision={cfg.precision.name} attention={cfg.attention.name} encoder={cfg.encoder.name} "
            f"compile={cfg.compile.mode} batch={cfg.train.batch_size}")

