"""An output folder written whole or not at all (the report's and the plan's --out)."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Mapping, Sequence


def _umask() -> int:
    """The process's umask (reading it means setting it: set back at once)."""
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def write_folder(out: Path, files: Mapping[str, str], plots: Sequence[dict], prefix: str) -> None:
    """files: name -> text; plots: {'stem', 'png'} dicts, saved under plots/. Written to a
    temporary folder beside `out` first, then moved: an interrupted run leaves nothing
    half-written, and an earlier folder is replaced only by a complete one."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=out.parent if out.parent.exists() else None))
    try:
        # mkdtemp makes its folder private (0700); an output folder is a folder like any other the
        # user makes, so it gets what mkdir would give it under the user's umask (0755 under 022).
        os.chmod(tmp, 0o777 & ~_umask())
        (tmp / "plots").mkdir()
        for p in plots:
            (tmp / "plots" / f"{p['stem']}.png").write_bytes(p["png"])
        for name, text in files.items():
            (tmp / name).write_text(text)
        if out.exists():
            shutil.rmtree(out)
        shutil.move(str(tmp), str(out))
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
