"""The server that run processes fork from (launcher.start_method=forkserver): what it imports
once (runs/preload.py), and when it starts.

The server imports torch, transformers' BERT, MLflow's SQL store and bertaccel's run code once
(seconds: 10 on an H200 host); every run's process is forked from it with all of that in place.
The first run of a sweep waits for that preload, so the sweep's main process starts the server as
its very first act (start_early, from bertaccel.run, before its own imports): the server's
imports then run beside the main process's own imports, Hydra's composition and the sweep's
parent run, instead of after them. Only the standard library (and psutil) is imported here, and
bertaccel.context (standard library only, already in: runs/bytecode.py imported it).
"""
from __future__ import annotations

import atexit
import multiprocessing
import os
import signal
import threading
from pathlib import Path
from typing import Any, Optional, Sequence

from bertaccel.context import update

# The server's one preload: its module imports the run's heavy libraries (runs/preload.py).
FORKSERVER_PRELOAD = ["bertaccel.runs.preload"]
# The user's say on the preload's Inductor (read-only, as BERTACCEL_PYCACHE): "1" in, anything
# else out; unset, the command line decides (start_now: the run context's preload_compile).
PRELOAD_COMPILE_ENV = "BERTACCEL_PRELOAD_COMPILE"
# bertaccel.config.CONF_DIR, not imported from there: this module imports the standard library only.
CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
# Command-line flags of Hydra's that print and exit: no run, no server.
NO_RUN_FLAGS = ("-h", "--help", "--hydra-help", "-c", "--cfg", "-i", "--info", "-sc", "--shell-completion",
                "--version")


def start_forkserver() -> None:
    """Start the forkserver (if not yet), with SIGINT ignored: Ctrl-C reaches the whole process
    group, and a server still importing its preload printed a ~40-line KeyboardInterrupt
    traceback under the sweep's one line. An ignored signal stays ignored through fork and exec,
    and Python then leaves it so (a blocked mask does not: the exec resets it); Python's
    forkserver ignores SIGINT itself only once its preload is imported. The launcher stops the
    workers. Only the main thread may set a handler: the sweep's main process calls this from
    there (start_early, or the sweep launcher before its first run; runs_at_once > 1 launches
    from other threads)."""
    from multiprocessing import forkserver

    # What the server imports once, for every later run to fork from (it has no effect once the
    # server runs).
    multiprocessing.set_forkserver_preload(FORKSERVER_PRELOAD)
    if threading.current_thread() is not threading.main_thread():
        forkserver.ensure_running()
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, previous)


def wants_forkserver(argv: Sequence[str]) -> bool:
    """Whether a bertaccel.run command line will start runs from the forkserver, read before
    Hydra composes it: not when it only prints (--help, --cfg), names another launcher
    (launcher.name=inline, launcher.start_method=spawn, a submitit hydra/launcher), and yes
    otherwise (the default). A study (--config-name) that sets another launcher itself is not
    seen here: its server, started for nothing, is stopped at exit."""
    for arg in argv:
        if arg in NO_RUN_FLAGS or arg.startswith(("--cfg=", "--info=", "--shell-completion=")):
            return False
        key, _, value = arg.lstrip("+~").partition("=")
        values = value.split(",")
        if ((key == "launcher.name" and "process" not in values)
                or (key == "launcher.start_method" and "forkserver" not in values)
                or (key == "hydra/launcher" and "bertaccel" not in values)):
            return False
    return True


def compiles(argv: Sequence[str]) -> bool:
    """Whether a command line asks for torch.compile in any of its runs, read before Hydra
    composes it: compile=... or compile.mode=... with a value other than off, or a preset that
    overrides compile. A study (--config-name) that compiles is not seen here: its runs import
    Inductor themselves, as they would without this."""
    for arg in argv:
        key, _, value = arg.lstrip("+~").partition("=")
        values = [v.strip(" '\"") for v in value.removeprefix("choice(").removesuffix(")").split(",")]
        if key in ("compile", "compile.mode") and any(v not in ("off", "") for v in values):
            return True
        if key == "preset" and any(_preset_compiles(v) for v in values):
            return True
    return False


def _preset_compiles(name: str) -> bool:
    try:
        text = (CONF_DIR / "preset" / f"{name}.yaml").read_text()
    except OSError:  # not ours (Hydra will say so): nothing to preload for it
        return False
    for line in text.splitlines():
        key, _, value = line.strip().lstrip("- ").partition(":")
        if key.strip() == "override /compile" and value.split("#")[0].strip(" '\"") != "off":
            return True
    return False


def start_early(argv: Sequence[str]) -> Optional[int]:
    """Start the forkserver now, if the command line will use it (wants_forkserver); its pid, or
    None (start_now). A command line that compiles has the server import Inductor as well
    (preload.py; BERTACCEL_PRELOAD_COMPILE=0 in the environment keeps it out)."""
    return start_now(argv) if wants_forkserver(argv) else None


def start_now(argv: Sequence[str] = ()) -> Optional[int]:
    """Start the forkserver now, before the caller's own imports; its pid, or None. argv: the
    command line, read for whether it compiles (then the server imports Inductor as well). The
    server is stopped when this process exits: one still importing its preload (the command failed
    before any run: bad input, Ctrl-C) would otherwise go on for seconds after."""
    if compiles(argv):
        update(preload_compile=True)  # (the server inherits the context: preload.py reads it)
    start_forkserver()
    pid = server_pid()
    if pid is not None:
        atexit.register(stop, pid)
    return pid


def server_pid() -> Optional[int]:
    """The pid of this process's forkserver, or None (not started, or gone)."""
    import psutil

    servers = [p.pid for p in psutil.Process().children() if _is_forkserver(p)]
    return servers[0] if servers else None


def stop(pid: int) -> None:
    """End the server this process started (SIGKILL: it holds nothing a run needs once the
    process that launches runs is leaving), if that pid is still this process's forkserver (one
    that died was reaped by multiprocessing, and its pid may be another program's by now)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.ppid() == os.getpid() and _is_forkserver(proc):
            proc.kill()
    except psutil.Error:
        pass


def _is_forkserver(proc: Any) -> bool:
    try:
        return "multiprocessing.forkserver" in " ".join(proc.cmdline())
    except Exception:  # noqa: BLE001 - gone already, or not ours to read
        return False
