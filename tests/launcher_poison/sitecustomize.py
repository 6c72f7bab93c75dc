"""Test-only faults for tests/test_launcher.py, injected into launcher workers from outside.

The test puts this directory first on PYTHONPATH of the `python -m bertaccel.run` it starts.
Python imports `sitecustomize` at start-up in every interpreter, and the launcher's workers
(torch.multiprocessing, spawn) inherit the environment, so this runs in each of them. It does
nothing unless BERTACCEL_TEST_POISON is set and the interpreter is a spawned worker
(multiprocessing starts those with `--multiprocessing-fork` in argv; the sweep's own process,
multiprocessing's resource tracker etc. are left alone). It shadows any sitecustomize of the
Python installation for that subprocess only.

BERTACCEL_TEST_POISON is a comma-separated list of faults, each `action:key=value[:key=value]`:
  abort:seed=N                  the run with train.seed=N calls os.abort() (dies from SIGABRT)
  memory:seed=N                 the run with train.seed=N raises MemoryError
  kill:seed=N:rank=R:window=W   rank R of the run with train.seed=N sends itself SIGKILL at
                                its W-th call of bertaccel.train.step.accumulate_window
All of them fire when the run enters training (bertaccel.runs.job.train), i.e. after the run's
MLflow record is open, as a real crash in training would.

How: a meta-path finder that lets Python import `bertaccel.runs.job` as usual, then replaces the
`train` that job.py imported (`from .train import train`) with a wrapper. Nothing in bertaccel
knows about any of this.
"""
import os
import sys

_SPEC = os.environ.get("BERTACCEL_TEST_POISON")

# A spawned worker has --multiprocessing-fork in argv; with launcher.start_method=forkserver the
# workers are forked from the forkserver, which imports bertaccel.runs.job once (patched here) for all.
_WORKER = "--multiprocessing-fork" in sys.argv or "multiprocessing.forkserver" in " ".join(getattr(sys, "orig_argv", []))

if _SPEC and _WORKER:
    import importlib.abc
    import importlib.util

    _FAULTS = []
    for item in filter(None, _SPEC.split(",")):
        action, *conds = item.split(":")
        _FAULTS.append((action, {k: int(v) for k, v in (c.split("=") for c in conds)}))

    def _kill_at(tmod, rank: int, window: int) -> None:
        """Wrap accumulate_window (looked up by name in train/step.py's Step) to die at call `window`."""
        real, calls = tmod.accumulate_window, [0]

        def accumulate_window(*args, **kwargs):
            import signal

            import torch.distributed as dist

            calls[0] += 1
            if calls[0] == window and dist.is_initialized() and dist.get_rank() == rank:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*args, **kwargs)

        tmod.accumulate_window = accumulate_window

    def _poison(job_module) -> None:
        import bertaccel.train.step as tmod

        real_train = job_module.train

        def train(model, train_loader, test_loader, cfg, *args, **kwargs):
            for action, when in _FAULTS:
                if when.get("seed") != cfg.train.seed:
                    continue
                if action == "abort":
                    import resource

                    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file
                    os.abort()
                if action == "memory":
                    raise MemoryError("poisoned run (tests/launcher_poison)")
                if action == "kill":
                    _kill_at(tmod, when["rank"], when["window"])
            return real_train(model, train_loader, test_loader, cfg, *args, **kwargs)

        job_module.train = train

    class _PoisonAfterImport(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name != "bertaccel.runs.job":
                return None
            sys.meta_path.remove(self)  # once; and lets find_spec below use the real finders
            spec = importlib.util.find_spec(name)
            exec_module = spec.loader.exec_module

            def exec_then_poison(module):
                exec_module(module)
                _poison(module)

            spec.loader.exec_module = exec_then_poison
            return spec

    sys.meta_path.insert(0, _PoisonAfterImport())
