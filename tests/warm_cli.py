"""The tests' `python -m bertaccel.<module> ARGS` commands (the `cli` fixture; `run`, a drop-in for
subprocess.run; `popen`, one for subprocess.Popen), each command still a process of its own, but
forked from a warm parent instead of a new interpreter.

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
and stdout/stderr (files, or the descriptors of a test's pipes, sent over the socket) and runs
bertaccel.run as `__main__` with runpy, as `python -m` does (the source is tests/warm_parent.py): the
module's start-up block (signal handlers, the bytecode cache, the forkserver started early, the
collector paused) runs in the child exactly as in a new interpreter,
and the child ends the way an interpreter ends (atexit handlers, non-daemon threads joined, the
exit status of SystemExit or 1 after a traceback). The runs' forkserver is the child's own, started
and stopped by it, so no two commands share a run process, a compile cache or an allocator; it is
forked from the child (SERVER), which has the preload in place, instead of a new interpreter that
imports the preload again (5-8 CPU-seconds a command). It is given what an exec'd server would have:
only the descriptors multiprocessing passes it, default signal handlers, a __main__ and a lock of
its own, and a forkserver's command line (setproctitle), by which the code and the tests find it.

The parent serves commands side by side: a test holds one it started with `popen` (to signal it,
kill it or watch the store) while it runs others; each command's exit status comes back on its
own connection when the parent has reaped it.

What it does not give, so `run` and `popen` hand such a command to subprocess: an environment that
differs from the parent's in anything but variables no import reads (_NOT_READ_AT_IMPORT), since
libraries read some of it at import (torch reads OMP_NUM_THREADS, transformers HF_HOME). Tests of the start-up
itself (the interpreter's start and imports, a bytecode cache, Ctrl-C while importing) start real
interpreters with subprocess themselves, and the README's commands run as a user types them.
"""
from __future__ import annotations

import atexit
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from warm_parent import PARENT, SERVER  # (tests/warm_parent.py)


def _frame(obj: object) -> bytes:
    data = pickle.dumps(obj)
    return struct.pack("!I", len(data)) + data


def _send(conn: socket.socket, obj: object) -> None:
    conn.sendall(_frame(obj))


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


def _recv_command(conn: socket.socket) -> Tuple[Any, List[int]]:
    """The next message and the descriptors sent with it (a test's pipe ends, by SCM_RIGHTS with
    the message's first bytes); (None, []) where the other side closed the connection before one
    (the parent's way of being told to stop)."""
    head, fds, _, _ = socket.recv_fds(conn, 4, 8)
    if not head:
        return None, []
    rest = _exactly(conn, 4 - len(head)) if len(head) < 4 else b""
    body = None if rest is None else _exactly(conn, struct.unpack("!I", head + rest)[0])
    if body is None:
        raise ConnectionError("the other side closed the connection inside a message")
    return pickle.loads(body), list(fds)


def _recv(conn: socket.socket) -> object:
    """The next message (no descriptors come with an answer); None as _recv_command."""
    return _recv_command(conn)[0]


def _answer(conn: socket.socket) -> object:
    """The parent's next answer: a closed connection here means the parent died."""
    got = _recv(conn)
    if got is None:
        raise ConnectionError("the warm parent closed the connection")
    return got


