"""The CPU seconds of a command's whole process tree, the processes it leaves behind included.

    python benchmarks/cpu_tree.py python -m bertaccel.run model=tiny train.device=cpu ...

`time` (and pytest's own durations) count only the children a process waits for. A bertaccel
command's runs are children of its forkserver, which the command stops at exit without waiting
for it: their CPU time goes to whatever adopts them, and a `time` of the command misses most of
it (measured 2026-11-29: 3.9 CPU-s by `time` for a tiny single run whose tree used 12.4). This
process makes itself a child subreaper (Linux prctl), so every orphan of the command is re-parented
to it and waited for here, and prints the tree's wall, user and system time on stderr. On a box
whose tests are CPU-bound this is the figure that says what a command costs the suite
(docs/contributing.md).
"""
from __future__ import annotations

import ctypes
import os
import resource
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def main(argv: list) -> int:
    if not argv:
        print("usage: python benchmarks/cpu_tree.py COMMAND [ARGS...]", file=sys.stderr)
        return 2
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("cpu_tree: this kernel does not let a process adopt its orphans (prctl "
              "PR_SET_CHILD_SUBREAPER); the figure would miss them", file=sys.stderr)
        return 1
    started = time.perf_counter()
    code = subprocess.run(argv).returncode
    while True:  # the orphans, re-parented here: wait for each, so its time is counted
        try:
            os.wait()
        except ChildProcessError:
            break
    wall_s = time.perf_counter() - started
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"cpu_tree: wall {wall_s:.2f} s, cpu {used.ru_utime + used.ru_stime:.2f} s "
          f"(user {used.ru_utime:.2f}, system {used.ru_stime:.2f}), exit {code}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
