"""What the code says about each config key, read from the code itself for the config reference
(options/reference.py): each field's comment in config/, the values a check lets a key take
(read from the check's own code), and each section's checks and the rules between sections.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import sys
import textwrap
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    from bertaccel.options.rules import Rule

# A check as read here: a function or bound method whose module and source are known (an option's
# check, unusable or later check, a rule's refusal); what it returns is not read.
Check = Callable[..., object]


def field_comments(cls: type) -> Dict[str, str]:
    """Each field's comment in config/: the comment lines right above it and the one at its end.
    Comments, not metadata, because that is where the schema already explains its fields."""
    lines, start = inspect.getsourcelines(cls)
    class_def = ast.parse(textwrap.dedent("".join(lines))).body[0]
    if not isinstance(class_def, ast.ClassDef):  # (getsourcelines of a class is its class statement)
        raise TypeError(f"field_comments: {cls!r} is not a class")
    out: Dict[str, str] = {}
    prev_end = 1  # (the class line; a docstring moves it on)
    for node in class_def.body:
        end = node.end_lineno or node.lineno  # (set by ast.parse; Optional only for hand-built nodes)
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            above = [ln.strip()[1:].strip() for ln in lines[prev_end:node.lineno - 1] if ln.strip().startswith("#")]
            trailing = [ln.split("  #", 1)[1].strip() for ln in lines[node.lineno - 1:end] if "  #" in ln]
            out[node.target.id] = " ".join(above + trailing)
        prev_end = end
    return out


def _namespace(fn: Check, tree: ast.AST) -> Dict[str, Any]:
    """The names a check's code sees: its module's, and those it imports inside itself (a check
    imports a heavy module only when asked: attention/option.py's `from .kernels import BACKENDS`)."""
    names = dict(fn.__globals__)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            package = fn.__module__.rsplit(".", node.level)[0] if node.level else None
            module = importlib.import_module(("." * node.level) + (node.module or ""), package)
            names.update({a.asname or a.name: getattr(module, a.name, None) for a in node.names})
    return names


def _resolve(name: ast.expr, names: Dict[str, Any]) -> Optional[Tuple[str, ...]]:
    """A name in a check's code as the values it holds (a tuple, or a mapping's keys), or None."""
    if not isinstance(name, ast.Name) or names.get(name.id) is None:
        return None
    value = names[name.id]
    return tuple(value) if isinstance(value, tuple) or hasattr(value, "keys") else None


def allowed_values(check: Check, section: str) -> Dict[str, str]:
    """The values a check lets a key take, read from its code: not_one_of(key, value, NAMES),
    not_count_or(key, value, word) and `<x>.<field> not in NAMES` (the field of the check's own
    section). The check's helpers in the same module are read too (check -> check_precision)."""
    out: Dict[str, str] = {}
    for fn in _with_helpers(check):
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        names = _namespace(fn, tree)
        for node in ast.walk(tree):
            # (the key and the word are str constants: not_one_of's and not_count_or's signatures)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 3 \
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                key, word = node.args[0].value, node.args[2]
                if node.func.id == "not_one_of" and (values := _resolve(node.args[2], names)):
                    out[key] = "one of " + ", ".join(f"`{v}`" for v in values)
                elif node.func.id == "not_count_or" and isinstance(word, ast.Constant) and isinstance(word.value, str):
                    out[key] = f"an integer >= 1, or `{word.value}`"
            elif isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.NotIn) \
                    and isinstance(node.left, ast.Attribute) and (values := _resolve(node.comparators[0], names)):
                listed = ", ".join(f"`{v}`" for v in values)
                out.setdefault(f"{section}.{node.left.attr}", f"one of {listed}")
    return out


def _with_helpers(check: Check) -> List[Check]:
    """The check and the functions of its module it calls by name (one level: they are small)."""
    called = {n.func.id for n in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(check))))
              if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    module = sys.modules[check.__module__]
    helpers = [getattr(module, name) for name in sorted(called)
               if inspect.isfunction(getattr(module, name, None)) and getattr(module, name).__module__ == module.__name__]
    return [check, *helpers]


def section_checks() -> Dict[str, List[Check]]:
    """Each registered section's checks: its own check, its machine check when it has one of its
    own, and its later checks (options/registry.py)."""
    from bertaccel.option import Option
    from bertaccel.options.registry import options

    out: Dict[str, List[Check]] = {}
    for option in options():
        own = [option.check] if type(option).check is not Option.check else []  # (the sweep block has none)
        machine = [option.unusable] if type(option).unusable is not Option.unusable else []
        out[option.section] = [*own, *machine, *option.later]
    return out


def section_rules() -> Dict[str, List[Rule]]:
    """The rules of options/rules.py under each section they read."""
    from bertaccel.options.rules import RULES

    out: Dict[str, List[Rule]] = {}
    for rule in RULES:
        for section in rule.reads:
            out.setdefault(section, []).append(rule)
    return out


def check_title(check: Check) -> str:
    """A check as the page names it: module.Class.method, or module.function."""
    return f"{check.__module__}.{check.__qualname__}"
