"""A bytecode cache where Python keeps none, set before the heavy imports of a command's start.

Python compiles a module from source on every import unless its bytecode (`__pycache__/*.pyc`) is
there to read. Container images often have neither: packages installed without compiling
(`pip --no-compile`, uv's default) and `PYTHONDONTWRITEBYTECODE=1` set, or site-packages that the
user cannot write. Then every process compiles torch, transformers and MLflow again: measured on an
H200 host of that kind, `import bertaccel.runs.preload` (the runs' forkserver's preload, the
longest wait of a sweep's first run) took 16.3 s, and 7.5 s with a bytecode cache.

`cache_bytecode()` then points Python at a cache of its own, outside the source tree
(`sys.pycache_prefix`, also for the processes it starts: `PYTHONPYCACHEPREFIX`), and lets it write
there. The first command fills it; later ones read it. It does nothing where bytecode is already
read or written beside the sources, where the user chose a prefix, or with BERTACCEL_PYCACHE=off.
BERTACCEL_PYCACHE=<dir> names the folder (default: $XDG_CACHE_HOME or ~/.cache, then
bertaccel/pycache).
"""
from __future__ import annotations

import importlib.util
import os
import sys
from typing import Optional

from bertaccel.context import current, update
from bertaccel.option import user_path

PROBE_PACKAGE = "torch"  # the largest import of a run: its bytecode says how the install was made
# The prefix set is kept in the run context (pycache_prefix) for the processes started:
# multiprocessing starts its forkserver with -B when this process started with
# PYTHONDONTWRITEBYTECODE (sys.flags cannot change), so the server, whose preload is the longest
# import of all, would read the cache but never fill it. It finds the prefix there and writes.
# (The context imports nothing bertaccel.option does not: no cost before the heavy imports.)


def _has_bytecode(package: str) -> Optional[bool]:
    """Whether the package's own bytecode is beside its source, or Python may write it there;
    None if the package is not installed. Found without importing it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    pyc = importlib.util.cache_from_source(spec.origin)
    if os.path.exists(pyc):
        return True
    if sys.dont_write_bytecode:
        return False
    folder = os.path.dirname(pyc)
    return os.access(folder if os.path.isdir(folder) else os.path.dirname(folder), os.W_OK)


def default_prefix() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "bertaccel", "pycache")


def cache_bytecode(package: str = PROBE_PACKAGE) -> Optional[str]:
    """Set a bytecode cache for this process and its children where Python keeps none; returns
    its folder, or None when nothing was changed."""
    inherited = current().pycache_prefix
    if inherited and sys.pycache_prefix == inherited:  # a process started by one that set it
        sys.dont_write_bytecode = False
        return inherited
    setting = os.environ.get("BERTACCEL_PYCACHE", "").strip()
    if setting.lower() == "off" or sys.pycache_prefix is not None or _has_bytecode(package) is not False:
        return None
    prefix = str(user_path(setting or default_prefix()))
    try:
        os.makedirs(prefix, exist_ok=True)
    except OSError:  # (nowhere to write: imports stay as they were)
        return None
    sys.pycache_prefix, sys.dont_write_bytecode = prefix, False
    os.environ["PYTHONPYCACHEPREFIX"] = prefix  # (Python's own variable: read by every interpreter it starts)
    update(pycache_prefix=prefix)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    return prefix
