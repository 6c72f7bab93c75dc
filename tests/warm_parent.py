"""The source the warm parent runs (PARENT, `python -c`) and each command runs before its module
(SERVER), for tests/warm_cli.py, which says why and how. Strings, not functions: the parent is a
new interpreter that must import only what a command imports, and SERVER runs in the command."""

# The parent: imports, then serves one command at a time. In a child, serve() returns the command
# and the module-level code below runs it; anything it raises ends the child as an uncaught
# exception ends an interpreter.
PARENT = r'''
import os, socket, sys

# The message framing is warm_cli's own; its folder leaves the path again, so a command's imports
# search what `python -m` searches.
sys.path.insert(0, sys.argv[2])
from warm_cli import _recv_command, _send  # noqa: E402
sys.path.remove(sys.argv[2])

def serve(path):
    """Commands side by side (a test holds one it started with warm_process.popen while it runs
    others): each forked at once; its exit status sent on its connection when it is reaped, on
    SIGCHLD (the wake-up fd wakes the select)."""
    import selectors, signal
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(16)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(wake_w)
    sel = selectors.DefaultSelector()
    sel.register(srv, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    running = {}  # pid -> the connection its exit status goes to
    print("ready", flush=True)
    while True:
        for key, _ in sel.select():
            if key.fileobj is not srv:
                while True:
                    try:
                        if not os.read(wake_r, 512):
                            break
                    except BlockingIOError:
                        break
                continue
            conn, _ = srv.accept()
            command, fds = _recv_command(conn)
            if command is None:
                return None
            pid = os.fork()
            if pid == 0:  # the command: none of the parent's serving state
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                sel.close()
                for fd in (wake_r, wake_w):
                    os.close(fd)
                for other in (srv, conn, *running.values()):
                    other.close()
                command["fds"] = fds
                return command
            for fd in fds:
                os.close(fd)
            _send(conn, pid)
            running[pid] = conn
        while running:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = running.pop(pid, None)
            if conn is not None:
                try:
                    _send(conn, os.waitstatus_to_exitcode(status))
                except OSError:  # (the test that started it is gone)
                    pass
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
    if command["session"]:
        os.setsid()  # (Popen's start_new_session: a process group a test can signal as a whole)
    for fd, how in enumerate(command["stdio"]):  # a file to open, or a descriptor the test sent
        if isinstance(how[0], str):
            opened = os.open(how[0], how[1])
            os.dup2(opened, fd)
            os.close(opened)
        else:
            os.dup2(command["fds"][how[0]], fd)
    for sent in command["fds"]:
        os.close(sent)
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
