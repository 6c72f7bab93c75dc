"""Ctrl-C and SIGTERM of the commands that read a store and write output (python -m
bertaccel.report, python -m bertaccel.plan): one line and the exit status 128 + the signal (130,
143), as a run says it (runs/interrupt.py), not a KeyboardInterrupt traceback. The line says what
was written, and that is true: each output is written whole or not begun (`held` keeps the
signals waiting while one is written).
"""
from __future__ import annotations

import os
import signal
import sys
from contextlib import contextmanager
from typing import Callable, Iterator, List, Optional

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def while_starting() -> None:
    """At the top of a command's __main__, before its imports (seconds): a signal then is one
    line and the exit, nothing having been written."""
    def _stop(signum, frame):  # noqa: ANN001 - a signal handler's signature
        print(f"\ninterrupted by {signal.Signals(signum).name} while starting: nothing was written",
              file=sys.stderr, flush=True)
        # os._exit, not an exception: one raised inside a library's import can be caught there
        # and leave it half-initialized (run.py says what was seen); nothing is written yet.
        os._exit(128 + signum)

    for s in SIGNALS:
        signal.signal(s, _stop)
    from bertaccel.runs.interrupt import quiet_when_stdout_closes

    quiet_when_stdout_closes()  # `plan ... | head -1`: the plan still saved, no BrokenPipeError


@contextmanager
def held() -> Iterator[None]:
    """The signals wait (blocked, then delivered) while one output is written and recorded."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def run(main: Callable[[Optional[List[str]], List[str]], int], argv: Optional[List[str]] = None) -> int:
    """main(argv, written) with the signals raising runs.interrupt.Interrupted; main appends to
    `written` each output it has written (inside `held`)."""
    from bertaccel.runs.interrupt import Interrupted, install

    written: List[str] = []
    install()
    try:
        return main(argv, written)
    except Interrupted as e:
        what = f"{', '.join(written)} written before it" if written else "nothing written"
        print(f"interrupted by {e.signame}: {what}", file=sys.stderr, flush=True)
        return e.exit_code
