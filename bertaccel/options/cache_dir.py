"""The `cache_dir` setting's check: a directory the run may create and write into (compiled
kernels, tokenized datasets)."""
from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, List, Optional

from bertaccel.option import Option, problems, user_path

if TYPE_CHECKING:
    from bertaccel.config import RunConfig


def check_cache_dir(cfg: "RunConfig") -> Optional[str]:
    """Refuses a cache_dir whose nearest existing part is not a directory this user can write
    (checked without creating anything). Otherwise the first cache write fails inside the run's
    process, after its MLflow run was opened."""
    value = cfg.cache_dir
    path = user_path(value)
    unset = re.findall(r"\$\{?(\w+)", str(path))
    if unset:
        return f"cache_dir={value}: the environment variable {unset[0]} is not set; set it, or give a folder"
    existing = next(p for p in (path, *path.parents) if p.exists())
    where = "" if existing == path else f" ({existing} exists)"
    if not existing.is_dir():
        return f"cache_dir={value}: {existing} is not a directory; give a directory (created if missing)"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"cache_dir={value}: cannot be written by this user{where}; give a directory you can write"
    return None


class CacheDirOption(Option):
    section, schema = "cache_dir", None

    def check(self, cfg: "RunConfig") -> List[str]:
        """Refuses a cache_dir whose nearest existing part is not a directory this user can write
        (checked without creating anything). Otherwise the first cache write fails inside the
        run's process, after its MLflow run was opened."""
        return problems(check_cache_dir(cfg))


OPTION = CacheDirOption()
