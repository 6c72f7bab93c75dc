"""What a user waits for, predicted: per run the start-up (warm-up included), the warm-up, the
evaluations and the run's wall time; for the sweep, its wall time.

    run_wall_s         = startup_overhead_s + train_time_s + eval_time_s + record_s
    startup_overhead_s = process start + preparation (checks, data, store, tokens, model, prediction,
                         loaders) + device start + warm-up + set-up (optimizer, first batch)
    sweep wall         = the runs' walls in launch order (launcher.runs_at_once=1)

Each part from the best evidence, named in the prediction's wait_basis:
1. finished runs of this very configuration on this machine's profile (the store): their median;
   the warm-up by the cache state the run will meet (below), the process start by first/later;
2. the probe (probe.py): the warm-up (cold and warm), model build, device start, set-up and the
   evaluation at the run's own evaluation batches;
3. this machine, measured once by the plan (Machine): the first run's process start (the runs'
   forkserver started as a sweep starts it, its preload imported, a process forked from it), a later
   run's (the probes' forks from it: probes run in processes of the runs' kind), an MLflow run opened
   and recorded in a scratch store with the run's number of steps.
The warm-up's cache state is known before the run: nothing compiled -> none; a persistent compile
cache that a probe or an earlier run of the same compiled graphs filled on this machine -> warm;
otherwise cold for the first run of those graphs in the sweep and warm for the later ones.
"""
from __future__ import annotations

import json
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from multiprocessing.context import ForkServerContext
from typing import Any, Dict, List, Mapping, Optional, Protocol, Sequence, Set

from ..config import RunConfig
from .pricing import Prediction



