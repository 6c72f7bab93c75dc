"""A single run refused for bad input takes back what this invocation wrote to its output
directory, and nothing else.

Hydra's job set-up writes before the run's checks can refuse it: it makes the output directory
(hydra.run.dir, by default outputs/<date>/<time>), writes .hydra/config.yaml, hydra.yaml and
overrides.yaml (over an earlier run's, when the directory is one an earlier run used: `.` or a
folder given twice) and appends to <job>.log. So the way it was is noted before that set-up
(`before_job`, from the frame's on_run_start: runs/progress.py), and `undo` puts back exactly
that: a file that was there gets its bytes back (a log its length), one that was not is removed,
and a directory is removed only when this invocation made it and it is empty. What the user keeps
there (their files, an earlier run's record) stays byte for byte.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

from omegaconf import DictConfig, OmegaConf

HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")  # what run_job writes in hydra.output_subdir


class Refused(Exception):
    """A single run's bad input, raised by its task after its one line is printed: Hydra hands it
    to the frame's on_run_end (runs/progress.py), which calls undo, then ends the process with
    exit status 2."""


@dataclass
class Before:
    """What the job set-up is about to write, as it was before it."""
    made: List[Path] = field(default_factory=list)  # directories not there: the output dir and parents, deepest first
    files: Dict[Path, Optional[bytes]] = field(default_factory=dict)  # Hydra's yaml files: their bytes, or None
    log: Optional[Path] = None
    log_size: Optional[int] = None  # the job log's length before (Hydra appends), None: not there


def before_job(config: DictConfig) -> Optional[Before]:
    """The output directory's files Hydra's job set-up writes, read before it (None when they
    cannot be read: then nothing is undone)."""
    try:
        # (as run_job makes it: relative to the working directory; ${now:} is cached per process)
        out = Path(os.path.abspath(str(OmegaConf.select(config, "hydra.run.dir"))))
        before = Before()
        d = out
        while not d.exists():
            before.made.append(d)
            d = d.parent
        subdir = config.hydra.output_subdir
        if subdir is not None:
            for name in HYDRA_FILES:
                p = out / str(subdir) / name
                before.files[p] = p.read_bytes() if p.is_file() else None
            if not (out / str(subdir)).exists() and out / str(subdir) not in before.made:
                before.made.insert(0, out / str(subdir))
        before.log = out / f"{config.hydra.job.name}.log"
        before.log_size = before.log.stat().st_size if before.log.is_file() else None
        return before
    except (OSError, ValueError, TypeError):
        return None


def undo(before: Optional[Before]) -> None:
    """Put the output directory back as `before` found it (see the module's docstring)."""
    if before is None:
        return
    # Hydra's file handler holds the log open (append mode): closed first, so nothing more is
    # written after the log is cut back.
    root = logging.getLogger()
    for h in list(root.handlers):
        if isinstance(h, logging.FileHandler) and before.log is not None and Path(h.baseFilename) == before.log:
            root.removeHandler(h)
            h.close()
    for p, content in before.files.items():
        _quietly(lambda: p.unlink(missing_ok=True) if content is None else _put_back(p, content))
    if before.log is not None:
        log, size = before.log, before.log_size
        _quietly(lambda: log.unlink(missing_ok=True) if size is None else os.truncate(log, size))
    for d in before.made:  # deepest first; rmdir: only while empty (a file of anyone else's stays)
        _quietly(d.rmdir)


def _put_back(p: Path, content: bytes) -> None:
    if not p.is_file() or p.read_bytes() != content:
        p.write_bytes(content)


def _quietly(action: Callable[[], object]) -> None:
    """One step of the undo: a step that cannot be done leaves that file or directory as it is
    (never an error of its own in place of the run's one line)."""
    try:
        action()
    except OSError:
        pass
