"""The command lines of report and plan: a mistake in one is one line, `error: ...`, exit 2, as
every other bad input is (argparse would print its whole usage first)."""
from __future__ import annotations

import argparse


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"error: {message}; see {self.prog} --help\n")
