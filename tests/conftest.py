"""Shared test helpers: compose configs from bertaccel/conf/ and run the real CLI in a temp directory."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import List

# Each pytest-xdist worker's share of the cores for torch's intra-op threads, in this worker and
# (through the environment) in every run, script and server it starts: torch gives each process a
# thread per core, so two workers training at once ran four spinning threads on CI's two cores. A
# CPU run of the default job on 800 rows took 92 s beside another where alone it takes 28 s (46 s
# with one thread each). Set before torch is imported: it reads the variable then. A value the
# developer exported wins.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // _WORKERS)))

import torch  # noqa: E402

if _WORKERS > 1 and "OMP_NUM_THREADS" in os.environ:
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # (in case a plugin imported torch first)

# Triton kernels run on a machine without CUDA only in Triton's interpreter, which is chosen
# when the kernels are defined: set it before any test imports them.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# tmp_path in memory (tmpfs) where the machine has one: most tests make a real SQLite MLflow store
# there, and on a disk each of its commits waits for an fsync (tens of ms here; a new store's
# migrations commit many times), which a test of what lands in the store does not need: a killed
# process's writes survive in the page cache alike. PYTEST_DEBUG_TEMPROOT set by hand wins.
if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", "/dev/shm")

import pytest
import warm_cli  # noqa: E402 (tests/warm_cli.py)
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from bertaccel.config import CONF_DIR, register_configs  # noqa: E402 (CONF_DIR: bertaccel/conf, packaged with it)
from bertaccel.runs import startup  # noqa: E402

# Small but real: the tiny BERT on a slice of the bundled AG News sample, on the CPU (so the
# expectations about what is skipped hold on a GPU machine too).
TINY = ["model=tiny", "train.device=cpu", "dataset.train_subset=128", "dataset.test_subset=64", "train.batch_size=16"]


_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@pytest.fixture(autouse=True)
def _signals_as_they_were(request):
    """Each test leaves the worker's SIGINT/SIGTERM handlers and blocked set as it found them.
    Code under test installs handlers (runs/interrupt.install, report/stop.run) and blocks the
    signals while it writes (report/stop.held); a blocked or ignored signal is inherited by every
    process the worker starts later, through fork and exec, so a later test's Ctrl-C to its child
    would be lost depending on which test ran before it in the same worker. A test that leaves
    them changed is named in a warning."""
    handlers = {s: signal.getsignal(s) for s in _SIGNALS}
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    changed = [signal.Signals(s).name for s in _SIGNALS if signal.getsignal(s) is not handlers[s]]
    now_blocked = signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    if now_blocked != blocked:
        changed.append(f"blocked set {sorted(signal.Signals(s).name for s in now_blocked)}")
    for s, h in handlers.items():
        signal.signal(s, h)
    if changed:
        import warnings
        warnings.warn(f"{request.node.nodeid} left the worker's signals changed: {', '.join(changed)} (restored)")


# The start-up phases (runs/startup.py) of a sweep's first run in its main process before its job
# starts, those of every job in the main process, and those of a forked run process.
MAIN_PARTS = [startup.MAIN_IMPORTS, startup.MAIN_COMPOSE, startup.MAIN_PARENT_RUN, startup.MAIN_SWEEP_START]
JOB_PARTS = [startup.JOB_START, startup.LAUNCH_CHECKS, startup.LAUNCH_RESUME]
FORKED_PARTS = [startup.PROCESS_FORK, startup.PROCESS_FORKED, startup.PROCESS_SETUP, startup.PROCESS_IMPORTS]


def startup_phases_of(run):
    """A run's startup_phases_s, checked: none negative, summing to its startup_overhead_s."""
    import json

    phases = json.loads(run.data.tags["startup_phases_s"])
    assert all(v >= 0 for v in phases.values()), phases
    assert abs(sum(phases.values()) - run.data.metrics["startup_overhead_s"]) < 0.01, phases
    return phases


