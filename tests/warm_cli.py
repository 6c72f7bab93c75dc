"""The tests' `python -m bertaccel.<module> ARGS` commands (the `cli` fixture and `run`, a drop-in for
subprocess.run), each command still a process of its own, but forked from a warm parent instead of a
new interpreter.

Why: most of the suite's time is the CLI's own start. A tiny single run costs about 12 CPU-seconds
on a CI core (the whole process tree, measured with a child subreaper), of which 3.7 s are the
command's interpreter start and imports (torch, MLflow, Hydra: the same in every command) and about
8 s the runs' forkserver importing its preload (runs/preload.py); the training is well under a
second. With two workers on CI's two cores the suite is CPU-bound, so every second a command
spends importing what the last one imported is a second of the suite.

How: one parent process per pytest worker (`Warm`) imports what `python -m bertaccel.run` imports
before it reads its command line (the module bertaccel.run and everything it imports), the runs'
forkserver preload, and what a command imports later on its way (a sweep's closing report with
matplotlib and scipy.stats, the report's and the plan's modules), and then waits on a UNIX socket.
For each command it forks a child that takes the command's working directory, environment, argv
and stdout/stderr files and runs bertaccel.run as `__main__` with runpy, as `python -m` does: the
module's start-up block (signal handlers, the bytecode cache, the forkserver started early, the
collector paused) runs in the child exactly as in a new interpreter,
and the child ends the way an interpreter ends (atexit handlers, non-daemon threads joined, the
exit status of SystemExit or 1 after a traceback). The runs' forkserver is the child's own, started
and stopped by it, so no two commands share a run process, a compile cache or an allocator; it is
forked from the child (SERVER), which has the preload in place, instead of a new interpreter that
imports the preload again (5-8 CPU-seconds a command). It is given what an exec'd server would have:
only the descriptors multiprocessing passes it, default signal handlers, a __main__ and a lock of
its own, and a forkserver's command line (setproctitle), by which the code and the tests find it.

What it does not give, so `run` hands such a command to subprocess.run: an environment that
differs from the parent's in anything but the per-test variables (PYTEST_*), since libraries read
some of it at import (torch reads OMP_NUM_THREADS, transformers HF_HOME). Tests of the start-up
itself (the interpreter's start and imports, a bytecode cache, Ctrl-C while importing) start real
interpreters with subprocess themselves, and the README's commands run as a user types them.
"""
from __future__ import annotations

import os
import pickle
import socket
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

# The parent: imports, then serves one command at a time. In a child, serve() returns the command
# and the module-level code below runs it; anything it raises ends the child as an uncaught
# exception ends an interpreter.
PARENT = r'''
import os, socket, sys

# The message framing is warm_cli's own; its folder leaves the path again, so a command's imports
# search what `python -m` searches.
sys.path.insert(0, sys.argv[2])
from warm_cli import _recv, _send  # noqa: E402
sys.path.remove(sys.argv[2])

def serve(path):
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    print("ready", flush=True)
    while True:
        conn, _ = srv.accept()
        command = _recv(conn)
        if command is None:
            return None
        pid = os.fork()
        if pid == 0:
            srv.close()
            conn.close()
            return command
        _send(conn, pid)
        _, status = os.waitpid(pid, 0)
        _send(conn, os.waitstatus_to_exitcode(status))
        conn.close()

import bertaccel  # noqa: E402
import bertaccel.run  # noqa: E402,F401 (what every command imports before it reads its argv)

# The module itself is not kept: a child runs it as __main__, and runpy warns (on the command's
# stderr, which tests read line by line) when it finds the module already imported.
del sys.modules["bertaccel.run"]
delattr(bertaccel, "run")

# The runs' forkserver preload as well (torch, transformers' BERT, MLflow's SQL store, the run
# code): a command's forkserver is forked from the command (SERVER below) with it in place. The
# module itself is dropped so each server runs its body again: its own frozen heap and LOADED_AT,
# which the runs' start-up phases read (runs/startup.py).
import bertaccel.runs.preload  # noqa: E402,F401
del sys.modules["bertaccel.runs.preload"]

# And what the commands import on their way, lazily, each time (a CPU second or more per command):
# a sweep's closing report (matplotlib, scipy.stats for its intervals), the report's and the plan's
# own modules. Their __main__ modules are dropped as bertaccel.run is above.
import importlib  # noqa: E402

import matplotlib  # noqa: E402

matplotlib.use("Agg")  # (what the report's figures use; a command that asks for another still can)
for name in ("matplotlib.pyplot", "scipy.stats", "bertaccel.report.sweep_report", "bertaccel.runs.progress",
             "bertaccel.report.__main__", "bertaccel.plan.__main__"):
    importlib.import_module(name)
for name in ("bertaccel.report", "bertaccel.plan"):
    del sys.modules[name + ".__main__"]
    delattr(sys.modules[name], "__main__")

command = serve(sys.argv[1])
if command is not None:
    exec(sys.argv[3])  # SERVER: the command's forkserver forked, not a new interpreter
    os.chdir(command["cwd"])
    os.environ.clear()
    os.environ.update(command["env"])
    for fd, name, flags in ((0, os.devnull, os.O_RDONLY), (1, command["stdout"], os.O_WRONLY),
                            (2, command["stderr"], os.O_WRONLY)):
        opened = os.open(name, flags)
        os.dup2(opened, fd)
        os.close(opened)
    sys.argv = ["-m", *command["args"]]  # (runpy puts the module's file in argv[0], as python -m does)
    import runpy
    runpy.run_module(command["module"], run_name="__main__", alter_sys=True)
'''


