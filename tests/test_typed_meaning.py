"""Each option owns its meaning: no module but the option's own compares one of its values with a
string (`cfg.attention.swap == "triton"`, `cfg.train.batch_size == "auto"`); the others ask the
option's predicate (attention.option.jit_compiles, options.train.fits_batch, ...), so a new
kernel, strategy or source changes one module. Counted over the package's source with the AST."""
from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path
from typing import Dict, List, Set, Tuple

from bertaccel import config
from bertaccel.options.registry import options

PACKAGE = Path(config.__file__).resolve().parent
if PACKAGE.name == "config":  # (a package of one module per section, or the one module)
    PACKAGE = PACKAGE.parent


def _option_valued_fields() -> Set[Tuple[str, str]]:
    """(section, field) of every setting whose value names a choice: str (or Any: accumulation,
    train.batch_size take a word or a number) fields of the schema; top-level ones as ("", name)."""
    found = set()
    hints = typing.get_type_hints(config.RunConfig)
    for name, hint in hints.items():
        if dataclasses.is_dataclass(hint):
            for f, t in typing.get_type_hints(hint).items():
                if t in (str, Optional_str, typing.Any):
                    found.add((name, f))
        elif hint in (str, typing.Any):
            found.add(("", name))
    return found


Optional_str = typing.Optional[str]


def _homes() -> Dict[str, str]:
    """section -> the file of its registered option (options/registry.py)."""
    out = {}
    for option in options():
        module = type(option).__module__
        out[option.section] = str(Path(*module.split(".")[1:]).with_suffix(".py"))
    return out


def _reads(node: ast.AST) -> Tuple[str, str]:
    """(section, field) an attribute chain reads: cfg.attention.swap -> (attention, swap); a name
    that is the section itself (attention.swap) too; cfg.accumulation -> ("", accumulation)."""
    if not isinstance(node, ast.Attribute):
        return ("", "")
    base = node.value
    if isinstance(base, ast.Attribute):
        return (base.attr, node.attr)
    if isinstance(base, ast.Name):
        return (base.id, node.attr)
    return ("", "")


def _is_words(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and bool(node.elts) and all(_is_words(e) for e in node.elts)


def string_comparisons_outside_their_option(package: Path) -> List[str]:
    fields = _option_valued_fields()
    top_level = {f for s, f in fields if s == ""}
    homes = _homes()
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = str(path.relative_to(package))
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            if not any(_is_words(s) for s in sides):
                continue
            for side in sides:
                section, name = _reads(side)
                if (section, name) in fields:
                    owner = section
                elif name in top_level and isinstance(side, ast.Attribute):
                    owner = name  # cfg.accumulation: its own option's section
                else:
                    continue
                if homes.get(owner) != rel:
                    found.append(f"{rel}:{node.lineno}: {section}.{name}" if section else f"{rel}:{node.lineno}: {name}")
    return found


def test_no_module_compares_an_option_value_with_a_string_outside_its_option():
    found = string_comparisons_outside_their_option(PACKAGE)
    assert found == [], "ask the option's predicate instead:\n" + "\n".join(found)


def test_the_counter_finds_a_comparison_outside_the_option(tmp_path):
    """The counter is not blind: the comparison train/step.py made before (attention kernel names
    in the training core) is found in a copy that puts it back, and not in the option's own module."""
    package = tmp_path / "bertaccel"
    (package / "train").mkdir(parents=True)
    (package / "attention").mkdir()
    (package / "train" / "step.py").write_text(
        "def uses_triton(cfg):\n    return cfg.attention.swap == 'triton' or cfg.encoder.layer in ('fused',)\n")
    (package / "attention" / "option.py").write_text("def is_sdpa(a, attention):\n    return attention.hf_implementation == 'sdpa'\n")
    assert string_comparisons_outside_their_option(package) == ["train/step.py:2: attention.swap",
                                                                "train/step.py:2: encoder.layer"]
