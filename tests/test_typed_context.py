"""The run context is one typed object, not environment variables (issue 61, item 4): what the
processes of a command share beyond the config (the sweep, the kept store, the start-up marks, the
hub's answer, the bytecode cache set, whether the command compiles) is bertaccel/context.py's
RunContext, read with current(), written with update(), and one environment variable,
BERTACCEL_CONTEXT, carries it across a process boundary."""
from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys
from typing import Dict, Iterator, Set, Tuple

import pytest

from bertaccel.context import CONTEXT_ENV, KeptStore, RunContext, StartupMarks, SweepContext, current, update

ROOT = pathlib.Path(__file__).resolve().parents[1]

# BERTACCEL_* variables the package reads and never writes: the user's settings, not state.
USER_SETTINGS = {
    "BERTACCEL_PYCACHE": "the user's bytecode cache folder, or off (runs/bytecode.py, docs/scale.md)",
    # Read in the forkserver's preload; the command line's own answer travels in the context
    # (preload_compile), this is only the user's override of it.
    "BERTACCEL_PRELOAD_COMPILE": "the user's say on the forkserver preloading Inductor (docs/scale.md)",
}


def _is_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name) \
        and node.value.id == "os"


def _env_uses(tree: ast.AST) -> Iterator[Tuple[ast.AST, bool]]:
    """(the key expression, written?) of each os.environ / os.getenv use with a key."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and _is_environ(node.value):
            yield node.slice, not isinstance(node.ctx, ast.Load)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            if _is_environ(node.func.value) and node.func.attr in ("get", "pop", "setdefault"):
                yield node.args[0], node.func.attr != "get"
            elif isinstance(node.func.value, ast.Name) and node.func.value.id == "os" \
                    and node.func.attr in ("getenv", "putenv", "unsetenv"):
                yield node.args[0], node.func.attr != "getenv"
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
            yield node.left, False


def environment_names(root: pathlib.Path) -> Dict[str, Set[str]]:
    """Each BERTACCEL_* variable the package and its Hydra plugins use through os.environ: its
    name -> {"read", "written"}. A key named by a constant (SWEEP_ENV = "BERTACCEL_SWEEP", imported
    or not) is resolved through the package's module-level string constants."""
    files = sorted([*(root / "bertaccel").rglob("*.py"), *(root / "hydra_plugins").rglob("*.py")])
    trees = [ast.parse(p.read_text()) for p in files]
    constants: Dict[str, str] = {}
    for tree in trees:
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                    and isinstance(node.value.value, str) and node.value.value.startswith("BERTACCEL_"):
                constants.update({t.id: node.value.value for t in node.targets if isinstance(t, ast.Name)})
    found: Dict[str, Set[str]] = {}
    for tree in trees:
        for key, written in _env_uses(tree):
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                name = key.value
            else:
                name = constants.get(key.id if isinstance(key, ast.Name) else getattr(key, "attr", ""), "")
            if name.startswith("BERTACCEL_"):
                found.setdefault(name, set()).add("written" if written else "read")
    return found


def test_one_environment_variable_carries_the_context():
    """Before: 6 BERTACCEL_* variables carried state between layers and processes
    (BERTACCEL_SWEEP, _STORE_KEPT, _STARTUP_MARKS, _HUB_UNREACHABLE, _PYCACHE_SET and
    _PRELOAD_COMPILE, written by the package); now 1, BERTACCEL_CONTEXT. The others the package
    reads are the user's settings (USER_SETTINGS), which it never writes."""
    found = environment_names(ROOT)
    state = sorted(name for name, uses in found.items() if name not in USER_SETTINGS or "written" in uses)
    assert state == [CONTEXT_ENV], f"{len(state)} BERTACCEL_* variables carry state: {state}"
    assert found[CONTEXT_ENV] == {"read", "written"}
    assert set(found) - {CONTEXT_ENV} <= set(USER_SETTINGS), found


def test_the_count_sees_the_old_kinds_of_use(tmp_path):
    """The count above finds each form the six variables were used in (a constant imported from
    another module, a chained assignment, `in`, setdefault, pop), so it cannot pass by missing them."""
    pkg = tmp_path / "bertaccel"
    pkg.mkdir()
    (tmp_path / "hydra_plugins").mkdir()
    (pkg / "a.py").write_text('import os\nA_ENV = "BERTACCEL_A"\nB = "BERTACCEL_B"\n'
                              'os.environ["PYTHONPYCACHEPREFIX"] = os.environ[A_ENV] = "x"\n'
                              'if B not in os.environ:\n    pass\n')
    (pkg / "b.py").write_text('import os\nfrom bertaccel.a import B\nos.environ.setdefault("BERTACCEL_C", "1")\n'
                              'os.environ.pop(B, None)\nos.getenv("BERTACCEL_PYCACHE")\n')
    assert environment_names(tmp_path) == {"BERTACCEL_A": {"written"}, "BERTACCEL_B": {"read", "written"},
                                           "BERTACCEL_C": {"written"}, "BERTACCEL_PYCACHE": {"read"}}


FULL = RunContext(sweep=SweepContext("sweep-1", "parent-1", ["precision", "train.lr"], "sqlite:////tmp/m.db"),
                  kept_store=KeptStore("/tmp/m.db", "2049:1234"),
                  startup=StartupMarks(4321, (("main process: Hydra composes the config", 1764300000.125),)),
                  hub_unreachable="HF_HUB_OFFLINE=1 is set", pycache_prefix="/tmp/pyc", preload_compile=True)

CHILD = "from bertaccel.context import current; print(current().to_json())"


def _child(env: Dict[str, str]) -> RunContext:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return RunContext.from_json(out.stdout.strip())


@pytest.mark.slow
def test_the_context_a_parent_writes_reaches_its_child_with_equal_fields(monkeypatch):
    monkeypatch.setenv(CONTEXT_ENV, "")  # (put back after the test)
    assert current() == RunContext()
    # written field by field, as the package does (update), and inherited as a child inherits it
    for field in ("sweep", "kept_store", "startup", "hub_unreachable", "pycache_prefix", "preload_compile"):
        update(**{field: getattr(FULL, field)})
    assert current() == FULL and current().sweep.swept == ("precision", "train.lr")
    assert _child(dict(os.environ)) == FULL
    # handed to a process started with an environment of its own
    base = {k: v for k, v in os.environ.items() if k != CONTEXT_ENV}
    assert _child({**base, **FULL.as_env()}) == FULL
    assert _child(base) == RunContext()
    # an update drops nothing else; the empty context leaves no variable behind
    update(sweep=None, kept_store=None)
    assert _child(dict(os.environ)) == RunContext(startup=FULL.startup, hub_unreachable=FULL.hub_unreachable,
                                                  pycache_prefix=FULL.pycache_prefix, preload_compile=True)
    update(startup=None, hub_unreachable=None, pycache_prefix=None, preload_compile=False)
    assert CONTEXT_ENV not in os.environ


@pytest.mark.slow
def test_the_context_imports_nothing_more_at_start_up():
    """bertaccel.run and the forkserver's preload read the context before their heavy imports
    (runs/bytecode.py, which imported bertaccel.option already): it adds no module but its own."""
    code = ("import sys; import bertaccel.option; before = set(sys.modules); import bertaccel.context; "
            "print(sorted(set(sys.modules) - before))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "['bertaccel.context']", out.stdout + out.stderr[-2000:]