# Run in a command's process before its module: the runs' forkserver (multiprocessing's, started by
# runs/forkserver.py) is forked from the command instead of a new interpreter that imports the
# preload again (about 8 CPU-seconds a command on a CI core; the parent has it imported). What an
# exec'd server would have, the forked one is given: only the descriptors multiprocessing passes
# it (a kept copy of the command's end of its "alive" pipe would keep it running after the
# command), the caught signals back to their defaults and none blocked, a __main__ of its own (the
# runs import the command's module as __mp_main__, as from a new interpreter), a lock of its own
# (the forking thread holds the command's), and the command line of a forkserver (setproctitle:
# the code and the tests find the server by it). Without setproctitle, the server is exec'd.
SERVER = r'''
def _fork_forkserver():
    import multiprocessing.util as mp_util
    try:
        import setproctitle
    except ImportError:
        return
    spawn = mp_util.spawnv_passfds

    def spawnv_passfds(path, args, passfds):
        if args[-2:-1] != ["-c"] or not args[-1].startswith("from multiprocessing.forkserver import main"):
            return spawn(path, args, passfds)
        pid = os.fork()
        if pid:
            return pid
        code = 1
        try:
            import signal, threading, traceback, types
            from multiprocessing import forkserver

            keep = {0, 1, 2, *map(int, passfds)}
            for fd in map(int, os.listdir("/proc/self/fd")):
                if fd not in keep:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            for sig in signal.valid_signals():
                try:
                    if callable(signal.getsignal(sig)):
                        signal.signal(sig, signal.SIG_DFL)
                except (OSError, ValueError):
                    pass
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # (as runs/forkserver.py starts it)
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            forkserver._forkserver._lock = threading.Lock()
            sys.modules["__main__"] = types.ModuleType("__main__")
            sys.argv = ["-c"]
            setproctitle.setproctitle(" ".join(map(os.fsdecode, args)))
            exec(args[-1], {"__name__": "__main__"})
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)

    mp_util.spawnv_passfds = spawnv_passfds


_fork_forkserver()
'''


def _send(conn: socket.socket, obj: object) -> None:
    data = pickle.dumps(obj)
    conn.sendall(struct.pack("!I", len(data)) + data)


def _exactly(conn: socket.socket, size: int) -> Optional[bytes]:
    data = b""
    while len(data) < size:
        part = conn.recv(size - len(data))
        if not part:
            if data:
                raise ConnectionError("the other side closed the connection inside a message")
            return None
        data += part
    return data


def _recv(conn: socket.socket) -> object:
    """The next message; None where the other side closed the connection before one (the parent's
    way of being told to stop)."""
    head = _exactly(conn, 4)
    if head is None:
        return None
    body = _exactly(conn, struct.unpack("!I", head)[0])
    if body is None:
        raise ConnectionError("the other side closed the connection inside a message")
    return pickle.loads(body)


def _answer(conn: socket.socket) -> object:
    """The parent's next answer: a closed connection here means the parent died."""
    got = _recv(conn)
    if got is None:
        raise ConnectionError("the warm parent closed the connection")
    return got


