"""A sweep that compiles has its forkserver import Inductor once (runs/preload.py), so its compiled
runs do not each import it (0.8-0.9 s of a later compiled run's start-up on an H200 host): which
command lines count as compiling, and what a run forked from such a server finds."""
import os
import subprocess
import sys

import pytest

from bertaccel.config import CONF_DIR
from bertaccel.plan.grid import expand
from bertaccel.runs.forkserver import compiles


@pytest.mark.parametrize("argv,expected", [
    (["compile=default"], True),
    (["compile=off"], False),
    (["compile=off,default"], True),
    (["compile.mode=max-autotune"], True),
    (["+compile=choice(off,reduce-overhead)"], True),
    (["compile='off'"], False),
    (["precision=fp16,fp32", "attention=sdpa"], False),
    ([], False),
])
def test_which_command_lines_compile(argv, expected):
    assert compiles(argv) is expected


@pytest.mark.slow  # several seconds on one core: the full suite runs it, the inner loop does not
@pytest.mark.parametrize("preset", sorted(p.stem for p in (CONF_DIR / "preset").glob("*.yaml")))
def test_a_preset_compiles_when_its_composed_config_does(preset):
    # The check reads the preset's file before Hydra runs; Hydra's composition is the truth.
    cfg = expand("config", [f"preset={preset}"]).configs[0].cfg
    assert compiles([f"preset={preset}"]) is (cfg.compile.mode != "off")


SCRIPT = """
import sys
import multiprocessing as mp


def look(q):
    import torch
    q.put(("torch._inductor.compile_fx" in sys.modules, "transformers" in sys.modules, torch.cuda._is_in_bad_fork()))


if __name__ == "__main__":
    from bertaccel.runs.forkserver import start_early
    start_early(sys.argv[1:])
    ctx = mp.get_context("forkserver")
    q = ctx.SimpleQueue()
    p = ctx.Process(target=look, args=(q,))
    p.start()
    print(q.get())
    p.join()
"""


@pytest.mark.slow
def test_a_run_forked_from_a_compiling_sweeps_server_finds_inductor_imported(tmp_path):
    script = tmp_path / "fork_child.py"
    script.write_text(SCRIPT)
    found = {}
    for argv in (["compile=off,default"], ["compile=off"]):
        env = {k: v for k, v in os.environ.items() if k != "BERTACCEL_PRELOAD_COMPILE"}
        out = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, timeout=300, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        found[argv[0]] = out.stdout.strip().splitlines()[-1]
    # Inductor in the child only where the sweep compiles; the preload's other modules in both; and
    # the child may still start CUDA (Inductor's import asked torch.cuda.is_available through NVML).
    assert found["compile=off,default"] == "(True, True, False)"
    assert found["compile=off"] == "(False, True, False)"
