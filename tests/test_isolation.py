"""isolation.isolated_run: runs sharing the sweep's process (launcher=inline) start from a reset
dynamo; a run alone in its process (launcher=process) only seeds, and keeps what it has."""
from __future__ import annotations

import pytest
import torch

from bertaccel.train.isolation import isolated_run
from bertaccel.train.warmup import compiled_graph_count

# Every test here starts a real process (the CLI, a script, a server) or trains: slow (docs/contributing.md).
pytestmark = pytest.mark.slow


def _compiled_twice(shared_process: bool) -> int:
    """Graphs compiled by a second call of the same compiled function inside isolated_run."""
    torch.compiler.reset()
    f = torch.compile(lambda x: torch.sin(x) + 1, backend="eager")  # dynamo only: no C++ compiler needed
    x = torch.ones(3)
    f(x)
    before = compiled_graph_count()
    with isolated_run(seed=1, shared_process=shared_process):
        f(x)
        draw = torch.rand(1)
    torch.compiler.reset()
    torch.manual_seed(1)
    assert torch.equal(draw, torch.rand(1))  # seeded either way
    return compiled_graph_count() - before


def test_a_run_sharing_the_process_starts_from_reset_dynamo_caches():
    assert _compiled_twice(shared_process=True) == 1  # the earlier run's graph is gone: compiled again


def test_a_run_alone_in_its_process_is_not_reset():
    assert _compiled_twice(shared_process=False) == 0


def test_runs_sharing_a_process_that_compiled_nothing_skip_the_reset():
    """The reset is for compiled state: in a process where dynamo never ran (eager probes, an inline
    compile=off sweep) it is skipped, since on a GPU it imports Inductor (1-3 s) to clear empty caches.
    In a fresh interpreter: this test process's dynamo counters hold other tests' compiles."""
    import subprocess
    import sys

    script = """
import torch
from bertaccel.train.isolation import isolated_run
calls = []
real = torch.compiler.reset
torch.compiler.reset = lambda: (calls.append(1), real())[1]
for _ in range(2):
    with isolated_run(seed=1, shared_process=True):
        torch.nn.Linear(4, 4)(torch.ones(2, 4)).sum().backward()
eager = len(calls)
f = torch.compile(lambda x: x * 2, backend="eager")
with isolated_run(seed=1, shared_process=True):
    f(torch.ones(2))
print(eager, len(calls))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["0", "1"]  # eager: never reset; after a compile: reset on leaving the run
