"""The config reference page (docs/reference/config.md), generated from the code so that it cannot
drift from it: every config group and block of the schema (config.py), each key's type, comment,
declared range and composed default, the options Hydra finds in conf/ (composed, and compared with
the group's default option), the allowed values the checks test against, and the checks
themselves: a loop over the registry (options/registry.py: each section's Option, its checks and
machine check, each said by its docstring) and the rules between sections (options/rules.py).

    python -m bertaccel.options.reference --out docs/reference/config.md

tests/test_config_reference.py regenerates the page and compares it with the committed file.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import sys
import textwrap
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union, get_args, get_origin, get_type_hints

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from bertaccel.config import CONF_DIR, GROUP_SCHEMAS, RunConfig, register_configs

COMMAND = "python -m bertaccel.options.reference --out docs/reference/config.md"


# --- what the code says about each key ------------------------------------------------------

def field_comments(cls: type) -> Dict[str, str]:
    """Each field's comment in config.py: the comment lines right above it and the one at its end.
    Comments, not metadata, because that is where the schema already explains its fields."""
    lines, start = inspect.getsourcelines(cls)
    body = ast.parse(textwrap.dedent("".join(lines))).body[0].body
    out: Dict[str, str] = {}
    prev_end = 1  # (the class line; a docstring moves it on)
    for node in body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            above = [ln.strip()[1:].strip() for ln in lines[prev_end:node.lineno - 1] if ln.strip().startswith("#")]
            trailing = [ln.split("  #", 1)[1].strip() for ln in lines[node.lineno - 1:node.end_lineno] if "  #" in ln]
            out[node.target.id] = " ".join(above + trailing)
        prev_end = node.end_lineno
    return out


def _namespace(fn: Callable, tree: ast.AST) -> Dict[str, Any]:
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
    value = names.get(name.id) if isinstance(name, ast.Name) else None
    return tuple(value) if isinstance(value, tuple) or hasattr(value, "keys") else None


def allowed_values(check: Callable, section: str) -> Dict[str, str]:
    """The values a check lets a key take, read from its code: not_one_of(key, value, NAMES),
    not_count_or(key, value, word) and `<x>.<field> not in NAMES` (the field of the check's own
    section). The check's helpers in the same module are read too (check -> check_precision)."""
    out: Dict[str, str] = {}
    for fn in _with_helpers(check):
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        names = _namespace(fn, tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 3 \
                    and isinstance(node.args[0], ast.Constant):
                key = node.args[0].value
                if node.func.id == "not_one_of" and _resolve(node.args[2], names):
                    out[key] = "one of " + ", ".join(f"`{v}`" for v in _resolve(node.args[2], names))
                elif node.func.id == "not_count_or" and isinstance(node.args[2], ast.Constant):
                    out[key] = f"an integer >= 1, or `{node.args[2].value}`"
            elif isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.NotIn) \
                    and isinstance(node.left, ast.Attribute) and _resolve(node.comparators[0], names):
                listed = ", ".join(f"`{v}`" for v in _resolve(node.comparators[0], names))
                out.setdefault(f"{section}.{node.left.attr}", f"one of {listed}")
    return out


def _with_helpers(check: Callable) -> List[Callable]:
    """The check and the functions of its module it calls by name (one level: they are small)."""
    called = {n.func.id for n in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(check))))
              if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    module = sys.modules[check.__module__]
    helpers = [getattr(module, name) for name in sorted(called)
               if inspect.isfunction(getattr(module, name, None)) and getattr(module, name).__module__ == module.__name__]
    return [check, *helpers]


def section_checks() -> Dict[str, List[Callable]]:
    """Each registered section's checks: its own check, its machine check when it has one of its
    own, and its later checks (options/registry.py)."""
    from bertaccel.option import Option
    from bertaccel.options.registry import options

    out: Dict[str, List[Callable]] = {}
    for option in options():
        machine = [option.unusable] if type(option).unusable is not Option.unusable else []
        out[option.section] = [option.check, *machine, *option.later]
    return out


