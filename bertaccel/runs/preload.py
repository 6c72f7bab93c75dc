"""What the forkserver imports once, for every run process to fork from (runs/forkserver.py):
importing this module is its whole job, so nothing else imports it.

The heavy imports of a run: torch, transformers' BERT and auto classes with their tokenizers,
MLflow with its SQL store, bertaccel's run code. None of them may open a CUDA context, so forked
runs still start without one (a library they pull in that asks the GPU at import is answered
through NVML: runs/cuda_free_imports.py). MLflow imports its SQL store (SQLAlchemy, alembic) only
when a run first opens a sqlite:// store: 0.6 s per run on a CI core, 1.3-1.7 s on an H200 host,
unless the server has it already.

The garbage collector is paused while they import: its passes over a heap that only grows
(a million objects once all is in) took a third of the imports (7.3-7.8 -> 4.8-5.0 s on a 2-core
CPU box, the same modules).
The heap is then frozen (gc.freeze, as Python's documentation advises before forking), so no
collection in a run process walks it again: the first one in each run had cost 0.33 s there
(a tokenizer fingerprint's json.dumps, 0.32 s the first time, 0.04 s after), and a later one
could land in a timed training window.
"""
from __future__ import annotations

import atexit
import gc
import importlib
import os
import time

from bertaccel.context import current
from bertaccel.runs.bytecode import cache_bytecode
from bertaccel.runs.cuda_free_imports import triton_check_without_cuda
from bertaccel.runs.forkserver import PRELOAD_COMPILE_ENV

# The server writes the bytecode cache its sweep's process set up (runs/bytecode.py), or its
# preload compiles transformers from source every time on an image that keeps no bytecode.
cache_bytecode()

MODULES = ("torch", "transformers", "transformers.models.bert.modeling_bert",
           "transformers.models.bert.tokenization_bert", "transformers.models.auto.modeling_auto",
           "transformers.models.auto.tokenization_auto", "mlflow", "mlflow.store.tracking.sqlalchemy_store",
           "bertaccel.runs.job", "bertaccel.runs.launch", "bertaccel.runs.worker_processes", "bertaccel.train.loop")
# What torch.compile imports on a run's first compile (Inductor, Triton): 0.8-0.9 s of a later
# compiled run's start-up on an H200 host when each run imports it itself (2-4 s without
# bytecode). Only for a sweep that compiles (the run context's preload_compile, set by
# forkserver.start_early from the command line; BERTACCEL_PRELOAD_COMPILE says otherwise): it
# lengthens the preload the first run waits on.
COMPILE_MODULES = ("torch._inductor.compile_fx", "torch._inductor.codecache", "triton")


def _preload_compile() -> bool:
    """The user's BERTACCEL_PRELOAD_COMPILE ("1": yes, anything else: no), else the command line's."""
    said = os.environ.get(PRELOAD_COMPILE_ENV)
    return said == "1" if said is not None else current().preload_compile


def _nvml_answers() -> bool:
    """Whether torch can count GPUs through NVML here (so asking for them poisons no fork); a CPU
    build never asks CUDA. Where NVML does not answer, the compiled runs import Inductor themselves."""
    import torch

    if torch.version.cuda is None:
        return True
    try:
        return torch.cuda._device_count_nvml() >= 0
    except Exception:  # noqa: BLE001 - a private helper of torch's: gone or failing, no preload
        return False


gc.disable()
try:
    # A library transformers imports may ask Triton about the GPU through the CUDA runtime (torchao
    # does): answered from NVML here, or the server's context poisons every fork (cuda_free_imports).
    with triton_check_without_cuda():
        for name in MODULES:
            try:
                importlib.import_module(name)
            except ImportError:  # as the forkserver does with a preload it cannot import: the run will say
                pass
    if _preload_compile() and _nvml_answers():
        # Inductor asks torch.cuda.is_available() as it imports: through the CUDA runtime that
        # poisons every later fork ("Cannot re-initialize CUDA in forked subprocess", seen on an
        # H200), through NVML it does not.
        from bertaccel.hydra_adapter import env_override  # (in already: train/compile_cache.py uses it too)

        with env_override({"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}):
            for name in COMPILE_MODULES:
                try:
                    importlib.import_module(name)
                except ImportError:
                    pass
finally:
    gc.freeze()
    # When the server ends (its sweep's process closed): let the heap go as before, or Triton's
    # bindings print ~30 lines of "leaked" objects. (Run processes end with os._exit: no collection.)
    atexit.register(gc.unfreeze)
    gc.enable()  # (inherited by every run process forked from here)
    # When the server was ready: a run process forked from it reads this (runs/startup.py
    # fork_marks) to tell its wait on the preload from the fork.
    LOADED_AT = time.time()
