"""An attention kernel is found, not listed: bertaccel/attention/kernels/<name>.py defines BACKEND, and
<name> is the attention.swap value that runs it (its YAML in conf/attention/). Nothing else names it."""
from __future__ import annotations

import importlib
import pkgutil
import sys
import textwrap

import pytest
import yaml

import bertaccel.attention.kernels as kernels
from bertaccel.attention.kernels import BACKENDS, Backend, collect
from bertaccel.config import CONF_DIR


def test_every_kernel_module_is_a_swap_and_every_swap_a_kernel_module():
    modules = [m.name for m in pkgutil.iter_modules(kernels.__path__)]
    assert sorted(BACKENDS) == sorted(modules) and {"xformers", "triton"} <= set(modules)
    for name in modules:
        assert BACKENDS[name] is importlib.import_module(f"bertaccel.attention.kernels.{name}").BACKEND
    # (an option without `swap` has the schema's default, none)
    swaps = {yaml.safe_load(f.read_text()).get("swap") for f in (CONF_DIR / "attention").glob("*.yaml")}
    assert swaps - {None} == set(BACKENDS)
    # The order refusals and the config reference name them in: Backend.order, then the name; the
    # packaged kernels keep the order they were added, and a kernel added later (order 100 by
    # default) follows them. Derived, not listed: a new kernel's module changes no test.
    assert list(BACKENDS) == sorted(BACKENDS, key=lambda name: (BACKENDS[name].order, name))
    assert [name for name in BACKENDS if name in ("xformers", "triton")] == ["xformers", "triton"]


TOY = textwrap.dedent("""
    from bertaccel.attention.kernels import Backend, no_prepare

    def core(*args):
        raise NotImplementedError

    BACKEND = Backend(core, core, no_prepare, lambda device: None, core)
""")


def test_a_kernel_module_is_found_by_its_file_and_one_without_backend_is_refused_in_one_line(tmp_path, monkeypatch):
    package = tmp_path / "toy_kernels"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "toy.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    found = collect("toy_kernels")
    assert list(found) == ["toy"] and isinstance(found["toy"], Backend)

    (package / "helpers.py").write_text("def shared():\n    return 1\n")
    importlib.invalidate_caches()
    with pytest.raises(TypeError) as refused:
        collect("toy_kernels")
    line = str(refused.value)
    assert "\n" not in line and str(package / "helpers.py") in line and "defines no BACKEND" in line
    assert "attention.swap=helpers" in line
    for name in [m for m in sys.modules if m.startswith("toy_kernels")]:
        del sys.modules[name]  # the next import of this name (another tmp_path) reads its own files