def section_rules() -> Dict[str, List[Any]]:
    """The rules of options/rules.py under each section they read."""
    from bertaccel.options.rules import RULES

    out: Dict[str, List[Any]] = {}
    for rule in RULES:
        for section in rule.reads:
            out.setdefault(section, []).append(rule)
    return out


# --- composing the configs ------------------------------------------------------------------

class Composer:
    """Hydra's composition of conf/ (and an extra search path), as a run composes it."""

    def __init__(self, conf_dir: Path, searchpath: Optional[Path]):
        self.extra = [f"hydra.searchpath=[file://{searchpath}]"] if searchpath else []
        self.conf_dir = conf_dir

    def __enter__(self) -> "Composer":
        from hydra import initialize_config_dir
        from hydra.core.global_hydra import GlobalHydra

        register_configs()
        GlobalHydra.instance().clear()
        self._init = initialize_config_dir(config_dir=str(self.conf_dir), version_base="1.3")
        self._init.__enter__()
        self.loader = GlobalHydra.instance().config_loader()
        return self

    def __exit__(self, *exc: Any) -> None:
        from hydra.core.global_hydra import GlobalHydra

        self._init.__exit__(*exc)
        GlobalHydra.instance().clear()

    def compose(self, overrides: List[str] = ()) -> Tuple[DictConfig, Dict[str, str]]:
        """The composed run config and the groups' choices (precision: fp32, ...)."""
        from hydra import compose

        cfg = compose(config_name="config", overrides=self.extra + list(overrides), return_hydra_config=True)
        choices = {k: v for k, v in cfg.hydra.runtime.choices.items() if not k.startswith("hydra/")}
        # The folders Hydra searched, in its order (conf/, the sweeps, the extra search path).
        self.folders = [Path(s.path) for s in cfg.hydra.runtime.config_sources if s.schema == "file"]
        with open_dict(cfg):
            del cfg["hydra"]
        return cfg, choices

    def options(self, group: str) -> List[str]:
        """The group's options over the whole search path (the extra one included)."""
        return sorted(self.loader.get_group_options(group, config_name="config", overrides=self.extra))

    def option_comment(self, group: str, option: str) -> str:
        """The option file's leading comment (its description), from the first folder holding it."""
        for folder in self.folders:
            path = folder / group / f"{option}.yaml"
            if path.is_file():
                return _leading_comment(path.read_text())
        return ""


def _leading_comment(text: str) -> str:
    said = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        if not line.startswith("# @package"):
            said.append(line[1:].strip())
    return " ".join(said)


# --- values as the page shows them ----------------------------------------------------------

def show(value: Any) -> str:
    """A value as YAML would spell it on the command line: null, true, [a, b], {k: v}."""
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value)
    if value is None:
        return "null"
    if value == "":
        return '""'  # (an empty code span would show nothing)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}" if abs(value) < 1e-3 or abs(value) >= 1e6 else repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(show(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {show(v)}" for k, v in value.items()) + "}"
    return str(value)


def show_type(hint: Any) -> str:
    if hint is Any:
        return "any"
    origin, args = get_origin(hint), get_args(hint)
    if origin is Union and type(None) in args:
        return " or ".join([show_type(a) for a in args if a is not type(None)] + ["null"])
    if origin in (list, List):
        return f"list[{show_type(args[0])}]"
    if origin in (dict, Dict):
        return "mapping"
    return getattr(hint, "__name__", str(hint))


def cell(text: str) -> str:
    """Prose in a table cell: pipes would end the cell, angle brackets would read as HTML."""
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;") or " "


def code(value: str) -> str:
    return f"`{value}`" if "|" not in value else cell(value)


