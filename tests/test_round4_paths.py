"""Nothing lost, round 4 (issue 59, item 2): nothing written where the user did not point. Every
path bertaccel writes to by default goes through one expansion (option.user_path: `~` and
environment variables, then absolute): no folder named `~` in the working directory, and the plan
a sweep saves is found again from any directory. HOME is a temporary folder in every test."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bertaccel.config import CompileConfig, RunConfig
from bertaccel.data.cache import entry_path
from bertaccel.option import user_path
from bertaccel.options.cache_dir import check_cache_dir
from bertaccel.plan.probe import cache_path
from bertaccel.plan.saved import plan_path, read_plan
from bertaccel.record.tracking import search_runs
from bertaccel.report.folder import check_folder, new_temporary, write_folder
from bertaccel.runs.bytecode import default_prefix
from bertaccel.train.compile_cache import compile_caches
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
SWEEP = ["model=tiny", "train.device=cpu", "train.seed=1,2", "dataset.train_subset=32", "dataset.test_subset=16",
         "train.batch_size=16"]


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """HOME a temporary folder, XDG_CACHE_HOME unset, the working directory another one."""
    home, cwd = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("BERTACCEL_TEST_ROOT", str(tmp_path / "from_var"))
    monkeypatch.chdir(cwd)
    (home / "reports").mkdir()
    (tmp_path / "from_var").mkdir()
    return home


def test_every_default_write_location_is_expanded_and_absolute(home):
    default = RunConfig().cache_dir
    assert default.startswith("~")  # (what the test is about: a default that needs expanding)
    with compile_caches(default, CompileConfig(cache="persistent"), torch.device("cpu")) as ccache:
        compile_root = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]).parent
    del ccache
    locations = {
        "the saved plan": plan_path(default, "config-0123456789"),
        "a probe's cache": cache_path(default, {"gpu": "cpu"}, {"k": 1}),
        "parsed data": entry_path(default, "raw", "key", ".pkl"),
        "tokenized data": entry_path(default, "tokens", "key", ".pt"),
        "compiled kernels": compile_root,
        "bytecode": user_path(default_prefix()),
        "a report's --out": check_folder("~/reports/r1", "report"),
        "a plan's --out": check_folder("$BERTACCEL_TEST_ROOT/plan", "plan"),
        "cache_dir from a variable": plan_path("$BERTACCEL_TEST_ROOT/cache", "s"),
    }
    for what, path in locations.items():
        assert path.is_absolute() and "~" not in path.parts and "$" not in str(path), (what, path)
        assert str(path).startswith((str(home), os.environ["BERTACCEL_TEST_ROOT"])), (what, path)
    assert compile_root.is_dir() and str(compile_root).startswith(str(home / ".cache" / "bertaccel" / "compile"))
    assert not list(Path.cwd().iterdir())  # nothing in the working directory, no `~` folder


def test_a_cache_dir_naming_an_unset_variable_is_refused_in_one_line(home):
    cfg = RunConfig()
    cfg.cache_dir = "$BERTACCEL_NOT_SET_ANYWHERE/cache"
    assert check_cache_dir(cfg) == ("cache_dir=$BERTACCEL_NOT_SET_ANYWHERE/cache: the environment variable "
                                    "BERTACCEL_NOT_SET_ANYWHERE is not set; set it, or give a folder")


@pytest.mark.slow
def test_the_plan_cli_saves_under_home_and_a_lookup_from_another_directory_finds_it(home, tmp_path, monkeypatch):
    here = tmp_path / "here"
    here.mkdir()
    store = tmp_path / "m.db"
    r = warm_cli.run([sys.executable, "-m", "bertaccel.plan", *SWEEP, f"tracking.uri=sqlite:///{store}"],
                     cwd=here, env={**ENV, "HOME": str(home)}, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert not (here / "~").exists() and not [p for p in here.rglob("*") if p.name == "~"]
    saved = list((home / ".cache" / "bertaccel" / "plan").glob("*.json"))
    assert len(saved) == 1 and f"plan saved for the sweep's runs: {saved[0]}" in r.stdout, r.stdout[-2000:]
    # A sweep's run reads it with its own cache_dir (the default) from wherever it was started.
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert len(read_plan(RunConfig().cache_dir, saved[0].stem)) == 2
    # The sweep itself, from another directory, its Hydra folder given as ~/sweeps: its runs log
    # the plan's predictions, and neither directory gets a `~` folder.
    r = warm_cli.run([sys.executable, "-m", "bertaccel.run", "-m", *SWEEP, f"tracking.uri=sqlite:///{store}",
                      "hydra.sweep.dir='~/sweeps/s1'"],
                     cwd=tmp_path / "elsewhere", env={**ENV, "HOME": str(home)}, capture_output=True, text=True,
                     timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    runs = [x for x in search_runs(f"sqlite:///{store}", "bertaccel") if x.data.tags.get("bertaccel.role") != "sweep"]
    assert len(runs) == 2 and all(x.data.tags["prediction_basis"].startswith("bertaccel.plan before the sweep")
                                  for x in runs), [x.data.tags.get("prediction_basis") for x in runs]
    assert (home / "sweeps" / "s1" / "multirun.yaml").is_file()
    assert not [p for p in tmp_path.rglob("*") if p.name == "~"]


# ---------------------------------------------------------------------------------------------
# A report's temporary folder left by a writer killed mid-write is removed by a later report, a
# live writer's is not; the glance page is written only where --out says.

def test_a_later_report_removes_a_dead_writers_temporary_folder_and_keeps_a_live_ones(tmp_path):
    made = subprocess.run([sys.executable, "-c", "import os, sys; from pathlib import Path; "
                           "from bertaccel.report.folder import new_temporary; "
                           "t = new_temporary(Path(sys.argv[1]), 'report'); (t / 'report.md').write_text('half'); "
                           "print(t); os._exit(9)", str(tmp_path)],  # (as kill -9 leaves it: no clean-up)
                          env=ENV, capture_output=True, text=True, timeout=120)
    dead = Path(made.stdout.strip())
    assert made.returncode == 9 and dead.is_dir() and dead.name.startswith(".report-"), made.stderr[-2000:]
    live = new_temporary(tmp_path, "report")  # this process's: a concurrent writer, alive
    aside = tmp_path / ".report-old-12345"  # an earlier output set aside in a swap: maybe the only copy
    aside.mkdir()
    write_folder(str(tmp_path / "r"), "report", {"report.md": "whole"}, [])
    assert not dead.exists() and live.is_dir() and aside.is_dir()
    assert (tmp_path / "r" / "report.md").read_text() == "whole"


@pytest.mark.slow
def test_glance_without_out_is_one_line_and_writes_nothing(tmp_path):
    page = Path(__file__).resolve().parents[1] / "docs" / "results" / "at-a-glance.md"
    before = (page.read_bytes(), page.stat().st_mtime_ns)
    r = warm_cli.run([sys.executable, "-m", "bertaccel.report.glance"], cwd=tmp_path, env=ENV,
                     capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--out" in r.stderr, (r.returncode, r.stderr)
    assert (page.read_bytes(), page.stat().st_mtime_ns) == before and not list(tmp_path.iterdir())
