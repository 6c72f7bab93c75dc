"""Entries of the data caches under cache_dir (raw/: parsed CSVs, tokens/: tokenized splits):
written whole or not at all, checked when read, and rebuilt from the source data when they
cannot be read.

An entry is the payload and a trailer line (format, payload size, sha256 of the payload). A
truncated file, garbage, a flipped bit in a tensor that would still load, an empty file: each
fails the check or the loader, is logged with the file's path, removed and rebuilt, and the run
goes on with the data read afresh. A cache is a copy of what the source data gives: losing an
entry costs a rebuild, never a run.
"""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path
from typing import Callable, Optional, Tuple, TypeVar

from bertaccel.config import first_line
from bertaccel.option import user_path

log = logging.getLogger("bertaccel")
T = TypeVar("T")

MAGIC = b"bertaccel-cache 1"


class BadEntry(ValueError):
    """What the trailer check found wrong with an entry (its message is the reason, as logged)."""


def cached(path: Path, build: Callable[[], T], dump: Callable[[T], bytes], load: Callable[[bytes], T],
           check: Callable[[T], None]) -> Tuple[T, bool]:
    """(the entry's object, True) when path holds a good entry, else (build(), False) with the
    entry written for later runs. load: payload bytes -> object; check: raises when a loaded
    object is not what build() would give (wrong shape, counts that disagree)."""
    why = None
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = None
    except OSError as e:  # a directory in its place, no read permission
        why = f"{type(e).__name__}: {e.strerror or e}"
        data = None
    if data is not None:
        try:
            obj = load(_payload(data))
            check(obj)
            return obj, True
        except Exception as e:  # noqa: BLE001 - whatever a damaged file makes a loader raise
            why = _reason(e)
    if why is not None:
        if not _remove(path, why):
            return build(), False  # (the entry's place is taken: no write either)
        log.warning(f"cache entry {path} is unreadable ({why}): rebuilt")
    obj = build()
    _write(path, dump(obj))
    return obj, False


def _reason(e: Exception) -> str:
    """One line: the check's own words, or a loader's exception type and first sentence (torch's
    run on for a paragraph about weights_only that does not apply to a damaged file)."""
    text = first_line(e, default="").split(". ")[0][:160]
    return text if isinstance(e, BadEntry) else f"{type(e).__name__}: {text}" if text else type(e).__name__


def _payload(data: bytes) -> bytes:
    """The payload of an entry, its trailer checked. The trailer goes after the payload so that
    an entry stays what its loader reads (a pickle ignores what follows it). A file without a
    trailer is an entry of an older version or one cut short: its loader and check decide."""
    if not data:
        raise BadEntry("empty file")
    start = data.rfind(b"\n" + MAGIC, max(0, len(data) - 200))
    if start < 0:
        return data
    try:
        _, _, size_field, digest = data[start + 1:].decode("ascii").split()
        size = int(size_field.removeprefix("bytes="))
        digest = digest.removeprefix("sha256=")
    except ValueError:
        raise BadEntry("trailer unreadable") from None
    payload = data[:start]
    if len(payload) != size:
        raise BadEntry(f"{len(payload)} of {size} payload bytes")
    if hashlib.sha256(payload).hexdigest() != digest:
        raise BadEntry("checksum mismatch")
    return payload


def _remove(path: Path, why: str) -> bool:
    """Removes a bad entry (a regular file only: a directory in its place is left as it is)."""
    try:
        if path.is_dir() and not path.is_symlink():
            raise IsADirectoryError(21, "a directory")
        path.unlink()
        return True
    except FileNotFoundError:  # removed meanwhile by a parallel run that found it bad too
        return True
    except OSError as e:
        log.warning(f"cache entry {path} is unreadable ({why}) and cannot be removed "
                    f"({type(e).__name__}: {e.strerror or e}): this run reads the source data instead; "
                    f"remove it, or give a cache_dir= you can write")
        return False


def _write(path: Path, payload: bytes) -> bool:
    """Writes an entry atomically; a failure (disk full, a folder it cannot write) is one line and
    the run goes on with the data it has."""
    trailer = b"\n%s bytes=%d sha256=%s\n" % (MAGIC, len(payload), hashlib.sha256(payload).hexdigest().encode())
    try:
        write_atomic(path, payload + trailer)
        return True
    except OSError as e:
        log.warning(f"cache entry {path} cannot be written ({type(e).__name__}: {e.strerror or e}): "
                    f"this run goes on without it; free space, or give a cache_dir= you can write")
        return False


def write_atomic(path: Path, data: bytes) -> None:
    """Write to a temporary file beside path, then rename it over path (atomic on one file
    system): a run killed mid-write leaves the old entry or none, never a truncated one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def entry_path(cache_dir: Optional[str], kind: str, key: str, suffix: str) -> Path:
    """cache_dir/<kind>/<key><suffix> (kind: raw, tokens)."""
    return user_path(cache_dir) / kind / f"{key}{suffix}"
