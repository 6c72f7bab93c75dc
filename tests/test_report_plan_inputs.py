"""What a user gives `python -m bertaccel.report` and `python -m bertaccel.plan` (issue 24): an
--out that is not bertaccel's own folder is never replaced, every number is finite and in range,
and every bad path, filter, CSV or weight is one line `error: ...`, exit 2, with nothing written
and nothing deleted. Real processes of the real CLIs, real files, a real SQLite MLflow store."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import pytest
from report_store import Store
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

# Every test here starts a real process (the CLI, a script, a server) or trains: slow (docs/contributing.md).
pytestmark = pytest.mark.slow

HEADER = "name,time_s,cost_usd,energy_kwh,occupancy_pct,accuracy"
GOOD_CSV = f"{HEADER}\nslow,100,0.1,0.02,40,0.90\nfast,50,0.06,0.01,45,0.89\n"
MARKER = ".bertaccel-output"
QUOTED_SWEEP = "o'neil-0123456789"  # a sweep id with a quote, as a study file named o'neil.yaml gives


def _run(module: str, args: List[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return warm_cli.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True,
                        timeout=timeout, env=env)


def _report(args: List[str], cwd: Path) -> subprocess.CompletedProcess:
    return _run("bertaccel.report", args, cwd)


def _plan(args: List[str], cwd: Path) -> subprocess.CompletedProcess:
    # a store path that does not exist: the plan reads none (and must create none)
    return _run("bertaccel.plan", ["--config-name", "quick", "accumulation=1", "optimizer=adamw", "train.epochs=1",
                                   f"tracking.uri=sqlite:///{cwd / 'none.db'}", f"cache_dir={cwd / 'cache'}", *args],
                cwd)


def _tree(root: Path) -> Dict[str, Optional[bytes]]:
    """Every entry under root: file -> its bytes, folder -> None, link -> where it points."""
    out: Dict[str, Optional[bytes]] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = os.readlink(p).encode()
        elif p.is_dir():
            out[rel] = None
        else:
            out[rel] = p.read_bytes()
    return out


def _refused(r: subprocess.CompletedProcess, starts: str) -> str:
    """The one stderr line of a refusal (exit 2, no traceback), which must start with `starts`."""
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert lines[0].startswith(starts), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    """A directory holding a real MLflow store as `bertaccel.run` leaves one: mlflow.db and
    mlartifacts/ (with a file), two finished runs of sweep sw1 and one of QUOTED_SWEEP."""
    d = tmp_path_factory.mktemp("store")
    store = Store(d)
    metrics = {"train_time_s": 10.0, "cost_usd": 0.01, "energy_kwh": 0.001, "occupancy_pct": 40.0,
               "test_accuracy": 0.9}
    store.log("r0", {"precision": "fp32"}, metrics, {"sweep_id": "sw1"})
    store.log("r1", {"precision": "fp32"}, {**metrics, "train_time_s": 12.0}, {"sweep_id": "sw1"})
    store.log("q0", {"precision": "fp32"}, metrics, {"sweep_id": QUOTED_SWEEP})
    (d / "mlartifacts" / "0").mkdir(parents=True)
    (d / "mlartifacts" / "0" / "config.yaml").write_text("train:\n  epochs: 1\n")
    lock = d / "mlflow.db.lock"  # left by the store lock of the runs' writes; not the report's business
    if lock.exists():
        lock.unlink()
    return d


# --- --out: only ever over a folder bertaccel wrote --------------------------------------------

@pytest.mark.parametrize("out,shown", [(".", "."), ("", "''"), ("{store}", "{store}"), ("mlartifacts/..", "mlartifacts/..")])
def test_out_naming_the_store_directory_deletes_nothing(store_dir, out, shown):
    before = {k: v for k, v in _tree(store_dir).items() if not k.endswith(".lock")}
    r = _report(["--uri", "sqlite:///mlflow.db", "--out", out.format(store=store_dir)], store_dir)
    _refused(r, f"error: --out {shown.format(store=store_dir)}: ")
    after = {k: v for k, v in _tree(store_dir).items() if not k.endswith(".lock")}
    assert after == before  # mlflow.db byte for byte, mlartifacts/ and nothing new (no report, no temp folder)


def test_out_naming_a_folder_that_holds_the_store_is_refused(store_dir, tmp_path):
    proj = tmp_path / "proj"
    shutil.copytree(store_dir, proj)
    before = _tree(tmp_path)
    r = _report(["--uri", "sqlite:///proj/mlflow.db", "--out", "proj"], tmp_path)
    line = _refused(r, "error: --out proj: exists and is not a folder bertaccel wrote")
    assert "choose a new folder name" in line
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("out,starts", [
    ("..", "error: --out ..: is the current directory or one that holds it"),
    ("runs.csv", "error: --out runs.csv: is a file, not a folder"),
    ("mine", "error: --out mine: exists and is not a folder bertaccel wrote"),
    ("empty", "error: --out empty: exists and is not a folder bertaccel wrote"),
    ("link", "error: --out link: is a symbolic link"),
    ("nodir/rep", "error: --out nodir/rep: its parent "),
    ("runs.csv/rep", "error: --out runs.csv/rep: its parent "),
])
def test_out_that_is_not_a_new_or_bertaccel_folder_is_one_line_and_nothing_changes(tmp_path, out, starts):
    work = tmp_path / "work"  # so that '..' is a folder of the test's own
    work.mkdir()
    (work / "runs.csv").write_text(GOOD_CSV)
    (work / "mine").mkdir()
    (work / "mine" / "notes.txt").write_text("mine")
    (work / "empty").mkdir()
    (work / "link").symlink_to("mine")
    before = _tree(tmp_path)
    _refused(_report(["--csv", "runs.csv", "--out", out], work), starts)
    assert _tree(tmp_path) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write in a folder without write permission")
def test_out_in_a_folder_that_is_not_writable_is_one_line(tmp_path):
    (tmp_path / "runs.csv").write_text(GOOD_CSV)
    (tmp_path / "ro").mkdir()
    os.chmod(tmp_path / "ro", 0o555)
    try:
        _refused(_report(["--csv", "runs.csv", "--out", "ro/rep"], tmp_path), "error: --out ro/rep: its parent ")
        assert list((tmp_path / "ro").iterdir()) == []
    finally:
        os.chmod(tmp_path / "ro", 0o755)


def test_a_report_folder_is_replaced_whole_but_not_once_the_user_put_something_in_it(tmp_path):
    (tmp_path / "runs.csv").write_text(GOOD_CSV)
    r = _report(["--csv", "runs.csv", "--out", "rep"], tmp_path)
    assert r.returncode == 0, r.stderr
    listed = (tmp_path / "rep" / MARKER).read_text().splitlines()
    assert listed[0] == "bertaccel report output folder"
    assert {"report.md", "report.html", "plots/", "plots/pareto_front.png"} <= set(listed)
    # The user moves the store (or anything) into the old report folder: it is not replaced.
    (tmp_path / "rep" / "mlflow.db").write_bytes(b"SQLite format 3\x00" + bytes(100))
    before = _tree(tmp_path)
    line = _refused(_report(["--csv", "runs.csv", "--out", "rep"], tmp_path), "error: --out rep: holds 1 thing(s)")
    assert "mlflow.db" in line
    assert _tree(tmp_path) == before
    # Taken out again, the folder is bertaccel's once more, and replaced whole (no temp folder left).
    (tmp_path / "rep" / "mlflow.db").unlink()
    (tmp_path / "runs.csv").write_text(GOOD_CSV.replace("slow", "slower"))
    r = _report(["--csv", "runs.csv", "--out", "rep"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "slower" in (tmp_path / "rep" / "report.md").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep", "runs.csv"]


def test_a_report_does_not_replace_a_plan_folder(tmp_path):
    # A plan folder as the plan writes it (its plan.csv is what `report --csv` reads).
    plan = tmp_path / "planout"
    (plan / "plots").mkdir(parents=True)
    (plan / "plan.csv").write_text(GOOD_CSV)
    (plan / MARKER).write_text("bertaccel plan output folder\nplots/\nplan.csv\n")
    before = _tree(tmp_path)
    _refused(_report(["--csv", "planout/plan.csv", "--out", "planout"], tmp_path),
             "error: --out planout: holds a bertaccel plan, not a report")
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("out,starts", [(".", "error: --out .: is the current directory"),
                                        ("", "error: --out '': give a folder name")])
def test_plan_out_that_is_the_current_directory_or_empty_is_refused(tmp_path, out, starts):
    (tmp_path / "keep.txt").write_text("the user's")
    _refused(_plan(["--out", out], tmp_path), starts)
    assert _tree(tmp_path) == {"keep.txt": b"the user's"}  # nothing deleted, no store, no cache, no plan


# --- numbers: finite and in range ------------------------------------------------------------

@pytest.mark.parametrize("args,starts", [
    (["--weights", "a=nan,1,0,0"], "error: --weights 'nan,1,0,0' w1: 'nan' is not a finite number"),
    (["--weights", "a=1,inf,0,0"], "error: --weights '1,inf,0,0' w2: 'inf' is not a finite number"),
    (["--weights", "a=1,1,1,1,-inf"], "error: --weights '1,1,1,1,-inf' w5: '-inf' is not a finite number"),
    (["--weights", "a=1e308,1e308,1e308,0"], "error: --weights '1e308,1e308,1e308,0': too large to add up"),
    (["--weights", "a=1,,1,1"], "error: --weights '1,,1,1' w2: '' is not a number"),
    (["--weights", "balance=1,1,1,1"], "error: --weights balance=1,1,1,1: there is already a strategy balance"),
    (["--weights", "a=1,1,1,1", "--weights", "a=0,1,1,1"], "error: --weights a=0,1,1,1: there is already a strategy a"),
    (["--accuracy-floor", "nan"], "error: --accuracy-floor: 'nan' is not a finite number"),
    (["--accuracy-floor", "2"], "error: --accuracy-floor: '2' must be in [0, 1]"),
    (["--accuracy-floor", "-0.5"], "error: --accuracy-floor: '-0.5' must be in [0, 1]"),
    (["--accuracy-floor", "high"], "error: --accuracy-floor: 'high' is not a number"),
    (["--target-accuracy", "0.9x"], "error: --target-accuracy: '0.9x' is not a number"),
    (["--project-epochs", "1.5"], "error: --project-epochs: '1.5' is not a whole number > 0"),
    (["--project-epochs", "inf"], "error: --project-epochs: 'inf' is not a finite number"),
])
def test_a_number_that_is_not_finite_or_in_range_is_one_line_and_nothing_written(tmp_path, args, starts):
    (tmp_path / "runs.csv").write_text(GOOD_CSV)
    _refused(_report(["--csv", "runs.csv", *args, "--out", "rep"], tmp_path), starts)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.csv"]


# --- the rest of what a user types ------------------------------------------------------------

@pytest.mark.parametrize("args,starts", [
    (["--nosuch"], "error: unrecognized arguments: --nosuch"),
    (["--time", "wall"], "error: argument --time: invalid choice: 'wall'"),
    (["--experiment", "x"], "error: argument --experiment: not allowed with argument --csv"),
    (["--baseline", ""], "error: --baseline '': give a value"),
    (["--csv", ""], "error: --csv '': give a value"),  # (was read as no --csv: the store in the cwd instead)
    (["--csv", "adir"], "error: --csv adir: is a folder"),
    (["--csv", "binary.csv"], "error: --csv binary.csv: not UTF-8 text"),
    (["--csv", "huge.csv"], "error: --csv huge.csv: not a readable CSV"),
])
def test_report_bad_argument_or_csv_is_one_line_and_nothing_written(tmp_path, args, starts):
    (tmp_path / "runs.csv").write_text(GOOD_CSV)
    (tmp_path / "adir").mkdir()
    (tmp_path / "binary.csv").write_bytes(HEADER.encode() + b"\n\xff\xfe\x00\x9c,1,1,1,1,1\n")
    (tmp_path / "huge.csv").write_text(f"{HEADER}\n{'x' * 200_000},1,1,1,1,1\n")  # over the csv module's limit
    before = _tree(tmp_path)
    _refused(_report(["--csv", "runs.csv", *args, "--out", "rep"] if args[0] != "--csv"
                     else [*args, "--out", "rep"], tmp_path), starts)
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("sweep,starts", [
    ("x'y", "error: no finished runs in sweep x'y of experiment bertaccel"),
    ("sw1' or '1'='1", "error: no finished runs in sweep sw1' or '1'='1 of experiment bertaccel"),
    ("a'b\"c", "error: --sweep a'b\"c: holds both ' and \""),
])
def test_a_quote_in_sweep_is_one_line_not_an_mlflow_traceback(store_dir, sweep, starts):
    before = {k: v for k, v in _tree(store_dir).items() if not k.endswith(".lock")}
    _refused(_report(["--uri", "sqlite:///mlflow.db", "--sweep", sweep, "--out", "rep"], store_dir), starts)
    assert {k: v for k, v in _tree(store_dir).items() if not k.endswith(".lock")} == before


def test_a_sweep_id_with_a_quote_is_found(store_dir, tmp_path):
    r = _report(["--uri", f"sqlite:///{store_dir / 'mlflow.db'}", "--sweep", QUOTED_SWEEP, "--out", "rep"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "q0" in md and "r0" not in md


@pytest.mark.parametrize("args,starts", [
    (["--hardware", ""], "error: --hardware '': give profile names"),  # (was: taken as not given)
    (["--config-dir", ""], "error: --config-dir '': give a folder of studies"),  # (was: taken as not given)
])
def test_plan_bad_argument_is_one_line_and_nothing_written(tmp_path, args, starts):
    _refused(_plan([*args, "--out", "planout"], tmp_path), starts)
    assert list(tmp_path.iterdir()) == []