# Variables that change in a worker's own environment while the suite runs and that nothing the
# parent imports reads at import (the child gets the command's whole environment before its module
# runs, so what is read later is the command's): pytest's per-test ones; the telemetry session id
# MLflow sets in the process the first time a test uses it; the cache folders Inductor and Triton
# write into the environment the first time a test compiles in-process (read when a cache is
# opened). Keyed on, each of these started a new parent mid-suite (10 CPU-seconds) and, past
# MAX_PARENTS, sent every later command of that worker to a new interpreter: about 270 commands of
# a suite, 14 CPU-seconds each with their forkserver's imports.
_NOT_READ_AT_IMPORT = ("PYTEST_", "_MLFLOW_TELEMETRY_SESSION_ID", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def _key(env: Dict[str, str]) -> frozenset:
    """What a parent's environment must equal for a command to fork from it: all of it but the
    variables above."""
    return frozenset((k, v) for k, v in env.items() if not k.startswith(_NOT_READ_AT_IMPORT))


class Warm:
    """The warm parent of one pytest worker, started at its first command."""

    def __init__(self, env: Dict[str, str]):
        self.env = dict(env)
        self.folder = tempfile.mkdtemp(prefix="bertaccel-warm-")
        self.socket = os.path.join(self.folder, "s")
        self.proc: Optional[subprocess.Popen] = None
        self.forked = 0  # commands run by forking (tests/test_warm_cli.py reads it)

    def started(self) -> bool:
        """Whether the parent is up (started here at the first call) and serving."""
        if self.proc is not None:
            return self.proc.poll() is None
        self.proc = subprocess.Popen([sys.executable, "-c", PARENT, self.socket, str(Path(__file__).parent), SERVER],
                                     cwd=self.folder, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        ready = self.proc.stdout.readline().strip() == "ready" if self.proc.stdout else False
        return ready and self.proc.poll() is None

    def run(self, module: str, args: List[str], cwd: Path, env: Dict[str, str],
            timeout: Optional[float]) -> subprocess.CompletedProcess:
        """`python -m MODULE ARGS` in cwd, as subprocess.run(capture_output=True, text=True) returns it."""
        out = tempfile.NamedTemporaryFile(dir=self.folder, delete=False)
        err = tempfile.NamedTemporaryFile(dir=self.folder, delete=False)
        out.close()
        err.close()
        cmd = [sys.executable, "-m", module, *args]
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.connect(self.socket)
                _send(conn, {"module": module, "cwd": str(cwd), "env": dict(env), "args": list(args),
                             "stdout": out.name, "stderr": err.name})
                pid = _answer(conn)
                self.forked += 1
                conn.settimeout(timeout)
                try:
                    code = _answer(conn)
                except socket.timeout:
                    os.kill(int(pid), 9)  # (subprocess.run kills its child on a timeout alike)
                    conn.settimeout(None)
                    _answer(conn)
                    raise subprocess.TimeoutExpired(cmd, timeout,
                                                    Path(out.name).read_text(errors="replace"),
                                                    Path(err.name).read_text(errors="replace"))
            return subprocess.CompletedProcess(cmd, int(code), Path(out.name).read_text(errors="replace"),
                                               Path(err.name).read_text(errors="replace"))
        finally:
            os.unlink(out.name)
            os.unlink(err.name)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                    conn.connect(self.socket)
                    conn.shutdown(socket.SHUT_WR)  # (no command: the parent returns and exits)
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        try:
            os.rmdir(self.folder)
        except OSError:
            pass


# One warm parent per environment a worker's commands use (most use one or two: the worker's own,
# and it with the hub switched off), each started at its first command and stopped at the worker's
# exit. Per pytest worker process; no state between commands but the parents themselves.
MAX_PARENTS = 3
_parents: Dict[frozenset, Warm] = {}


def _parent(env: Dict[str, str]) -> Optional[Warm]:
    key = _key(env)
    if key not in _parents:
        if len(_parents) >= MAX_PARENTS:
            return None
        if not _parents:
            import atexit

            atexit.register(lambda: [w.close() for w in _parents.values()])
        _parents[key] = Warm(env)
    warm = _parents[key]
    return warm if warm.started() else None


def run(cmd: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess:
    """subprocess.run, for a bertaccel command (`[sys.executable, "-m", "bertaccel.<module>", ...]`
    with capture_output=True and text=True): forked from a warm parent where it can be served as
    subprocess.run would serve it; anything else (another program, stdin, other keywords) is
    subprocess.run itself."""
    cmd = [str(c) for c in cmd]
    simple = set(kwargs) <= {"cwd", "capture_output", "text", "timeout", "env", "check"}
    if (simple and len(cmd) >= 3 and cmd[0] == sys.executable and cmd[1] == "-m" and cmd[2].startswith("bertaccel.")
            and kwargs.get("capture_output") and kwargs.get("text")):
        env = dict(kwargs.get("env") if kwargs.get("env") is not None else os.environ)
        warm = _parent(env)
        if warm is not None:
            done = warm.run(cmd[2], cmd[3:], Path(kwargs.get("cwd") or os.getcwd()), env, kwargs.get("timeout"))
            if kwargs.get("check") and done.returncode:
                raise subprocess.CalledProcessError(done.returncode, cmd, done.stdout, done.stderr)
            return done
    return subprocess.run(cmd, **kwargs)
