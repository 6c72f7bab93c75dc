"""How much of the package a newcomer reads to follow one run: the package files and functions
that run between `python -m bertaccel.run` and the first optimizer step of a single run.

    PYTHONPATH=SRC python benchmarks/newcomer_path.py [OVERRIDES ...]

Runs the command's own entry (bertaccel/run.py as __main__, launcher=inline so the run is in this
process) under a profile hook that notes every call into a function defined under SRC/bertaccel,
and stops noting at the first optimizer step (torch's global step pre-hook). Module bodies count
as functions (`<module>`), as a reader meets them too. Prints the counts, the files with the most
functions first. Run it for the tree before a change and after; the numbers are of that tree.
"""
from __future__ import annotations

import os
import runpy
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path

TINY = ["model=tiny", "train.device=cpu", "dataset.train_subset=128", "dataset.test_subset=64",
        "train.batch_size=16", "train.epochs=1", "train.max_steps_per_epoch=2"]


def main() -> None:
    import bertaccel

    package = str(Path(bertaccel.__file__).resolve().parent) + os.sep
    seen: set = set()
    done = threading.Event()

    def note(frame, event, arg):  # noqa: ANN001 - sys.setprofile's signature
        if event == "call" and not done.is_set():
            code = frame.f_code
            if code.co_filename.startswith(package):
                seen.add((code.co_filename[len(package):], code.co_firstlineno, code.co_name))

    import torch.optim.optimizer as optimizer_module

    def first_step(optimizer, args, kwargs):  # noqa: ANN001 - torch's hook signature
        if not done.is_set():
            done.set()
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]
            files = Counter(path for path, _, _ in seen)
            print(f"before the first optimizer step: {len(files)} package files, {len(seen)} functions",
                  file=sys.__stderr__, flush=True)
            for path, n in files.most_common():
                print(f"  {n:4d}  {path}", file=sys.__stderr__)

    optimizer_module.register_optimizer_step_pre_hook(first_step)
    work = tempfile.mkdtemp(prefix="newcomer-")
    os.chdir(work)
    sys.argv = ["bertaccel.run", *TINY, "launcher.name=inline", f"cache_dir={work}/cache",
                f"tracking.uri=sqlite:///{work}/mlflow.db", *sys.argv[1:]]
    threading.setprofile(note)
    sys.setprofile(note)
    try:
        runpy.run_module("bertaccel.run", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if not done.is_set():
            print(f"the run ended (exit {e.code}) before any optimizer step", file=sys.__stderr__)
            raise


if __name__ == "__main__":
    main()