def flatten(node: Any, prefix: str = "") -> Iterator[Tuple[str, Any]]:
    """Every leaf of a config with its dotted key (a list is one value)."""
    if isinstance(node, DictConfig):
        for k in node.keys():
            value = "???" if OmegaConf.is_missing(node, k) else node[k]  # (a required value no option gave)
            yield from flatten(value, f"{prefix}{k}.") if isinstance(value, DictConfig) else [(f"{prefix}{k}", value)]
    else:
        yield prefix.rstrip("."), node


def changes(base: DictConfig, other: DictConfig) -> List[str]:
    """What `other` sets differently from `base`, one `key: value` each, in the config's order."""
    before = {k: show(v) for k, v in flatten(base)}
    after = {k: show(v) for k, v in flatten(other)}
    gone = [f"`{k}` removed" for k in before if k not in after]
    return [f"`{k}: {v}`" for k, v in after.items() if before.get(k) != v] + gone


# --- the page -------------------------------------------------------------------------------

def _doc(obj: Any) -> str:
    """A docstring as one paragraph; a dataclass without one has a generated signature instead."""
    text = inspect.getdoc(obj) or ""
    if is_dataclass(obj) and text.startswith(f"{obj.__name__}("):
        return ""
    return " ".join(text.split())


def sections() -> Iterator[Tuple[str, str, Optional[type]]]:
    """(name, kind, schema) of every section, in the schema's order: the groups, preset (a group
    without a schema), the top-level settings, then the blocks."""
    hints = get_type_hints(RunConfig)
    groups = dict(GROUP_SCHEMAS)
    for name, cls in GROUP_SCHEMAS:
        yield name, "group", cls
    yield "preset", "group", None
    yield "top-level", "settings", None
    for f in fields(RunConfig):
        if is_dataclass(hints[f.name]) and f.name not in groups:
            yield f.name, "block", hints[f.name]


def _top_level_fields() -> List[Tuple[str, Any]]:
    hints = get_type_hints(RunConfig)
    return [(f.name, f) for f in fields(RunConfig) if not is_dataclass(hints[f.name])]


def keys_table(name: str, cls: Optional[type], cfg: DictConfig, allowed: Dict[str, str]) -> List[str]:
    """One row per key: type, composed default, allowed values or range, and its comment."""
    if cls is None:
        rows = [(key, f, get_type_hints(RunConfig)[key], field_comments(RunConfig).get(key, ""))
                for key, f in _top_level_fields()]
    else:
        hints, comments = get_type_hints(cls), field_comments(cls)
        rows = [(f"{name}.{f.name}", f, hints[f.name], comments.get(f.name, "")) for f in fields(cls)]
    out = ["| Key | Type | Default | Allowed | What it does |", "|---|---|---|---|---|"]
    for key, f, hint, comment in rows:
        declared = f.metadata.get("range")
        said = [allowed[key]] if key in allowed else []
        if declared is not None:
            said.append(declared.text() + (f" ({declared.note})" if declared.note else ""))
        default = OmegaConf.select(cfg, key, default="???") if not OmegaConf.is_missing(cfg, key) else "???"
        out.append(f"| `{key}` | {show_type(hint)} | {code(show(default))} | {cell('; '.join(said))} | {cell(comment)} |")
    return out


def options_table(composer: Composer, group: str, base: DictConfig, base_choices: Dict[str, str]) -> List[str]:
    """One row per option Hydra finds for the group: its file's comment, and what it sets that the
    group's default option does not (for preset, anything in the whole config)."""
    out = ["| Option | What it is | Sets, against the default |", "|---|---|---|"]
    for option in composer.options(group):
        cfg, choices = composer.compose([f"{group}={option}"])
        if group == "preset":
            # The groups it picks, then the keys it sets itself (not those its picked options set).
            picked = [g for g, c in choices.items() if g != group and base_choices.get(g) != c]
            said = [f"`{g}={choices[g]}`" for g in picked]
            said += [c for c in changes(base, cfg) if c.strip("`").split(".")[0] not in picked]
        else:
            said = changes(base[group], cfg[group])
        mark = " (default)" if base_choices.get(group) == option else ""
        out.append(f"| `{option}`{mark} | {cell(composer.option_comment(group, option))} | "
                   f"{'<br>'.join(said) or 'nothing: it is the default'} |")
    return out


