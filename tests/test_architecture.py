"""The house's rules, read from the code (docs/architecture.md): the layers (import-linter's
contract in pyproject.toml), a short top of the package, and functions that read in one screen."""
import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
MAX_TOP_MODULES = 8
MAX_FUNCTION_LINES = 80


def test_imports_follow_the_layers():
    """A module imports from its own layer and below (lazy imports inside functions included):
    lint-imports exits non-zero and names the import when one goes up."""
    lint = pathlib.Path(sys.executable).with_name("lint-imports")
    r = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "1 kept, 0 broken" in r.stdout, r.stdout[-2000:]


def test_top_of_the_package_is_short():
    top = sorted(p.name for p in (ROOT / "bertaccel").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= MAX_TOP_MODULES, f"{len(top)} modules at the top of bertaccel/: {top}"


def _jitted(fn: ast.AST) -> bool:
    """A Triton kernel, or a function that defines one (its body is the kernel's)."""
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
               and any("jit" in ast.unparse(d) for d in n.decorator_list) for n in ast.walk(fn))


def test_no_function_over_80_lines():
    long = []
    for folder in ("bertaccel", "benchmarks", "hydra_plugins"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _jitted(node):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "functions over 80 lines:\n" + "\n".join(long)
