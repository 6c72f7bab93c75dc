"""An output folder (the report's and the plan's --out): written whole beside its target, then
swapped in, and only ever over a folder that bertaccel itself wrote there.

The one home of what an acceptable --out is. A folder bertaccel writes holds MARKER, which names
its kind (report, plan) and lists every file and folder written into it. An existing target is
replaced only when it is a folder with that marker, of the same kind, holding nothing the marker
does not list: never the current directory or one above it, never a file, never a folder the
user made or added to (a store moved into an old report folder stays where it is).
"""
from __future__ import annotations

import ctypes
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import List, Mapping, Optional, Sequence

from bertaccel.option import user_path

MARKER = ".bertaccel-output"
KINDS = ("report", "plan")  # what writes output folders: python -m bertaccel.report, python -m bertaccel.plan
_HEADER = "bertaccel {kind} output folder"
_EXPLAINED = ("# bertaccel wrote this folder whole and replaces it whole when --out names it again,\n"
              "# but only while it holds nothing except the entries listed below: add anything else\n"
              "# (or delete this file) and bertaccel refuses to replace it, leaving it as it is.\n")
_FIX = "choose a new folder name for --out, or move or remove it yourself"


class OutputFolderError(ValueError):
    """--out cannot be written; the message is the one line the user sees."""


def _umask() -> int:
    """The process's umask (reading it means setting it: set back at once)."""
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def _listed(folder: Path, kind: str) -> Optional[List[str]]:
    """The entries folder's marker lists (folders end in '/'), or None when the marker is not a
    file of bertaccel's own of this kind."""
    marker = folder / MARKER
    if marker.is_symlink() or not marker.is_file():
        return None
    try:
        lines = marker.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    if not lines or lines[0] != _HEADER.format(kind=kind):
        return None
    return [line for line in lines[1:] if line and not line.startswith("#")]


def _not_ours(folder: Path, kind: str) -> Optional[str]:
    """Why the existing folder may not be replaced by a new one of this kind (None: it may)."""
    listed = _listed(folder, kind)
    if listed is None:
        other = [k for k in KINDS if k != kind and _listed(folder, k) is not None]
        if other:  # e.g. the report's --out naming the plan folder whose plan.csv it reads
            return f"holds a bertaccel {other[0]}, not a {kind}"
        return f"exists and is not a folder bertaccel wrote (it has no {MARKER} of a {kind})"
    unreadable: List[OSError] = []
    extra = []
    # os.walk does not follow links to folders: a link is one entry here, like a file.
    for root, dirs, files in os.walk(folder, onerror=unreadable.append):
        rel = Path(root).relative_to(folder)
        extra += [str(rel / d) + "/" for d in dirs if str(rel / d) + "/" not in listed]
        extra += [str(rel / f) for f in files if str(rel / f) not in listed and str(rel / f) != MARKER]
    if unreadable:
        return f"cannot be read through ({unreadable[0].strerror}: {unreadable[0].filename})"
    if extra:
        shown = ", ".join(sorted(extra)[:3]) + (f" and {len(extra) - 3} more" if len(extra) > 3 else "")
        return f"holds {len(extra)} thing(s) bertaccel did not write there ({shown})"
    return None


def _exchange(a: Path, b: Path) -> bool:
    """Swap two folders in one step (Linux renameat2 RENAME_EXCHANGE): no moment without either.
    False, changing nothing, where the C library or the file system has no such call."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_cwd, rename_exchange = -100, 2  # AT_FDCWD, RENAME_EXCHANGE (linux/fcntl.h, linux/fs.h)
    return renameat2(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), rename_exchange) == 0


def check_folder(text: str, kind: str) -> Path:
    """The absolute folder --out TEXT names, once a new `kind` folder may be written there;
    OutputFolderError (what is wrong and how to fix it) otherwise. Called before any work, so bad
    --out costs nothing, and again by write_folder just before it writes."""
    if not text.strip():
        raise OutputFolderError(f"--out '': give a folder name, e.g. --out {kind}")
    out = user_path(text)
    if out.is_symlink():  # a rename would move the link, not the folder it points to
        raise OutputFolderError(f"--out {text}: is a symbolic link; give the folder it points to, or a new name")
    out = out.resolve()
    cwd = Path.cwd().resolve()
    if out == cwd or out in cwd.parents:
        raise OutputFolderError(f"--out {text}: is the current directory or one that holds it, and the output "
                                f"folder is replaced whole; give a new folder name, e.g. --out {kind}")
    parent = out.parent
    if not parent.is_dir():
        why = "is not a folder" if parent.exists() else "does not exist"
        raise OutputFolderError(f"--out {text}: its parent {parent} {why}; create the parent folder first "
                                "or give another path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputFolderError(f"--out {text}: its parent {parent} is not writable (the folder is written "
                                "beside its target first); give a path in a folder you can write")
    if out.exists():
        if not out.is_dir():
            raise OutputFolderError(f"--out {text}: is a file, not a folder; {_FIX}")
        not_ours = _not_ours(out, kind)
        if not_ours:
            raise OutputFolderError(f"--out {text}: {not_ours}; {_FIX}")
    return out


def new_temporary(parent: Path, kind: str) -> Path:
    """The hidden folder an output is written into before it is swapped in, named with this
    process's id (.report-<pid>-XXXX): a writer killed (kill -9) leaves it, and remove_stale
    can tell it from a live writer's."""
    return Path(tempfile.mkdtemp(prefix=f".{kind}-{os.getpid()}-", dir=parent))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # (another user's process: alive)
        return True
    return True


