"""Every command the README shows runs, as written: here, or in .ci/run (the installs, the tests).

The commands are read from the README's ```bash blocks, so a command changed there is the command
run here, and a command added there without a test fails `test_every_readme_command_runs`.
The report, plan and UI commands read the real store of the README's sweep (one H200, 2026-11-27:
`tests/data/h200_card_sweep.db.gz`: the default job, then the sweep, whose summary the README prints), since a CPU
cannot run that sweep.
"""
from __future__ import annotations

import gzip
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
from services import free_port, mlflow_service

ROOT = Path(__file__).resolve().parent.parent
CARD_STORE = ROOT / "tests" / "data" / "h200_card_sweep.db.gz"
# A user's environment: offline (as .ci/run), and without the Triton interpreter conftest.py turns on
# for the kernel tests (with it, attention=triton would train on a CPU in the interpreter).
ENV = {**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, "HF_HUB_OFFLINE": "1",
       "HF_DATASETS_OFFLINE": "1"}
# The kinds of command a test below runs, by how the command starts; the installs and the test
# command are .ci/run's.
HERE = ("python -m bertaccel.doctor", "python -m bertaccel.run", "python -m bertaccel.report", "python -m bertaccel.plan",
        "mlflow ui")
IN_CI = ("pip install", "python -m pytest")


def readme_commands() -> List[str]:
    """The command lines of the README's ```bash blocks, comments stripped."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    lines = (line.split(" #")[0].strip() for block in blocks for line in block.splitlines())
    return [line for line in lines if line]


def command(prefix: str) -> List[str]:
    """The README's one command that starts with prefix, as argv (python -> this interpreter)."""
    found = [c for c in readme_commands() if c.startswith(prefix)]
    assert len(found) == 1, f"expected one README command starting {prefix!r}, found {found}"
    argv = shlex.split(found[0])
    return [sys.executable, *argv[1:]] if argv[0] == "python" else argv


def test_every_readme_command_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    cmds = readme_commands()
    assert len(cmds) >= 7, cmds
    for cmd in cmds:
        if cmd.startswith(IN_CI):
            assert f"python -m {cmd}" in ci or cmd in ci, f".ci/run does not run the README's {cmd!r}"
        else:
            assert cmd.startswith(HERE), f"the README's {cmd!r} is run by no test: add it to tests/test_readme.py"
    # the README's default job and sweep are distinct commands (the sweep has -m)
    assert command("python -m bertaccel.run -m")[3] == "-m"