# Variables that change in a worker's own environment while the suite runs and that nothing the
# parent imports reads at import (the child gets the command's whole environment before its module
# runs, so what is read later is the command's): pytest's per-test ones; the telemetry session id
# MLflow sets in the process the first time a test uses it; what Inductor sets the first time a test
# compiles in-process: its and Triton's cache folders (read when a cache is opened), the address it
# hands its C++ wrappers, and Intel OpenMP's two (torch's CPU build loads GNU OpenMP, which reads
# neither). Keyed on, each started a new warm parent mid-suite and, past MAX_PARENTS, sent every
# later command of that worker to a new interpreter: 259 commands of a suite, then 80 with the
# first three left out (about 12 CPU-seconds each with their forkserver's imports).
_NOT_READ_AT_IMPORT = ("PYTEST_", "_MLFLOW_TELEMETRY_SESSION_ID", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR",
                       "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR", "KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK")


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
        self.busy = 0  # its commands not yet ended (one popen holds, a run's in another thread)

    def started(self) -> bool:
        """Whether the parent is up (started here at the first call) and serving."""
        if self.proc is not None:
            return self.proc.poll() is None
        self.proc = subprocess.Popen([sys.executable, "-c", PARENT, self.socket, str(Path(__file__).parent), SERVER],
                                     cwd=self.folder, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        ready = self.proc.stdout.readline().strip() == "ready" if self.proc.stdout else False
        return ready and self.proc.poll() is None

    def start(self, module: str, args: List[str], cwd: Path, env: Dict[str, str], stdio: List[Tuple[Any, int]],
              fds: Sequence[int] = (), session: bool = False) -> Tuple[socket.socket, int]:
        """Fork `python -m MODULE ARGS` in cwd: (the connection its exit status comes on, its pid).
        stdio: for fds 0-2, (a file name, open flags) or (an index into fds, 0): descriptors this
        process sends the command (SCM_RIGHTS), which it may close once this returns."""
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self.socket)
            message = _frame({"module": module, "cwd": str(cwd), "env": dict(env), "args": list(args),
                              "stdio": list(stdio), "session": session})
            sent = socket.send_fds(conn, [message], list(fds)) if fds else 0
            conn.sendall(message[sent:])
            pid = int(_answer(conn))
        except BaseException:
            conn.close()
            raise
        self.forked += 1
        self.busy += 1
        return conn, pid

    def run(self, module: str, args: List[str], cwd: Path, env: Dict[str, str],
            timeout: Optional[float]) -> subprocess.CompletedProcess:
        """`python -m MODULE ARGS` in cwd, as subprocess.run(capture_output=True, text=True) returns it."""
        out = tempfile.NamedTemporaryFile(dir=self.folder, delete=False)
        err = tempfile.NamedTemporaryFile(dir=self.folder, delete=False)
        out.close()
        err.close()
        cmd = [sys.executable, "-m", module, *args]
        try:
            conn, pid = self.start(module, args, cwd, env,
                                   [(os.devnull, os.O_RDONLY), (out.name, os.O_WRONLY), (err.name, os.O_WRONLY)])
            try:
                conn.settimeout(timeout)
                try:
                    code = _answer(conn)
                except socket.timeout:
                    os.kill(pid, 9)  # (subprocess.run kills its child on a timeout alike)
                    conn.settimeout(None)
                    _answer(conn)
                    raise subprocess.TimeoutExpired(cmd, timeout,
                                                    Path(out.name).read_text(errors="replace"),
                                                    Path(err.name).read_text(errors="replace"))
            finally:
                conn.close()
                self.busy -= 1
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
# and it with the hub switched off; a few tests give a command a HOME or TRITON_INTERPRET of its
# own), each started at its first command and stopped at the worker's exit. Past MAX_PARENTS the
# least recently used one that runs no command is stopped for the new one: a parent's start (about
# 10 CPU-seconds) costs less than one command in a new interpreter with its forkserver's imports
# (about 12), and the worker's own environment, used by most commands, is never the least recent.
# Per pytest worker process; no state between commands but the parents themselves.
MAX_PARENTS = 3
_parents: Dict[frozenset, Warm] = {}  # least recently used first
atexit.register(lambda: [w.close() for w in list(_parents.values())])


def _parent(env: Dict[str, str]) -> Optional[Warm]:
    key = _key(env)
    warm = _parents.pop(key, None)
    if warm is None:
        if len(_parents) >= MAX_PARENTS:
            idle = [k for k, w in _parents.items() if not w.busy]
            if not idle:
                return None
            _parents.pop(idle[0]).close()
        warm = Warm(env)
    _parents[key] = warm
    return warm if warm.started() else None


def _command_env(kwargs: Dict[str, Any]) -> Dict[str, str]:
    """The environment subprocess would give the command: env=, else this process's."""
    return dict(kwargs.get("env") if kwargs.get("env") is not None else os.environ)


def _servable(cmd: List[str], kwargs: Dict[str, Any], keywords: set) -> Optional[Tuple[Warm, Dict[str, str]]]:
    """The warm parent and environment for `python -m bertaccel.<module> ...` given only keywords
    the drop-in serves; None where subprocess must run it."""
    if not (set(kwargs) <= keywords and len(cmd) >= 3 and cmd[0] == sys.executable and cmd[1] == "-m"
            and cmd[2].startswith("bertaccel.")):
        return None
    env = _command_env(kwargs)
    warm = _parent(env)
    return None if warm is None else (warm, env)