@dataclass
class Machine:
    """The runs' kind of process on this machine: the forkserver a sweep starts (its preload imported),
    which the probes are forked from as runs are, and the start-up costs measured on it."""
    first_process_s: Optional[float] = None   # the server's process start to a first process forked from it
    later_process_s: List[float] = field(default_factory=list)  # each probe's fork: as a later run's
    error: str = ""
    _thread: Optional[threading.Thread] = None
    _ctx: Optional[ForkServerContext] = None

    def start(self) -> threading.Thread:
        """Wait for the server in the background, the plan's own work going on meanwhile (the wait
        is a blocked read: no core taken). `python -m bertaccel.plan --probe` started the server
        before its own imports, as a sweep does (runs/forkserver.py start_now); else it starts here."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._measure, name="bertaccel-plan-startup", daemon=True)
            self._thread.start()
        return self._thread

    @property
    def started(self) -> bool:
        return self._thread is not None

    def context(self, timeout_s: float = 600.0) -> ForkServerContext:
        """The forkserver context, its server running (raises when it could not start)."""
        self.start().join(timeout_s)
        if self._ctx is None:
            raise RuntimeError(f"the runs' forkserver did not start: {self.error or 'timed out'}")
        return self._ctx

    def _measure(self) -> None:
        import multiprocessing

        from bertaccel.runs.forkserver import server_pid, start_forkserver
        from bertaccel.runs.startup import process_started_at

        try:
            start_forkserver()  # (as a sweep starts it: the runs' preload; from this thread, no signal set-up)
            pid = server_pid()
            if pid is None:
                raise RuntimeError("no forkserver process after its start")
            server_started_at = process_started_at(pid)
            ctx = multiprocessing.get_context("forkserver")
            said = ctx.SimpleQueue()
            p = ctx.Process(target=_say_started, args=(said,))
            p.start()  # (the server forks it once its preload is imported)
            forked_at = said.get()
            p.join()
            # From the server's own start, on the clock /proc counts process starts by: a sweep's
            # first run waits for the same server start, preload and fork.
            self.first_process_s, self._ctx = forked_at - server_started_at, ctx
        except Exception as e:  # noqa: BLE001 - said where it is used
            self.error = f"{type(e).__name__}: {e}"

    def later_s(self) -> Optional[float]:
        return statistics.median(self.later_process_s) if self.later_process_s else None

    def how(self) -> str:
        if self.first_process_s is None:
            return f"process start not measured ({self.error or 'no probe ran'})"
        later = self.later_s()
        return (f"process start measured here: the runs' forkserver started with their preload and a process forked "
                f"from it {self.first_process_s:.2f} s (a sweep's first run); a probe's fork from it "
                + ("not measured" if later is None else f"{later:.2f} s median (a later run)"))


def _say_started(said: Any) -> None:
    """A forked process's whole work: say when it started (module level: picklable). (Its parent
    is the server, which reaps it: the plan cannot read its start from /proc afterwards.)"""
    from bertaccel.runs.startup import process_started_at

    said.put(process_started_at())


@dataclass
class Scratch:
    """MLflow costs of a run, measured once on a scratch SQLite store (never the user's)."""
    open_s: Optional[float] = None
    record_s: Optional[float] = None
    how: str = ""

    def measure(self, steps: int, params: int = 150) -> None:
        """A run's MLflow work on a scratch store: the look-up of an earlier run of its configuration,
        the run opened with its params and tags (record.open_tracker), and at its end the metrics, the
        lr series of `steps` values and the end (job._fill_record)."""
        from bertaccel.record.access import scratch_run_costs

        self.open_s, self.record_s = scratch_run_costs(steps, params)
        self.how = (f"a run's MLflow work timed on a scratch SQLite store: look-up and open with {params} params "
                    f"{self.open_s:.2f} s, the record with {steps} lr steps {self.record_s:.2f} s")


class ProbedParts(Protocol):
    """The start-up parts a probe measured (probe.py ProbeResult; not imported: probe.py starts
    the runs' Machine of this module), seconds."""
    fork_s: float
    data_s: float
    model_build_s: float
    device_ready_s: float
    set_up_s: float


@dataclass
class SweepWalls:
    """The runs of one grid in launch order: which compiled graphs an earlier run already filled."""
    machine: Machine = field(default_factory=Machine)
    scratch: Scratch = field(default_factory=Scratch)
    compiled: Set[str] = field(default_factory=set)              # graph keys compiled earlier in this grid
    runs: List[Prediction] = field(default_factory=list)

    def fill(self, pred: Prediction, work: Any, probe: Any, refs: Sequence[Any], key: Mapping[str, str],
             graph_key: Optional[str], compiles: bool, cache_persistent: bool, first: bool) -> None:
        """Sets pred's warmup_s, startup_overhead_s, eval_time_s, run_wall_s and wait_basis."""
        exact = [r for r in refs if r.key == dict(key)]
        basis = pred.wait_basis
        # The warm-up, by the state the run will meet.
        if not compiles:
            state = "none"
        elif graph_key is not None and (graph_key in self.compiled or (probe is not None and cache_persistent)):
            state = "warm"
        else:
            state = "cold"
        if graph_key is not None and compiles:
            self.compiled.add(graph_key)
        waits = [r.waits for r in exact]
        same_state = [w["compile_time_s"] for w in waits if "compile_time_s" in w and w.get("compile_cache") == state]
        if state == "none" and same_state:  # an eager GPU run's first-use warm-up (train/events.py)
            warm_up, basis["warmup_s"] = statistics.median(same_state), "nothing compiled: runs of this configuration"
        elif state == "none":
            warm_up, basis["warmup_s"] = 0.0, "nothing compiled (compile=off, no Triton kernel, no step graph)"
        elif same_state:
            warm_up, basis["warmup_s"] = statistics.median(same_state), f"{state} cache: runs of this configuration"
        elif probe is not None and (probe.warmup_warm_s if state == "warm" else probe.warmup_cold_s) is not None:
            warm_up = probe.warmup_warm_s if state == "warm" else probe.warmup_cold_s
            basis["warmup_s"] = f"{state} cache: the probe's warm-up"
        else:
            warm_up = None
            pred.why["warmup_s"] = f"null: {state} cache and neither a run nor a probe measured a {state} warm-up"
        pred.warmup_s = warm_up
        # Evaluation: once per epoch over the run's evaluation batches.
        evals = [w["eval_time_s"] for w in waits if "eval_time_s" in w]
        if evals:
            pred.eval_time_s, basis["eval_time_s"] = statistics.median(evals), "runs of this configuration"
        elif probe is not None and probe.eval_s_per_batch is not None and work is not None:
            pred.eval_time_s = probe.eval_s_per_batch * len(work.eval_batches) * work.epochs
            basis["eval_time_s"] = (f"the probe: {probe.eval_s_per_batch * 1e3:.3g} ms per evaluation batch x "
                                    f"{len(work.eval_batches)} batches x {work.epochs} epoch(s)")
        else:
            pred.why["eval_time_s"] = "null: no run of this configuration and no probe"
        # Start-up: the parts apart from the warm-up.
        before = self._before_warmup(pred, waits, probe, first)
        if before is not None and warm_up is not None:
            pred.startup_overhead_s = before + warm_up
        else:
            pred.why.setdefault("startup_overhead_s", "null: " + ("its warm-up is not predicted" if before is not None
                                                                   else "its start-up parts are not measured"))
        record = self.scratch.record_s
        if (pred.startup_overhead_s is not None and pred.train_time_s is not None and pred.eval_time_s is not None
                and record is not None):
            pred.run_wall_s = pred.startup_overhead_s + pred.train_time_s + pred.eval_time_s + record
            basis["run_wall_s"] = f"start-up + train + evaluation + the record {record:.2f} s (measured here)"
        else:
            pred.why.setdefault("run_wall_s", "null: a part of it is not predicted")
        self.runs.append(pred)

    def _before_warmup(self, pred: Prediction, waits: List[Dict[str, Any]], probe: Optional[ProbedParts],
                       first: bool) -> Optional[float]:
        """The start-up without the warm-up: runs of this configuration (first or later as this one),
        else the probe's parts and the machine's."""
        kind = "process start" if first else "job start"
        same: List[float] = [w["startup_overhead_s"] - w.get("compile_time_s", 0.0) for w in waits
                if "startup_overhead_s" in w and w.get("started_source", "").endswith(kind)]
        if same:
            pred.wait_basis["startup_overhead_s"] = f"runs of this configuration ({'first' if first else 'later'} run " \
                                                    f"of a sweep) + the warm-up"
            return statistics.median(same)
        if probe is None:
            return None  # (nor is the runs' forkserver started for it: a plan without probes never waits on one)
        if first and self.machine.first_process_s is None:
            try:  # (all probes cached: the server was not needed until now)
                self.machine.context()
            except RuntimeError:
                pass
        later = self.machine.later_s() if self.machine.later_s() is not None else getattr(probe, "fork_s", None)
        process = self.machine.first_process_s if first else later
        if process is None or self.scratch.open_s is None:
            return None
        pred.wait_basis["startup_overhead_s"] = (
            f"{'first' if first else 'later'} run's process start {process:.2f} s + MLflow run opened "
            f"{self.scratch.open_s:.2f} s (measured here) + the probe's data read {probe.data_s:.2f} s, model build "
            f"{probe.model_build_s:.2f} s, device start {probe.device_ready_s:.2f} s, set-up {probe.set_up_s:.2f} s "
            f"+ the warm-up")
        return (process + self.scratch.open_s + probe.data_s + probe.model_build_s + probe.device_ready_s
                + probe.set_up_s)

    def notes(self) -> List[str]:
        """How the machine's parts were measured (once per plan, not per row)."""
        if not self.machine.started and not self.scratch.how:
            return []  # (a plan without probes measures none of them)
        return [f"start-up parts of this machine: {how}" for how in (self.machine.how(), self.scratch.how) if how]

    def sweep_wall_s(self) -> Optional[float]:
        """The sweep's wall: its runs' walls in order (None when one is not predicted)."""
        walls = [p.run_wall_s for p in self.runs]
        known = [w for w in walls if w is not None]
        return sum(known) if walls and len(known) == len(walls) else None


def compiles(cfg: RunConfig) -> bool:
    """Whether the run has a warm-up to compile, as train/loop.py decides it on this machine."""
    from bertaccel.options.hardware import resolve_device
    from bertaccel.train.step import compiles_anything

    return compiles_anything(cfg, resolve_device(cfg.train.device).type)


def graph_key(cfg: RunConfig) -> str:
    """What the compiled graphs of a run depend on (its compile cache entries): two runs that
    differ only in the optimizer, the seed or the learning rate compile the same graphs."""
    c = asdict(cfg)
    # (compile.step_graph captures the optimizer's update in the graph too)
    return json.dumps([c["model"], c["precision"], c["attention"], c["encoder"], c["compile"], c["freezing"],
                       c["optimizer"] if c["compile"].get("step_graph") else None,
                       c["dataset"], {k: c["train"][k] for k in ("batch_size", "eval_batch_size", "pad_to_multiple_of",
                                                                 "gradient_checkpointing", "device")}],
                      sort_keys=True, default=str)
