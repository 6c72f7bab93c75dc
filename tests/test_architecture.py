"""The house's rules, read from the code (docs/architecture.md): the layers (import-linter's
contract in pyproject.toml), no import circle, a short top of the package, modules of at most 400
lines and functions that read in one screen."""
import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
MAX_TOP_MODULES = 8
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 400


def test_imports_follow_the_layers():
    """A module imports from its own layer and below (lazy imports inside functions included):
    lint-imports exits non-zero and names the import when one goes up."""
    lint = pathlib.Path(sys.executable).with_name("lint-imports")
    r = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "2 kept, 0 broken" in r.stdout, r.stdout[-2000:]


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


def _modules() -> dict:
    """bertaccel's modules by dotted name (a package by its __init__.py) -> path."""
    mods = {}
    for path in sorted((ROOT / "bertaccel").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


def _imports(mods: dict) -> dict:
    """module -> {module of ours it imports: the line of the first such import}. Every import
    statement counts, inside functions and `if TYPE_CHECKING:` too: a circle that only a lazy
    import closes is still two modules that cannot be understood apart. `from pkg import name`
    is an import of pkg.name where that is a module, else of pkg."""
    graph = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = graph.setdefault(name, {})
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, node.level - 1 levels up
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in mods:  # bertaccel.x.y.Name -> bertaccel.x.y
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.setdefault(target, node.lineno)
    return graph


def _circles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan), each as a list."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _cycle_in(graph: dict, component: list, mods: dict) -> str:
    """One circle through the component's first module, each step with the import's place."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    queue = [start]
    while queue:  # breadth first: the shortest way back to start
        v = queue.pop(0)
        for w in sorted(graph[v]):
            if w == start:
                path = paths[v] + [start]
                return " -> ".join(f"{a} ({mods[a].relative_to(ROOT)}:{graph[a][b]})"
                                   for a, b in zip(path, path[1:])) + f" -> {start}"
            if w in members and w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    return ", ".join(component)


def test_no_import_circle():
    """No two modules of the package import each other, directly or around a circle, counting
    imports inside functions: the message names each circle and where each of its imports is."""
    mods = _modules()
    graph = _imports(mods)
    assert "bertaccel.runs.job" in graph["bertaccel.runs.launch"], "the graph lost launch's lazy import of job"
    circles = [_cycle_in(graph, c, mods) for c in _circles(graph)]
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_no_module_over_400_lines():
    long = [f"{path.relative_to(ROOT)} ({n} lines)" for path in sorted((ROOT / "bertaccel").rglob("*.py"))
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(long)