def remove_stale(parent: Path, kind: str) -> None:
    """Removes the temporary folders of earlier writers of this kind in `parent` whose process
    is gone; a live writer's (a concurrent report) stays, and so does anything not so named
    (an earlier output set aside during a swap is .<kind>-old-...: it may be the only copy)."""
    pattern = re.compile(rf"^\.{re.escape(kind)}-(\d+)-[A-Za-z0-9_]+$")
    try:
        entries = list(parent.iterdir())
    except OSError:
        return
    for entry in entries:
        m = pattern.match(entry.name)
        if m and not entry.is_symlink() and entry.is_dir() and not _alive(int(m.group(1))):
            shutil.rmtree(entry, ignore_errors=True)


def write_folder(text: str, kind: str, files: Mapping[str, str], plots: Sequence[dict]) -> None:
    """files: name -> text; plots: {'stem', 'png'} dicts, saved under plots/. Written to a
    temporary folder beside --out TEXT first (same file system, so renames are atomic), then
    swapped in: an interrupted run leaves the earlier folder or the new one, never half of
    either, and never replaces a folder check_folder refuses. OutputFolderError when nothing
    was changed."""
    out = check_folder(text, kind)
    remove_stale(out.parent, kind)
    try:
        tmp = new_temporary(out.parent, kind)
    except OSError as e:
        raise OutputFolderError(f"--out {text}: cannot write in {out.parent} ({e.strerror}); "
                                "give a path in a folder you can write") from None
    aside: Optional[Path] = None  # a private folder holding the earlier output during the swap
    swapped = False
    try:
        # mkdtemp makes its folder private (0700); an output folder is a folder like any other the
        # user makes, so it gets what mkdir would give it under the user's umask (0755 under 022).
        os.chmod(tmp, 0o777 & ~_umask())
        (tmp / "plots").mkdir()
        written = ["plots/"]
        for p in plots:
            (tmp / "plots" / f"{p['stem']}.png").write_bytes(p["png"])
            written.append(f"plots/{p['stem']}.png")
        for name, body in files.items():
            (tmp / name).write_text(body)
            written.append(name)
        (tmp / MARKER).write_text(_HEADER.format(kind=kind) + "\n" + _EXPLAINED + "\n".join(written) + "\n")
        if out.exists():
            # Again, just before the swap: the user may have put something there since the check.
            why = _not_ours(out, kind) if out.is_dir() else "is a file, not a folder"
            if why:
                raise OutputFolderError(f"--out {text}: {why}; {_FIX}")
            if _exchange(tmp, out):  # tmp now holds the earlier folder, deleted below
                return
            # Else: the earlier folder aside, the new one in, then the earlier one deleted; only
            # a crash between the two renames leaves both beside it, under hidden names.
            aside = Path(tempfile.mkdtemp(prefix=f".{kind}-old-", dir=out.parent))
            os.rename(out, aside / out.name)
        os.rename(tmp, out)  # fails, changing nothing, if a folder appeared there meanwhile
        swapped = True
    except OSError as e:
        raise OutputFolderError(f"--out {text}: could not write it ({e.strerror or e}); nothing was changed") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if aside is not None:
            old = aside / out.name
            if not swapped and old.exists() and not os.path.lexists(out):
                try:  # interrupted between the two renames: the earlier folder goes back
                    os.rename(old, out)
                except OSError:
                    pass  # then it stays in `aside`, which is kept (below)
            if swapped or not old.exists():
                shutil.rmtree(aside, ignore_errors=True)