def check_title(check: Callable) -> str:
    """A check as the page names it: module.Class.method, or module.function."""
    return f"{check.__module__}.{check.__qualname__}"


def checks_list(checks: List[Callable], rules: List[Any]) -> List[str]:
    if not checks and not rules:
        return ["None of its own: only the declared ranges and the finite-number check."]
    return ([f"- `{check_title(c)}`: {cell(_doc(c))}" for c in checks]
            + [f"- rule `{r.name}` (reads {', '.join(r.reads)}): {cell(r.says)}" for r in rules])


def render_section(composer: Composer, name: str, kind: str, cls: Optional[type], base: DictConfig,
                   base_choices: Dict[str, str], checks: Dict[str, List[Callable]], rules: Dict[str, List[Any]]) -> List[str]:
    keys = [key for key, _ in _top_level_fields()] if kind == "settings" else [name]
    own = [c for key in keys for c in checks.get(key, [])]
    said = [r for key in keys for r in rules.get(key, [])]
    allowed: Dict[str, str] = {}
    for check in own:
        allowed.update(allowed_values(check, name))
    out = [f"## {name}", ""]
    if cls is not None and _doc(cls):
        out += [cell(_doc(cls)), ""]
    if kind == "group":
        out += [f"Default option: `{base_choices[name]}`; choose another with `{name}=<option>`.", ""]
    if cls is not None or kind == "settings":
        out += ["**Keys**", ""] + keys_table(name, cls, base, allowed) + [""]
    if kind == "group":
        out += ["**Options**", ""] + options_table(composer, name, base, base_choices) + [""]
    return out + ["**Checks**", ""] + checks_list(own, list(dict.fromkeys(said))) + [""]


def generate(conf_dir: Path = CONF_DIR, searchpath: Optional[Path] = None) -> str:
    """The reference page, for conf_dir's options (plus a search path's, as a user adds them)."""
    checks, rules = section_checks(), section_rules()
    out = ["# Config reference", "",
           f"Generated from the code by `{COMMAND}`; do not edit it by hand "
           "(tests/test_config_reference.py fails when it is out of date). The keys, their types and "
           "ranges come from the schema (bertaccel/config.py), the options and defaults from Hydra's "
           "composition of bertaccel/conf/, the allowed values and checks from the checks' own code.", "",
           "A run's config is the schema, then conf/config.yaml with one option per group, then the "
           "command line: `group=option` picks an option, `key=value` sets a key. Before any work every "
           "number is checked to be finite and in its declared range, then each section's own check and "
           "every rule between sections (a rule only when the sections it reads passed their own); the "
           "checks that build or reach out (the optimizer's class, the tracking store) come last. A bad "
           "config is refused with every problem found, one line each. A machine check says why this "
           "machine cannot run a choice: the run is then recorded skipped, with that reason.", "",
           "## Contents", "", "| Section | Kind | Default option |", "|---|---|---|"]
    with Composer(conf_dir, searchpath) as composer:
        base, base_choices = composer.compose()
        all_sections = list(sections())
        out += [f"| [{n}](#{n.lower()}) | {k} | {code(base_choices[n]) if k == 'group' else ' '} |"
                for n, k, _ in all_sections] + [""]
        for name, kind, cls in all_sections:
            out += render_section(composer, name, kind, cls, base, base_choices, checks, rules)
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description="Write the config reference page (markdown).")
    parser.add_argument("--out", type=Path, help="the file to write (default: standard output)")
    args = parser.parse_args(argv)
    page = generate()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(page)
    else:
        sys.stdout.write(page)


if __name__ == "__main__":
    main()
