"""runs/bytecode.py: where Python keeps no bytecode for the heavy packages (installed without
compiling, PYTHONDONTWRITEBYTECODE=1: the GPU image's case), a command caches it in a folder of its
own, for itself and the processes it starts; elsewhere it changes nothing. A real package made
here stands in for torch, imported by real interpreters."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Every test here starts a real process (the CLI, a script, a server) or trains: slow (docs/contributing.md).
pytestmark = pytest.mark.slow

SCRIPT = """
import os, subprocess, sys
from bertaccel.runs.bytecode import cache_bytecode
prefix = cache_bytecode("slowpkg")
import slowpkg
# a child started with -B, as multiprocessing starts its forkserver: it writes the cache all the same
child = subprocess.run([sys.executable, "-B", "-c", "import sys; from bertaccel.runs.bytecode import cache_bytecode; "
                        "cache_bytecode('slowpkg'); print(sys.pycache_prefix, sys.dont_write_bytecode)"],
                       capture_output=True, text=True).stdout.split()
print(prefix, sys.pycache_prefix, sys.dont_write_bytecode, *child)
"""


def _run(tmp_path: Path, **env: str) -> list:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE")}
    path = os.pathsep.join([str(tmp_path / "site"), str(Path(__file__).parents[1])])
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True,
                         env={**base, "PYTHONPATH": path, "XDG_CACHE_HOME": str(tmp_path / "cache"), **env})
    return out.stdout.split()


def _package(tmp_path: Path) -> Path:
    pkg = tmp_path / "site" / "slowpkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import part\n")
    (pkg / "part.py").write_text("VALUE = 1\n")
    return pkg


def test_with_no_bytecode_and_none_written_a_cache_of_its_own_is_used_and_inherited(tmp_path):
    pkg = _package(tmp_path)
    prefix, in_sys, dont_write, child_prefix, child_dont_write = _run(tmp_path, PYTHONDONTWRITEBYTECODE="1")
    assert prefix == in_sys == child_prefix == str(tmp_path / "cache" / "bertaccel" / "pycache")
    assert dont_write == child_dont_write == "False"
    cached = sorted(p.name for p in Path(prefix).rglob("*.pyc"))
    assert any(n.startswith("part.") for n in cached) and any(n.startswith("__init__.") for n in cached)
    assert not (pkg / "__pycache__").exists()  # nothing beside the sources
    # the next command reads it: the same answer, nothing compiled again
    mtimes = {p: p.stat().st_mtime_ns for p in Path(prefix).rglob("*.pyc")}
    _run(tmp_path, PYTHONDONTWRITEBYTECODE="1")
    assert {p: p.stat().st_mtime_ns for p in Path(prefix).rglob("*.pyc")} == mtimes


def test_where_python_keeps_bytecode_or_the_user_chose_nothing_changes(tmp_path):
    pkg = _package(tmp_path)
    assert _run(tmp_path, PYTHONDONTWRITEBYTECODE="1", BERTACCEL_PYCACHE="off")[:3] == ["None", "None", "True"]
    assert _run(tmp_path, PYTHONDONTWRITEBYTECODE="1", PYTHONPYCACHEPREFIX=str(tmp_path / "own"))[0] == "None"
    # writable site-packages, writing allowed: Python writes beside the sources itself
    assert _run(tmp_path)[:3] == ["None", "None", "False"] and (pkg / "__pycache__").is_dir()
    # bytecode beside the sources (compiled at install): read as it is, even with writing off
    assert _run(tmp_path, PYTHONDONTWRITEBYTECODE="1")[:3] == ["None", "None", "True"]
    own = tmp_path / "chosen"
    (pkg / "__pycache__").rename(tmp_path / "moved")
    assert _run(tmp_path, PYTHONDONTWRITEBYTECODE="1", BERTACCEL_PYCACHE=str(own))[0] == str(own)