@pytest.mark.slow
def test_the_readme_doctor_line_runs(tmp_path):
    """The install's check, as the README writes it: exit 0 on a machine without a GPU, which it
    says (tests/test_doctor.py checks each line against the machine)."""
    p = subprocess.run(command("python -m bertaccel.doctor"), cwd=tmp_path, env=ENV, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    import torch
    assert re.search(rf"^torch\s+{re.escape(torch.__version__)}\b", p.stdout, re.M), p.stdout


@pytest.fixture(scope="module")
def readme_dir(tmp_path_factory) -> Path:
    """Where a user follows the README: its default job first, then its sweep, in one directory
    (one store), as the README orders them."""
    return tmp_path_factory.mktemp("readme")


@pytest.mark.slow
def test_the_readme_default_job_trains_to_its_accuracy(readme_dir):
    """The first command a user runs: the real pretrained MiniLM on the bundled AG News sample, one
    epoch, on this machine's CPU (about 5 minutes on 2 cores)."""
    argv = [c for c in readme_commands() if c.startswith("python -m bertaccel.run")]
    assert "python -m bertaccel.run" in argv, argv
    p = subprocess.run([sys.executable, "-m", "bertaccel.run"], cwd=readme_dir, env=ENV, capture_output=True,
                       text=True, timeout=1800)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    m = re.search(r"^test_accuracy=([\d.]+) train_time_s=([\d.]+) mlflow_run_id=\w+ \(store sqlite:///mlflow.db, "
                  r"experiment bertaccel\)$", p.stdout, re.M)
    assert m, p.stdout[-2000:]
    assert float(m.group(1)) >= 0.85, m.group(0)  # the README shows 0.8931; 4 classes, chance is 0.25
    assert (readme_dir / "mlflow.db").is_file()


@pytest.mark.slow
def test_the_readme_sweep_records_every_run(readme_dir):
    """On a GPU it trains the four runs; on a CPU each is recorded skipped with its reason. Its
    baseline (the config groups' defaults, which none of the four has) is the default job the user
    ran first: found in the store and not trained again (without it, on a CPU, the baseline is not
    trained: nothing to compare it with)."""
    ran_first = (readme_dir / "mlflow.db").is_file()  # (the default job's test ran before this one)
    p = subprocess.run(command("python -m bertaccel.run -m"), cwd=readme_dir, env=ENV, capture_output=True,
                       text=True, timeout=1800)
    summary = p.stdout[p.stdout.index("== sweep summary =="):]
    rows = re.findall(r"^\d+\s+(precision=\S+)\s+(finished|skipped|failed)\s", summary, re.M)
    assert sorted(r for r, _ in rows) == sorted(f"precision={p},attention={a}" for p in ("fp16", "fp32")
                                                for a in ("xformers", "triton")), summary
    assert "[sweep] baseline added: the config groups' defaults" in p.stdout
    # The default job run first in this directory is the sweep's baseline: found, not trained again.
    import torch
    baseline = "already_finished" if ran_first else "finished" if torch.cuda.is_available() else "skipped"
    assert re.search(rf"^\d+\s+defaults\s+{baseline}\s", summary, re.M), summary
    if torch.cuda.is_available():
        assert p.returncode == 0, summary
        assert {s for _, s in rows} == {"finished"}, summary
    else:
        assert {s for _, s in rows} == {"skipped"}, summary
        assert "needs a CUDA GPU" in summary
        # Exit 1: none of the configurations asked for ran; the added baseline does not count (the README says so).
        assert p.returncode == 1, summary
        assert ("none of the requested configurations finished" in p.stdout) == ran_first, summary
    assert "sweep id config-" in summary


@pytest.fixture
def card_store(tmp_path) -> Path:
    """The README sweep's store (a real H200 run), as mlflow.db in a directory of its own."""
    with gzip.open(CARD_STORE) as src, open(tmp_path / "mlflow.db", "wb") as dst:
        shutil.copyfileobj(src, dst)
    return tmp_path


@pytest.mark.slow
def test_the_readme_report_names_the_winner_it_shows(card_store):
    p = subprocess.run(command("python -m bertaccel.report"), cwd=card_store, env=ENV, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    readme = (ROOT / "README.md").read_text()
    winners = set(re.findall(r" best: (.+)$", p.stdout, re.M))
    assert winners and all(f" best: {w}" in readme for w in winners), p.stdout
    html = (card_store / "report" / "report.html").read_text()
    assert "config-b32a167b41" in html and "H200" in html.upper()
    # Its baseline is the default job run before the sweep, which the sweep took as its own: of
    # the sweep for the comparability gate, so no 'not like for like' warning.
    assert "not like for like" not in (card_store / "report" / "report.md").read_text()


@pytest.mark.slow
def test_the_readme_plan_predicts_each_run(card_store):
    p = subprocess.run(command("python -m bertaccel.plan"), cwd=card_store, env=ENV, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    table = p.stdout[p.stdout.index("== Predicted time, cost and energy"):]
    for prec in ("fp16", "fp32"):
        for attn in ("xformers", "triton"):
            assert re.search(rf"^\d+\s+precision={prec},attention={attn}\s+1\s+1 x 6000\s+188\s", table, re.M), table


@pytest.mark.slow
def test_the_readme_ui_serves_the_sweep(card_store):
    """`mlflow ui` as the README writes it, on a free local port, lists the sweep's runs."""
    argv = command("mlflow ui") + ["--host", "127.0.0.1", "--port", str(free_port())]
    argv[0] = shutil.which("mlflow") or argv[0]
    with mlflow_service(argv, card_store / "mlflow-ui.log", start_timeout_s=120, stop_wait_s=60, cwd=card_store,
                        env=ENV) as url:
        from mlflow import MlflowClient
        client = MlflowClient(tracking_uri=url)
        exp = client.get_experiment_by_name("bertaccel")
        runs = client.search_runs([exp.experiment_id], "tags.sweep_id = 'config-b32a167b41'")
        assert len(runs) >= 4, [r.info.run_name for r in runs]
