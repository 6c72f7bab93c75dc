"""What the tests that need a real outside program share: a free local port, Debian packages
installed where missing (CI runs as root), and an MLflow server or UI started, awaited and stopped.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Iterator, List, Optional, Sequence


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def apt_install(packages: Sequence[str], what: str) -> Optional[str]:
    """apt-get install the packages; why it cannot be done (worded with `what`), or None."""
    if os.geteuid() != 0:
        return f"{what} is not installed and installing it needs root (apt-get install {' '.join(packages)})"
    if shutil.which("apt-get") is None:
        return f"{what} is not installed and this system has no apt-get to install it"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # One install at a time: the suite runs in parallel workers (pyproject's addopts), and a second
    # apt-get fails at once on dpkg's lock instead of waiting for the first.
    with open(Path(tempfile.gettempdir()) / "bertaccel-tests-apt.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", *packages]):
            p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
            if p.returncode != 0:
                last = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
                return f"{what} could not be installed: `{' '.join(cmd)}` failed: {last}"
    return None


@contextlib.contextmanager
def mlflow_service(argv: List[str], log_path: Path, start_timeout_s: float, stop_wait_s: float,
                   cwd: Optional[Path] = None, env: Optional[dict] = None) -> Iterator[str]:
    """Run `argv` (an `mlflow server` or `mlflow ui` ending in --port P, on 127.0.0.1) in a process
    group of its own; yield its address once /health answers 200, then stop the whole group."""
    port = argv[argv.index("--port") + 1]
    base = f"http://127.0.0.1:{port}"
    if "--workers" not in argv and "-w" not in argv:
        # One worker process where the test does not ask for more: a test's UI serves one browser,
        # and MLflow's default of 4 spawned workers, each importing its server, cost about 10
        # CPU-seconds more per UI started (the README's command runs as written otherwise).
        argv = [*argv, "--workers", "1"]
    with open(log_path, "w") as log:
        server = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        try:
            deadline = time.time() + start_timeout_s
            while True:
                try:
                    with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                assert server.poll() is None, log_path.read_text()[-3000:]
                assert time.time() < deadline, f"{' '.join(argv[:3])} did not answer /health in {start_timeout_s:.0f} s"
                time.sleep(0.5)
            yield base
        finally:
            # SIGTERM to the group, then SIGKILL for what lingers: mlflow's job consumers outlive
            # the SIGTERM of their server, and the server waits for them.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    server.wait(timeout=stop_wait_s)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGKILL)
            server.wait()
