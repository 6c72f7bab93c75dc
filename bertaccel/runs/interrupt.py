"""Ctrl-C (SIGINT) and SIGTERM: the current run ends as `interrupted` (MLflow status KILLED),
a sweep's parent run is closed, one line is printed and the exit status is 128 + the signal
(130 / 143).

The signal handler (installed by run.cli in the launching process) raises Interrupted in the
main thread and sets STOP, which a run waiting on its worker processes in another thread
(launcher.runs_at_once > 1) sees within worker_processes.POLL_S. Whoever holds the run's record marks
it: worker_processes.in_processes for a worker's run (it stops the worker first), job._run for an inline one.
Workers ignore SIGINT (Ctrl-C in a terminal reaches the whole process group): their launcher
stops them, so a run is marked once and no worker prints a traceback.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, Optional

STOP = threading.Event()
_received: list[str] = []  # the name of the signal that set STOP
RESIGNAL_AFTER_S = 0.05  # a worker's SIGTERM swallowed by a finalizer is sent again after this
_deferring: list[bool] = []  # open deferred() sections (nested): a signal inside is raised at their end


class Interrupted(BaseException):
    """Not an Exception: nothing that records a run's own failure (`except Exception`) takes it."""

    def __init__(self, signame: str) -> None:
        super().__init__(f"interrupted by {signame}")
        self.signame = signame
        self.run_id: Optional[str] = None      # the run marked interrupted, when there was one
        self.run_name: Optional[str] = None

    @property
    def exit_code(self) -> int:
        return 128 + int(getattr(signal, self.signame))

    @property
    def reason(self) -> str:
        return f"interrupted by {self.signame}"


def _on_signal(signum: int, frame: Any) -> None:
    name = signal.Signals(signum).name
    # One interruption: a second Ctrl-C while the run is being marked does not cut that short.
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)
    _received.append(name)
    STOP.set()
    if _deferring:
        return
    ours = _raise_later_in(frame)
    if ours is not None:
        _raise_when_back_in(ours, name)
        return
    raise Interrupted(name)


# Libraries whose code cannot take an exception at every point: Hydra's config reads close a file
# in a `finally` that names it before it was opened (an UnboundLocalError took the Interrupted's
# place: a traceback, exit 1), its run_job's `finally` reads a variable set later, OmegaConf
# restores a node's flags in `finally` blocks (an AttributeError: "bad input", exit 2), and an
# import cut short can leave a module half-initialized. Their calls are milliseconds.
FRAGILE = ("hydra", "omegaconf", "yaml", "antlr4", "importlib")
OURS = ("bertaccel", "hydra_plugins", "__main__")


def _package(frame: Any) -> str:
    return str(frame.f_globals.get("__name__", "")).split(".", 1)[0]


def _raise_later_in(frame: Any) -> Any:
    """The nearest frame of our own code that called into a fragile library the signal came in
    (None when the code running is ours, or nothing fragile is between it and ours)."""
    fragile = False
    while frame is not None and _package(frame) not in OURS:
        fragile = fragile or _package(frame) in FRAGILE
        frame = frame.f_back
    return frame if fragile else None


def _raise_when_back_in(frame: Any, name: str) -> None:
    """Interrupted is raised in our code as soon as it runs again, through Python's trace hook:
    in `frame` (ours) when the library's call returns to it (its next line, its return or an
    exception), or at the entry of a function of ours the library calls first (Hydra calls its
    callbacks, sweeper and launcher, which run the whole sweep). The library's own call ends as
    it would have without the signal, and the sweep ends as an interruption anywhere else does."""
    before = sys.gettrace()

    def in_ours(f: Any, event: str, arg: Any) -> Any:
        sys.settrace(before)
        frame.f_trace = None
        raise Interrupted(name)

    def on_call(f: Any, event: Any, arg: Any) -> Any:  # (tracing must be on for f_trace to run)
        if _package(f) in OURS:
            in_ours(f, event, arg)
        return before(f, event, arg) if before is not None else None

    frame.f_trace = in_ours
    sys.settrace(on_call)


