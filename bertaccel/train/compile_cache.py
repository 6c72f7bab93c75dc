"""Where compiled kernels are kept between runs, and whether a run found them there.

torch.compile (Inductor's FX-graph and AOTAutograd caches) and Triton (our attention kernels,
Inductor's generated kernels) write what they compile to disk. A sweep should pay each compile
once per machine, not once per run: the caches live under `cache_dir/compile/<key>`, where the
key names everything that makes a compiled artifact unusable elsewhere (torch, Triton, CUDA,
Python, GPU model), so another torch or another GPU never reads them. The directories are set
through the environment variables both libraries read, so they hold just as well when runs
move into processes of their own.

Each run says what its warm-up met: `cold` (something was compiled and written), `warm` (all
of it came from the cache), `fresh` (compile.cache=fresh: an empty per-run directory, removed
afterwards, for anyone measuring cold compilation) or `none` (nothing was compiled).
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, Optional

import torch
from bertaccel.hydra_adapter import env_override

from bertaccel.config import CompileConfig
from bertaccel.option import user_path
from bertaccel.options.compile import keeps_cache

def cache_key_parts(device: torch.device) -> Dict[str, str]:
    """What a compiled artifact depends on. Triton is read from its package metadata: importing
    it costs a second and most runs never need it."""
    from importlib import metadata

    try:
        triton_version = metadata.version("triton")
    except metadata.PackageNotFoundError:
        triton_version = "absent"
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        target = f"{props.name} sm_{props.major}{props.minor}"
    else:
        target = f"cpu {platform.machine()} {platform.processor() or ''}".strip()
    return {"torch": torch.__version__, "triton": triton_version, "cuda": str(torch.version.cuda),
            "python": sys.version.split()[0], "device": target}


def cache_key(parts: Dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _file_count(root: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(root)) if root.is_dir() else 0


def _inductor_misses() -> int:
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["fxgraph_cache_miss"])


@dataclass
class CompileCache:
    """cold = Inductor missed its FX-graph cache or Triton wrote a new kernel. Counted, not
    guessed from the directory: Inductor writes files on a cache hit too (seen on an H200:
    a run whose warm-up fell from 49 s to 11 s still added files)."""
    mode: str            # compile.cache, as the record names it
    kept: bool           # the directory outlives the run (options/compile.py keeps_cache)
    root: Path
    key: str
    files_at_start: int = 0         # whole cache directory, for the record
    triton_files_at_start: int = 0
    misses_at_start: int = 0
    new_triton_files: Optional[int] = None
    new_inductor_misses: Optional[int] = None

    def mark_warmed_up(self) -> None:
        self.new_triton_files = _file_count(self.root / "triton") - self.triton_files_at_start
        self.new_inductor_misses = _inductor_misses() - self.misses_at_start

    def state(self, compiled_anything: bool) -> str:
        """cold / warm / fresh / none (see the module docstring)."""
        if not compiled_anything:
            return "none"
        if not self.kept:
            return "fresh"
        return "cold" if (self.new_triton_files or 0) > 0 or (self.new_inductor_misses or 0) > 0 else "warm"

    def describe(self) -> str:
        return f"{self.mode} compile cache {self.root} (key {self.key})"


def _clear_in_memory_caches() -> None:
    # Inductor memoizes loaded modules and the cache directory path; switching directories
    # without this would keep serving the previous run's in-memory entries.
    try:
        from torch._inductor.utils import clear_caches
    except ImportError:  # older torch: nothing memoized by path
        return
    clear_caches()


@contextmanager
def compile_caches(cache_dir: str, compile_cfg: CompileConfig, device: torch.device) -> Iterator[CompileCache]:
    """Point Inductor and Triton at this run's cache directories for the duration of the run."""
    parts = cache_key_parts(device)
    key = cache_key(parts)
    kept = keeps_cache(compile_cfg)
    if not kept:
        root = Path(tempfile.mkdtemp(prefix="bertaccel-compile-"))
    else:
        root = user_path(cache_dir) / "compile" / key
        root.mkdir(parents=True, exist_ok=True)
        # The key's ingredients beside the caches, for a person wondering what a directory is.
        (root / "KEY.json").write_text(json.dumps(parts, indent=1, sort_keys=True))
    # Set through the environment, which both libraries read (also in processes a run starts).
    env = {"TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"), "TRITON_CACHE_DIR": str(root / "triton")}
    # Dynamo's "profile-guided" memory of which dims were dynamic lives in the same directory;
    # it would make a run's graphs depend on what ran before it, so it is off (see step.dynamo_settings).
    try:
        with env_override(env):
            _clear_in_memory_caches()
            yield CompileCache(compile_cfg.cache, kept, root, key, files_at_start=_file_count(root),
                               triton_files_at_start=_file_count(root / "triton"), misses_at_start=_inductor_misses())
    finally:
        _clear_in_memory_caches()
        if not kept:
            shutil.rmtree(root, ignore_errors=True)
