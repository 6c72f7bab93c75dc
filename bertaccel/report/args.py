"""The command lines of report and plan: a mistake in one is one line, `error: ...`, exit 2, as
every other bad input is (argparse would print its whole usage first)."""
from __future__ import annotations

import argparse
import unicodedata
from typing import Optional


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"error: {message}; see {self.prog} --help\n")


def name_problem(flag: str, value: Optional[str], what: str) -> Optional[str]:
    """Why a name typed on the command line (a run, a sweep id, an experiment, a strategy) cannot
    be one, or None: empty or only spaces (else it would be taken as not given), or holding a line
    break, tab or other control character (no name bertaccel writes has one, and a table or the
    console would break on it). None when not given."""
    if value is None:
        return None
    if not value.strip():
        return f"{flag} {value!r}: give a value ({what}) or leave {flag} out"
    odd = next((c for c in value if unicodedata.category(c).startswith("C")), None)
    if odd is not None:
        return f"{flag} {value!r}: holds the control character {odd!r}; give {what} as bertaccel printed it"
    return None