@contextmanager
def deferred() -> Iterator[None]:
    """A section a signal must not cut in the middle: a signal arriving inside is raised as
    Interrupted when the section ends. For OmegaConf's conversions (validate's typed config):
    OmegaConf restores a node's flags in `finally` blocks, and an Interrupted raised inside one
    came out as an AttributeError there, which read as bad input (exit 2) or, under a
    `hasattr`, vanished and the sweep ran on. validate() is milliseconds: Ctrl-C waits that long."""
    seen = len(_received)
    _deferring.append(True)
    try:
        yield
    finally:
        _deferring.pop()
    if len(_received) > seen and not _deferring:
        raise Interrupted(_received[seen])


def install() -> None:
    """In the launching process (the main thread), before anything runs."""
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, _on_signal)


def check() -> None:
    """Raise Interrupted in a thread other than the main one once a signal has arrived."""
    if STOP.is_set():
        raise Interrupted(_received[0] if _received else "SIGINT")


_received_term: list[int] = []  # a worker's SIGTERM, once received (this process's own: a worker runs one run)


def _exit_quietly(signum: int, frame: Any) -> None:
    _received_term.append(signum)
    raise SystemExit(128 + signum)  # unwinds (finalizers run), and prints nothing


def _exit_if_swallowed(unraisable: Any) -> None:
    """sys.unraisablehook of a worker. A SIGTERM handled while a finalizer or a GC callback runs
    (seen: SQLAlchemy's weakref callback) raises SystemExit where Python cannot propagate it: it
    printed "Exception ignored in ..." with a traceback, breaking the interrupted sweep's one
    line, and the worker went on running. Such a SystemExit is not printed, and the signal is sent
    to this process again from a helper thread, so that its handler raises SystemExit once more
    where it propagates, in the code the main thread runs, whose `finally` blocks then run: an
    os._exit here skipped them, and a store being built when it came left its half-built file and
    its lock file behind (store._build_store, store_lock). Anything else is reported as before."""
    if isinstance(unraisable.exc_value, SystemExit) and _received_term:
        try:
            threading.Thread(target=_signal_again, args=(_received_term[-1],), daemon=True).start()
        except RuntimeError:  # (no new thread at interpreter shutdown: exiting anyway, do it now)
            os._exit(int(unraisable.exc_value.code or 0))
        return
    sys.__unraisablehook__(unraisable)


def _signal_again(signum: int) -> None:
    # After a pause, so that this hook has returned and the handler's SystemExit is not raised
    # inside it (where it would be swallowed again); if it lands in another finalizer, the hook
    # sends it once more.
    time.sleep(RESIGNAL_AFTER_S)
    os.kill(os.getpid(), signum)


def in_worker() -> None:
    """A run's worker process: its launcher stops it (see the module's docstring), with SIGTERM,
    on which the worker exits without a traceback; its run is marked by the launcher."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_quietly)
    sys.unraisablehook = _exit_if_swallowed
    quiet_when_stdout_closes()  # (its stdout is the sweep's: a `| head` closed it for both)


class _ClosedPipeQuiet:
    """sys.stdout, where the reader's end closing (`| head -1`) makes the output go nowhere
    instead of raising BrokenPipeError at the next print: the command goes on and ends as it
    would have (a plan still saved, a sweep's runs recorded), without a traceback per print."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def _discard(self) -> None:
        # The file descriptor itself now points at /dev/null: what is still buffered, and every
        # other writer holding this descriptor (logging's handlers, the exit's flush), goes there.
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)

    def write(self, text: str) -> int:
        try:
            written: int = self._stream.write(text)
            return written
        except BrokenPipeError:
            self._discard()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._discard()
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def quiet_when_stdout_closes() -> None:
    """At the top of a command's __main__ (and in each run's process): see _ClosedPipeQuiet."""
    if sys.stdout is not None and not isinstance(sys.stdout, _ClosedPipeQuiet):
        try:
            sys.stdout.fileno()
        except (AttributeError, OSError, ValueError):  # (not a file: pytest's capture, a StringIO)
            return
        sys.stdout = _ClosedPipeQuiet(sys.stdout)
