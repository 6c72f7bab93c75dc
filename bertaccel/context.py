"""What the processes of one command share beyond its config, as one typed object (RunContext):
the sweep a run belongs to (its id, parent run, swept keys, store), the store the sweep keeps
(store/keep.py), the main process's start-up marks (runs/startup.py), the hub probe's answer
(runs/hub.py), and two start-up facts of the process tree: the bytecode cache this command set
(runs/bytecode.py) and whether its command line compiles (the forkserver's preload, runs/preload.py).

One reader, `current()`; one writer, `update(...)`; one way across a process boundary: the object's
JSON in one environment variable (CONTEXT_ENV), which `update` sets. The environment is what every
child process has however it starts: a fork, multiprocessing's spawn and forkserver (launcher=process
hands its workers the launching process's environment as it is at the launch, runs/launch.py
Job.env: a forkserver's children would otherwise have the server's, from before the sweep began),
DDP's workers (the same Job), Hydra's submitit jobs (the scheduler passes the submitting
environment on; runs/progress.py sets the sweep again where it did not). Standard library only,
and nothing that bertaccel.option has not imported already: bertaccel.run and the forkserver read
it before their heavy imports (tests/test_typed_context.py).
"""
from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass, replace
from typing import Any, Dict, Optional, Sequence, Tuple

CONTEXT_ENV = "BERTACCEL_CONTEXT"  # the one variable: RunContext as JSON (absent: the empty context)

# Two threads of one sweep (runs_at_once > 1: the hub probe of each launch) may update at once: each
# update reads the whole context and writes it back, so one would drop the other's field. Re-entrant:
# a signal handler that runs in the middle of an update does not wait on itself.
_WRITING = threading.RLock()


@dataclass(frozen=True)
class SweepContext:
    """The sweep a run belongs to (record/sweep.py opens and closes it)."""
    sweep_id: str
    parent_run_id: str
    swept: Sequence[str] = ()  # keys the sweep varies: they name its runs (held as a tuple)
    uri: str = ""  # the tracking store of the parent run (an interrupted sweep closes it from run.cli)

    def __post_init__(self) -> None:
        object.__setattr__(self, "swept", tuple(self.swept))


@dataclass(frozen=True)
class KeptStore:
    """The sqlite store a sweep writes to, as the file it was when kept (store/keep.py)."""
    db: str  # the file's path
    identity: str  # "<device>:<inode>" of that file


@dataclass(frozen=True)
class StartupMarks:
    """The main process's start-up marks (runs/startup.py), tagged with its pid: a child that
    inherits them does not read them as its own."""
    pid: int
    marks: Tuple[Tuple[str, float], ...] = ()  # (the phase that begins here, time.time())


@dataclass(frozen=True)
class RunContext:
    sweep: Optional[SweepContext] = None
    kept_store: Optional[KeptStore] = None
    startup: Optional[StartupMarks] = None
    hub_unreachable: Optional[str] = None  # None: not asked yet; "": reachable; else why not (runs/hub.py)
    pycache_prefix: Optional[str] = None  # the bytecode cache this command set (runs/bytecode.py)
    preload_compile: bool = False  # the command line compiles: the forkserver preloads Inductor

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunContext:
        d = json.loads(text) if text else {}
        sweep, kept, startup = d.get("sweep"), d.get("kept_store"), d.get("startup")
        return cls(sweep=None if sweep is None else SweepContext(**sweep),
                   kept_store=None if kept is None else KeptStore(**kept),
                   startup=None if startup is None else StartupMarks(
                       int(startup["pid"]), tuple((str(p), float(t)) for p, t in startup["marks"])),
                   hub_unreachable=d.get("hub_unreachable"), pycache_prefix=d.get("pycache_prefix"),
                   preload_compile=bool(d.get("preload_compile", False)))

    def as_env(self) -> Dict[str, str]:
        """This context for a process started with an environment of its own (subprocess's env=):
        others inherit it (update sets it in this process's environment)."""
        return {CONTEXT_ENV: self.to_json()}


def current() -> RunContext:
    """This process's context: what it set, or inherited from the process that started it."""
    return RunContext.from_json(os.environ.get(CONTEXT_ENV, ""))


def update(**changes: Any) -> RunContext:
    """Change fields of this process's context, for it and every process it starts from now on."""
    with _WRITING:
        ctx = replace(current(), **changes)
        if ctx == RunContext():
            os.environ.pop(CONTEXT_ENV, None)
        else:
            os.environ[CONTEXT_ENV] = ctx.to_json()
    return ctx
