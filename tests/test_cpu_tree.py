"""benchmarks/cpu_tree.py counts the CPU of the processes a command leaves behind, which `time` misses."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "cpu_tree.py"
# A command that exits at once and leaves a child spinning for about 0.6 CPU-seconds.
ORPHAN = ("import os, time\n"
          "if os.fork() == 0:\n"
          "    end = time.process_time() + 0.6\n"
          "    while time.process_time() < end:\n"
          "        pass\n"
          "    os._exit(0)\n")


def test_the_orphan_a_command_leaves_is_counted():
    done = subprocess.run([sys.executable, str(SCRIPT), sys.executable, "-c", ORPHAN], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    cpu = float(re.search(r"cpu ([\d.]+) s", done.stderr).group(1))
    assert cpu >= 0.6, done.stderr  # the orphan's 0.6 s is there (a plain `time` would show ~0.05)


def test_without_a_command_it_says_how_to_use_it():
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("usage:")