def run(cmd: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess:
    """subprocess.run, for a bertaccel command (`[sys.executable, "-m", "bertaccel.<module>", ...]`
    with capture_output=True and text=True): forked from a warm parent where it can be served as
    subprocess.run would serve it; anything else (another program, stdin, other keywords) is
    subprocess.run itself."""
    cmd = [str(c) for c in cmd]
    served = _servable(cmd, kwargs, {"cwd", "capture_output", "text", "timeout", "env", "check"}) \
        if kwargs.get("capture_output") and kwargs.get("text") else None
    if served is not None:
        warm, env = served
        done = warm.run(cmd[2], cmd[3:], Path(kwargs.get("cwd") or os.getcwd()), env, kwargs.get("timeout"))
        if kwargs.get("check") and done.returncode:
            raise subprocess.CalledProcessError(done.returncode, cmd, done.stdout, done.stderr)
        return done
    return subprocess.run(cmd, **kwargs)


class WarmProcess:
    """What subprocess.Popen returns, for a command forked from a warm parent (`popen`): its pid
    (a process of its own, in a session of its own with start_new_session), pipes, poll, wait,
    communicate and signals. Its exit status comes from the parent, which reaped it."""

    def __init__(self, warm: Warm, args: List[str], conn: socket.socket, pid: int, stdout: Any, stderr: Any):
        self.args, self.pid, self.stdin, self.stdout, self.stderr = args, pid, None, stdout, stderr
        self.returncode: Optional[int] = None
        self._warm, self._conn = warm, conn
        self._read: Dict[str, Any] = {}  # what communicate's readers read
        self._readers: Optional[List[threading.Thread]] = None

    def wait(self, timeout: Optional[float] = None) -> int:
        if self.returncode is None:
            # (select first: the status is one small message, read whole once it is there)
            if not select.select([self._conn], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode = int(_answer(self._conn))
            self._conn.close()
            self._warm.busy -= 1
        return self.returncode

    def poll(self) -> Optional[int]:
        try:
            return self.wait(0)
        except subprocess.TimeoutExpired:
            return None

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # (as Popen: never a pid the command no longer has)
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, input: Any = None, timeout: Optional[float] = None) -> Tuple[Any, Any]:
        """Both pipes read to their end (a thread each, as Popen does), then the exit status."""
        assert input is None, "warm_cli.popen gives the command no stdin"
        if self._readers is None:
            self._readers = [threading.Thread(target=lambda n=name, f=pipe: self._read.__setitem__(n, f.read()),
                                              daemon=True)
                             for name, pipe in (("stdout", self.stdout), ("stderr", self.stderr)) if pipe is not None]
            for reader in self._readers:
                reader.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in self._readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        for pipe in (self.stdout, self.stderr):
            if pipe is not None:
                pipe.close()
        return self._read.get("stdout"), self._read.get("stderr")

    def __enter__(self) -> "WarmProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        for pipe in (self.stdout, self.stderr):
            if pipe is not None:
                pipe.close()
        self.wait()


def popen(cmd: Sequence[str], **kwargs: Any) -> Any:
    """subprocess.Popen, for a bertaccel command whose stdout and stderr are PIPE, DEVNULL or a
    file (and no stdin): forked from a warm parent, where the tests that signal, kill or watch a
    command started 30-odd new interpreters a suite (about 14 CPU-seconds each with the imports of
    their forkserver); anything else (another program, preexec_fn, another environment than the
    parents') is subprocess.Popen itself."""
    cmd = [str(c) for c in cmd]
    streams = [kwargs.get("stdout"), kwargs.get("stderr")]
    served = _servable(cmd, kwargs, {"cwd", "env", "stdout", "stderr", "text", "start_new_session"}) \
        if all(s in (subprocess.PIPE, subprocess.DEVNULL) or hasattr(s, "fileno") for s in streams) else None
    if served is not None:
        return _popen_from(served[0], cmd, **kwargs)
    return subprocess.Popen(cmd, **kwargs)


def _popen_from(warm: Warm, cmd: List[str], **kwargs: Any) -> WarmProcess:
    """popen's fork from the parent warm (tests/test_warm_cli.py calls it with a parent of its own)."""
    env = _command_env(kwargs)
    stdio: List[Tuple[Any, int]] = [(os.devnull, os.O_RDONLY)]
    sent: List[int] = []  # descriptors the command gets (a pipe's write end, a file)
    ours: List[Any] = []  # the pipes' read ends, as Popen's stdout and stderr
    for stream in (kwargs.get("stdout"), kwargs.get("stderr")):
        if stream == subprocess.DEVNULL:
            stdio.append((os.devnull, os.O_WRONLY))
            ours.append(None)
            continue
        if stream == subprocess.PIPE:
            read_end, write_end = os.pipe()
            ours.append(open(read_end, "r" if kwargs.get("text") else "rb"))
            sent.append(write_end)
        else:
            ours.append(None)
            sent.append(os.dup(stream.fileno()))
        stdio.append((len(sent) - 1, 0))
    try:
        conn, pid = warm.start(cmd[2], cmd[3:], Path(kwargs.get("cwd") or os.getcwd()), env, stdio, sent,
                               bool(kwargs.get("start_new_session")))
    finally:
        for fd in sent:  # (the command has its own copies now)
            os.close(fd)
    return WarmProcess(warm, cmd, conn, pid, ours[0], ours[1])