def tiny_training(cfg):
    """A composed config's model (seed 0) and its (train, test) loaders, built as runs/job.py builds
    them, for tests that drive the training core without a run around it."""
    from bertaccel.data import Batching, load_raw, make_loader, tokenize_cached
    from bertaccel.model import build_model, load_tokenizer
    from bertaccel.train.step import uses_fixed_shapes

    raw = load_raw(cfg.dataset)
    tok = load_tokenizer(cfg.model)
    data = tokenize_cached(raw, tok, cfg.dataset.max_length, cfg.cache_dir)
    torch.manual_seed(0)
    model, _ = build_model(cfg.model, raw.num_labels, cfg.attention, len(tok), cfg.encoder)
    batching = Batching(cfg.train.batch_size, cfg.train.pad_to_multiple_of, True, uses_fixed_shapes(cfg))
    loaders = [make_loader(split, batching.sized(bs), tok.pad_token_id, shuffle, 0)
               for split, bs, shuffle in ((data.train, cfg.train.batch_size, True),
                                          (data.test, cfg.train.eval_batch_size, False))]
    return model, loaders, data


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the marks below count there
def pytest_collection_modifyitems(config, items):
    """A test that reads a page in Chromium (tests/browser.py's fixture) or starts PostgreSQL
    (marked postgres) starts an outside program, installed with apt-get where missing: slow, like
    a real training run (docs/contributing.md)."""
    for item in items:
        if "browser" in getattr(item, "fixturenames", ()) or item.get_closest_marker("postgres"):
            item.add_marker(pytest.mark.slow)
    # Then the files with slow tests first, most slow tests first, and the fast files last, so that
    # the two workers end together (pyproject's --no-loadscope-reorder keeps this order: xdist's own
    # puts the files with most tests first, which left a one-test file of 40-55 s running alone at
    # the end of the suite while the other core idled).
    slow: dict = {}
    for item in items:
        slow[item.path] = slow.get(item.path, 0) + bool(item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow[item.path])


@pytest.fixture
def compose_cfg():
    register_configs()
    GlobalHydra.instance().clear()

    def _compose(overrides: List[str] = (), searchpath=None):
        # searchpath: a directory of extra options (e.g. <dir>/precision/new.yaml), as a user adds them
        extra = [f"hydra.searchpath=[file://{searchpath}]"] if searchpath else []
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name="config", overrides=extra + list(overrides))

    yield _compose
    GlobalHydra.instance().clear()


@pytest.fixture
def cli(tmp_path):
    """Run `python -m bertaccel.run ARGS` in tmp_path with its own MLflow store and cache: a process
    of its own, forked from the worker's warm parent (tests/warm_cli.py)."""
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"

    def _run(args: List[str], timeout: int = 600, uri: str = store, fresh: bool = False) -> subprocess.CompletedProcess:
        # uri: another tracking URI than the temp store (e.g. one that cannot be reached).
        # fresh: a new interpreter, for a test of what the command's own start-up measures.
        cmd = [sys.executable, "-m", "bertaccel.run", *args, f"tracking.uri={uri}",
               f"cache_dir={tmp_path / 'cache'}"]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        return (subprocess.run if fresh else warm_cli.run)(cmd, cwd=tmp_path, capture_output=True, text=True,
                                                           timeout=timeout, env=env)

    _run.store = store
    _run.dir = tmp_path
    return _run


def sweep_children(store: str) -> list:
    """A store's runs other than the sweeps' parent runs."""
    from bertaccel.record.tracking import search_runs

    return [r for r in search_runs(store, "bertaccel") if r.data.tags.get("bertaccel.role") != "sweep"]


def kill_mid_run(proc: subprocess.Popen, store: str, timeout_s: float) -> bool:
    """SIGKILL a sweep's process group (started with start_new_session=True) as soon as one of its
    runs has finished and another is running, i.e. caught mid-way; then reap it. False: the sweep
    ended (or timeout_s passed) before that moment came."""
    import time
    from collections import Counter

    deadline, killed = time.time() + timeout_s, False
    while time.time() < deadline and proc.poll() is None:
        status = Counter(r.data.tags.get("status") for r in sweep_children(store))
        if status["finished"] >= 1 and status["running"] >= 1:
            os.killpg(proc.pid, signal.SIGKILL)
            killed = True
            break
        time.sleep(0.1)
    proc.wait()
    return killed


def conversion_counter(path_expr: str) -> str:
    """Python source, run first in a process (a driver script, or a sitecustomize), that wraps
    checks.validate and checks.typed to count their conversions of a config not typed yet (validate
    calls typed, so do others) and writes the counts as JSON at exit to the file `path_expr` (a
    Python expression) names. Wrapped before bertaccel.run is imported, so every caller, a lazy
    import too, calls the counted ones (tests/test_typed_once.py, tests/test_typed_runs.py)."""
    import textwrap

    return textwrap.dedent(f"""
        import atexit, json, os
        import bertaccel.options.checks as checks
        from bertaccel.config import RunConfig

        counts = {{"validate": 0, "typed": 0}}

        def counted(name):
            original = getattr(checks, name)

            def call(cfg, *args, **kwargs):
                counts[name] += not isinstance(cfg, RunConfig)
                return original(cfg, *args, **kwargs)
            setattr(checks, name, call)

        counted("validate")
        counted("typed")
        where = {path_expr}
        atexit.register(lambda: open(where, "w").write(json.dumps(counts)))
    """)
