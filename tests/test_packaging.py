"""A plain (non-editable) install works: the wheel carries the configs and the studies, and the
CLI runs from any directory with nothing of the checkout on the path."""
from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

# Every test here starts a real process (the CLI, a script, a server) or trains: slow (docs/contributing.md).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
# What the wheel is built from; the rest of the checkout (tests, notebooks, .git) stays out.
SOURCES = ("pyproject.toml", "README.md", "bertaccel", "hydra_plugins")


def _sh(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert p.returncode == 0, f"{' '.join(map(str, cmd))} -> {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


def test_wheel_in_a_fresh_venv_runs_from_another_directory(tmp_path):
    src = tmp_path / "src"
    for name in SOURCES:
        s = ROOT / name
        if s.is_dir():
            shutil.copytree(s, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy(s, src / name)
    wheels = tmp_path / "wheels"
    _sh([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "-w", str(wheels), str(src)], timeout=300)
    (wheel,) = wheels.glob("bertaccel-*.whl")
    venv = tmp_path / "venv"
    # torch, transformers, hydra ... come from this interpreter's site-packages; bertaccel from the wheel.
    # Not `venv --system-site-packages`: made from a virtualenv's interpreter, that sees the *base*
    # interpreter's packages, not this one's (where the tests run in a venv, hydra was missing). A .pth
    # file naming this interpreter's site directories works from a venv and from a system Python; its
    # plain lines add the directories only (their .pth files, the checkout's editable hook among them,
    # are not run), and they come after the venv's own site-packages, so the wheel's bertaccel wins.
    _sh([sys.executable, "-m", "venv", "--without-pip", str(venv)], timeout=120)
    py = venv / "bin" / "python"
    purelib = _sh([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], timeout=60).stdout.strip()
    ours = [d for d in site.getsitepackages() + [site.getusersitepackages()] if Path(d).is_dir()]
    (Path(purelib) / "outer_site_packages.pth").write_text("\n".join(ours) + "\n")
    _sh([sys.executable, "-m", "pip", "--python", str(py), "install", "--quiet", "--no-deps", str(wheel)], timeout=300)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    where = _sh([str(py), "-c", "import bertaccel, hydra_plugins.bertaccel_launcher as l; "
                                "print(bertaccel.__file__); print(l.__file__)"],
                cwd=elsewhere, env=env, timeout=120).stdout.split()
    assert all(Path(p).resolve().is_relative_to(venv.resolve()) for p in where), where  # the wheel's, not a checkout's

    p = subprocess.run([str(py), "-m", "bertaccel.run", "model=tiny", "train.device=cpu", "dataset.train_subset=32",
                        "dataset.test_subset=16", "train.batch_size=16", "train.max_steps_per_epoch=2",
                        f"tracking.uri=sqlite:///{tmp_path / 'm.db'}", f"cache_dir={tmp_path / 'cache'}"],
                       cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "test_accuracy=" in p.stdout
    # the studies came along too, found by name (hydra_plugins/bertaccel_searchpath, also in the wheel)
    study = _sh([str(py), "-m", "bertaccel.run", "--config-name", "thesis_grid", "--cfg", "job"],
                cwd=elsewhere, env=env, timeout=120).stdout
    assert "hub_id: stanfordnlp/imdb" in study
