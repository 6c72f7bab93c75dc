"""python -m bertaccel.doctor, run as a user runs it (a real process) on this machine: its lines say
what this machine has, as torch, xFormers' load check and the runs' own skip checks say it; and
docs/getting-started.md shows the same items and xFormers' one build line."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bertaccel.attention.kernels.xformers import XFORMERS_INSTALL
from bertaccel.config import CONF_DIR
from bertaccel.doctor.lines import Line, checked
from bertaccel.doctor.options import PRESETS, machine_checked_groups
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "getting-started.md"
ITEMS = ("python", "bertaccel", "gpu", "torch", "triton", "xformers", "nvml", "rapl", "options")
# A user's environment: without the Triton interpreter conftest.py turns on for the kernel tests
# (with it, attention=triton would count as runnable on a CPU).
ENV = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


def doctor(*args: str) -> subprocess.CompletedProcess:
    return warm_cli.run([sys.executable, "-m", "bertaccel.doctor", *args], cwd=ROOT, env=ENV,
                        capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def said() -> str:
    p = doctor()
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout


def item_line(out: str, item: str) -> str:
    found = [line for line in out.splitlines() if re.match(rf"{re.escape(item)}\s", line)]
    assert found, f"no {item!r} line in:\n{out}"
    return found[0]


def fix_after(out: str, line: str) -> str:
    """The `fix:` line printed under `line` ('' when there is none)."""
    lines = out.splitlines()
    below = lines[lines.index(line) + 1] if lines.index(line) + 1 < len(lines) else ""
    return below.strip() if below.strip().startswith("fix: ") else ""


@pytest.mark.slow
def test_the_doctor_says_what_torch_and_the_gpu_are(said):
    assert re.match(rf"torch\s+{re.escape(torch.__version__)}\s", item_line(said, "torch"))
    assert f"cuda available: {torch.cuda.is_available()}" in item_line(said, "torch")
    assert item_line(said, "python").split()[1] == sys.version.split()[0]
    if torch.cuda.is_available():
        gpu0 = item_line(said, "gpu 0")
        assert torch.cuda.get_device_name(0) in gpu0
        assert "capability %d.%d" % torch.cuda.get_device_capability(0) in gpu0
    else:
        gpu = item_line(said, "gpu")
        assert gpu.startswith("gpu        no CUDA GPU"), gpu
        assert fix_after(said, gpu).startswith("fix: "), said  # what to do on a GPU machine
        assert re.match(r"triton\s+\S+\s+interpreter only \(no CUDA GPU\)", item_line(said, "triton"))


@pytest.mark.slow
def test_the_doctor_gives_xformers_reason_and_its_build_line(said):
    """The line is xFormers' own load check, as a run's skip reason says it; where xFormers does
    not run it names the one build line (attention/kernels/xformers.py XFORMERS_INSTALL)."""
    from bertaccel.attention.kernels.xformers import xformers_unusable

    line = item_line(said, "xformers")
    why = xformers_unusable(torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu"))
    if why is None:
        assert "loads with torch" in line, line
    else:
        assert line == f"xformers   {why}", line
        assert XFORMERS_INSTALL in line or fix_after(said, line) == f"fix: {XFORMERS_INSTALL}", said


@pytest.mark.slow
def test_the_doctor_lists_every_option_with_its_verdict(said):
    """One line per option of each machine-checked group and per preset, as conf/ has them; on a
    CPU the GPU-only ones are skipped with the run's own reason."""
    lines = said.splitlines()
    head = lines.index(item_line(said, "options"))
    verdicts = dict(re.match(r"\s+(\S+)\s+(runs|skipped: .+)$", line).groups() for line in lines[head + 1:])
    on_disk = {f"{group}={p.stem}" for group in machine_checked_groups() + [PRESETS]
               for p in (CONF_DIR / group).glob("*.yaml")}
    assert set(verdicts) == on_disk
    assert {"precision", "compile", "attention", "encoder", "optimizer"} <= set(machine_checked_groups())
    runs = sum(v == "runs" for v in verdicts.values())
    assert f"{runs} of {len(verdicts)} run here" in lines[head]
    assert verdicts["precision=fp32"] == verdicts["attention=eager"] == "runs"
    if not torch.cuda.is_available():
        for name in ("precision=fp16", "attention=triton", "encoder=fused", "compile=reduce-overhead",
                     "optimizer=adamw_fused", "preset=seed001_k4_amp"):
            assert verdicts[name].startswith("skipped: ") and "CUDA GPU" in verdicts[name], (name, verdicts[name])
        assert verdicts["attention=xformers"].startswith("skipped: attention=xformers")


@pytest.mark.slow
def test_every_item_is_one_aligned_line_and_what_is_missing_names_its_fix(said):
    lines = said.splitlines()
    assert list(dict.fromkeys(line.split()[0] for line in lines if not line.startswith(" "))) == list(ITEMS)
    for line in lines:
        assert line[10] == " " and line[11] != " " or line.startswith(" " * 11), f"not aligned: {line!r}"
    for item in ("gpu", "nvml", "rapl", "triton", "xformers"):
        line = next((ln for ln in lines if re.match(rf"{item}( \d+)?\s", ln)), "")
        if re.search(r"no CUDA GPU \(no NVIDIA|not installed|cannot|unavailable|not readable|does not load", line):
            assert fix_after(said, line) or "pip install" in line or "run as root" in line, line


@pytest.mark.slow
def test_a_wrong_argument_is_one_line():
    p = doctor("--gpu")
    assert p.returncode == 2 and p.stdout == "", p
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("error: unrecognized arguments: --gpu"), p.stderr


def test_a_check_that_breaks_is_one_line_and_marks_the_run():
    def broken():
        raise OSError("the driver went away\nsecond line")

    (line,) = checked("nvml", broken)
    assert line.broken and line.text == "could not check: OSError: the driver went away"
    assert line.render()[1].startswith(" " * 11 + "fix: ")
    assert checked("rapl", lambda: [Line("rapl", "fine")]) == [Line("rapl", "fine")]


@pytest.mark.slow
def test_the_guide_shows_the_doctors_lines_and_xformers_one_build_line(said):
    """The guide's CPU and GPU outputs have every item and every option the doctor prints (a new item
    or option makes them stale: run the doctor again and paste), and its xFormers build line is the
    code's, word for word."""
    page = GUIDE.read_text()

    def options(lines):
        return {line.split()[0] for line in lines if re.match(r"\s+\S+=\S+\s+(runs|skipped)", line)}

    for tab in ("cpu", "gpu"):
        shown = re.search(rf"<!-- doctor-output-{tab} -->\n\n\s*```text\n(.*?)```", page, re.S)
        assert shown, f"docs/getting-started.md has no <!-- doctor-output-{tab} --> block"
        shown_lines = [line[4:] for line in shown.group(1).splitlines()]  # (the tab's four-space indent)
        for item in ITEMS:
            assert any(re.match(rf"{item}\s", line) for line in shown_lines), (tab, item)
        assert options(shown_lines) == options(said.splitlines()), tab
    # The line a user copies, in a bash block (the CPU output above quotes it too, in xFormers' reason).
    blocks = (re.sub(r"\\\n\s*", "", block) for block in re.findall(r"```bash\n(.*?)```", page, re.S))  # (a \ goes on)
    commands = [line.strip() for block in blocks for line in block.splitlines()]
    assert XFORMERS_INSTALL.split("  (")[0] in commands
