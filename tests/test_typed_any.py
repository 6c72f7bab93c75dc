"""No config or section typed Any: a function of the package that takes our config (`cfg`, `run`,
`config`, `*_cfg`, or a section by its name) names its type, RunConfig, a section's dataclass, the
composed DictConfig or transformers' PretrainedConfig. Fast: an AST walk, no import."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import List

ROOT = Path(__file__).resolve().parents[1]
# (not `model` and `run` alone: in the training core and the record they name the nn.Module and an
# MLflow Run; the model section is `model_cfg` or `model` in options/model.py, checked by its types)
SECTIONS = {"precision", "attention", "compile", "accumulation", "freezing", "optimizer", "hardware",
            "dataset", "encoder", "train", "tracking", "launcher", "sweep", "search", "carbon", "measure"}
# The two left, each with its reason:
ALLOWED = {
    # The Option base class sits below config/ (config/ imports bertaccel.option for bounded() and
    # ConfigError), so naming RunConfig there, even for the checker only, is an import circle;
    # every subclass types its check(cfg: RunConfig) and unusable(cfg: RunConfig, ...).
    ("bertaccel/option.py", "check", "cfg"),
    ("bertaccel/option.py", "unusable", "cfg"),
    # Hydra's own config (HydraConfig.get(), typed HydraConf by Hydra, a DictConfig when it runs).
    ("bertaccel/options/search.py", "uses_search", "hydra_cfg"),
}


def _is_config_name(name: str) -> bool:
    return name in {"cfg", "config", "model_config"} or name.endswith("_cfg") or name in SECTIONS


def config_params_typed_any(root: Path = ROOT) -> List[tuple]:
    found = []
    for folder in ("bertaccel", "hydra_plugins"):
        for path in sorted((root / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                for a in args:
                    ann = a.annotation
                    text = ast.unparse(ann) if ann is not None else ""
                    if _is_config_name(a.arg) and text.strip("'\"") in ("Any", "typing.Any"):
                        found.append((str(path.relative_to(root)), node.name, a.arg))
    return found


def test_no_config_or_section_is_typed_any():
    left = [f for f in config_params_typed_any() if f not in ALLOWED]
    assert left == [], "\n".join(f"{p}: {fn}({arg}: Any): name its type" for p, fn, arg in left)


def test_the_allowed_ones_are_still_there():
    """An entry of ALLOWED that no longer matches is stale: remove it (the list only shrinks)."""
    assert ALLOWED <= set(config_params_typed_any())
