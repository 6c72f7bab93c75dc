"""The config reference page (docs/reference/config.md), generated from the code so that it cannot
drift from it: every config group and block of the schema (config/), each key's type, comment,
declared range and composed default, the options Hydra finds in conf/ (composed, and compared with
the group's default option), the allowed values the checks test against, and the checks
themselves: a loop over the registry (options/registry.py: each section's Option, its checks and
machine check, each said by its docstring) and the rules between sections (options/rules.py).
On top, the most used settings (MOST_USED); at the end, the papers the options cite (options/papers.py).

    python -m bertaccel.options.reference --out docs/reference/config.md

tests/test_config_reference.py regenerates the page and compares it with the committed file.
"""
from __future__ import annotations

import argparse
import inspect
import sys
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import (TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union, get_args, get_origin,
                    get_type_hints)

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from bertaccel.config import CONF_DIR, GROUP_SCHEMAS, RunConfig, register_configs, schema_fields
from bertaccel.options.introspect import (Check, allowed_values, check_title, field_comments,  # noqa: F401
                                          section_checks, section_rules)
from bertaccel.options.papers import ANCHOR, link_citations, papers_table

if TYPE_CHECKING:
    from bertaccel.options.rules import Rule

COMMAND = "python -m bertaccel.options.reference --out docs/reference/config.md"

# The settings a newcomer changes first, with what changing them does; the page adds each one's
# values (a group's options, a key's allowed values) from the code, and links to its section.
MOST_USED = (
    ("precision", "Float32, autocast to bfloat16 / float16, or FP8 GEMMs: faster matmuls on a GPU with tensor cores."),
    ("attention", "The self-attention kernel: Hugging Face's eager code, torch SDPA, xFormers or ours (Triton)."),
    ("compile", "torch.compile of the model; with compile.step_graph=true, the whole step from CUDA graphs."),
    ("accumulation", "Micro-batches per optimizer step: a larger effective batch, fewer optimizer steps."),
    ("freezing", "layerwise: one encoder layer (+ head) trains per epoch, so backward does far less."),
    ("optimizer", "AdamW, Adan or LAMB, as one kernel per op, a loop per tensor, or one fused kernel."),
    ("model", "The BERT to fine-tune; minilm_l6 ships with its weights (offline)."),
    ("dataset", "The text-classification data; ag_news_sample is bundled (offline)."),
    ("train.batch_size", "Rows per micro-batch and GPU; auto: the largest power of two that fits."),
    ("train.epochs", "Passes over the training data."),
    ("num_gpus", "Data-parallel ranks (DDP): one process and one GPU each."),
    ("hardware", "The GPU's price, power and peak FLOP/s, for cost, energy and MFU; auto matches the GPU."),
)
# Sections without a schema class to describe them.
SECTION_DOCS = {"preset": "Bundles of the other groups' choices that rerun a paper's experiment in one word "
                          "(`preset=seed001_k4`); a preset's values win over conf/config.yaml's, the command line "
                          "wins over both.",
                "top-level": "Settings at the top of the config, each set as `key=value` (accumulation=4)."}


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

    def compose(self, overrides: Sequence[str] = ()) -> Tuple[DictConfig, Dict[str, str]]:
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
            key = f"{prefix}{k!s}"  # (our configs' keys are str; OmegaConf's key type also allows bytes, ints)
            yield from flatten(value, f"{key}.") if isinstance(value, DictConfig) else [(key, value)]
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
    if isinstance(obj, type) and is_dataclass(obj) and text.startswith(f"{obj.__name__}("):
        return ""
    return " ".join(text.split())


def prose(text: str) -> str:
    """An option's text on the page: escaped (cell), with its citations linked to the papers table."""
    return link_citations(cell(text))


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


def key_id(key: str) -> str:
    return f'<code class="cfg-key" id="{key}">{key}</code>'


def values_said(key: str, hint: Any, f: Any, allowed: Dict[str, str]) -> str:
    """A key's type, then the values its check allows and its declared range."""
    said = [allowed[key]] if key in allowed else []
    declared = f.metadata.get("range")
    if declared is not None:
        said.append(declared.text() + (f" ({declared.note})" if declared.note else ""))
    shown = [] if hint is Any and said else [show_type(hint)]  # (Any: a key that takes two spellings)
    return cell(", ".join(shown + said))


def default_of(cfg: DictConfig, key: str) -> str:
    return "???" if OmegaConf.is_missing(cfg, key) else show(OmegaConf.select(cfg, key, default="???"))


def keys_list(name: str, cls: Optional[type], cfg: DictConfig, allowed: Dict[str, str]) -> List[str]:
    """One line per key: the key (never broken: the stylesheet keeps .cfg-key on one line), its
    composed default, type and allowed values, then what it does (its comment in config/)."""
    if cls is None:
        rows = [(key, f, get_type_hints(RunConfig)[key], field_comments(RunConfig).get(key, ""))
                for key, f in _top_level_fields()]
    else:
        hints, comments = get_type_hints(cls), field_comments(cls)
        rows = [(f"{name}.{f.name}", f, hints[f.name], comments.get(f.name, "")) for f in fields(cls)]
    return [f"- {key_id(key)} = {code(default_of(cfg, key))} <span class=\"cfg-values\">{values_said(key, hint, f, allowed)}"
            f"</span> {prose(comment)}" for key, f, hint, comment in rows]


def options_table(composer: Composer, group: str, base: DictConfig, base_choices: Dict[str, str]) -> List[str]:
    """One row per option Hydra finds for the group with its file's comment, then, folded, what
    each sets that the group's default option does not (for preset, anything in the whole config)."""
    rows, sets = ["| Option | What it is |", "|---|---|"], []
    for option in composer.options(group):
        cfg, choices = composer.compose([f"{group}={option}"])
        if group == "preset":
            # The groups it picks, then the keys it sets itself (not those its picked options set).
            picked = [g for g, c in choices.items() if g != group and base_choices.get(g) != c]
            said = [f"`{g}={choices[g]}`" for g in picked]
            said += [c for c in changes(base, cfg) if c.strip("`").split(".")[0] not in picked]
        else:  # (name: the option's own name is said by the row already)
            said = [c for c in changes(base[group], cfg[group]) if c != f"`name: {option}`"]
        mark = " (default)" if base_choices.get(group) == option else ""
        rows.append(f"| `{option}`{mark} | {prose(composer.option_comment(group, option))} |")
        sets.append(f"    - `{option}`{mark}: {', '.join(said) or 'nothing: it is the default'}")
    return rows + ["", f'??? note "What each option sets, against the default option"', ""] + sets


def checks_list(checks: List[Check], rules: List[Rule]) -> List[str]:
    """The checks, folded (pymdownx.details): a reader opens them when a config is refused."""
    if not checks and not rules:
        return ["Checks: none of its own, only the declared ranges and the finite-number check."]
    said = ([f"- `{check_title(c)}`: {prose(_doc(c))}" for c in checks]
            + [f"- rule `{r.name}` (reads {', '.join(r.reads)}): {prose(r.says)}" for r in rules])
    return [f'??? note "Checks: what it refuses ({len(said)})"', ""] + ["    " + line for line in said]


def render_section(composer: Composer, name: str, kind: str, cls: Optional[type], base: DictConfig,
                   base_choices: Dict[str, str], checks: Dict[str, List[Check]], rules: Dict[str, List[Rule]],
                   allowed: Dict[str, str]) -> List[str]:
    keys = [key for key, _ in _top_level_fields()] if kind == "settings" else [name]
    own = [c for key in keys for c in checks.get(key, [])]
    said = [r for key in keys for r in rules.get(key, [])]
    out = [f"## {name}", ""]
    doc = prose(_doc(cls) if cls is not None else SECTION_DOCS.get(name, ""))
    if kind == "group":
        doc += f" Default option: `{base_choices[name]}`; choose another with `{name}=<option>`."
    out += [doc.strip(), ""]
    if kind == "group":
        out += options_table(composer, name, base, base_choices) + [""]
    if kind == "group" and cls is not None:  # (folded: a group is mostly chosen by option; its keys fine-tune one)
        names = ", ".join(f.name for f in fields(cls))
        out += [f'??? note "Keys: {names}"', ""] + ["    " + line for line in keys_list(name, cls, base, allowed)] + [""]
    elif cls is not None or kind == "settings":
        out += keys_list(name, cls, base, allowed) + [""]
    return out + checks_list(own, list(dict.fromkeys(said))) + [""]


def key_hint(key: str) -> Any:
    """A dotted key's type in the schema (train.batch_size: Any)."""
    cls = RunConfig
    *blocks, last = key.split(".")
    for block in blocks:
        cls = get_type_hints(cls)[block]
    return get_type_hints(cls)[last]


def most_used(composer: Composer, base: DictConfig, base_choices: Dict[str, str], allowed: Dict[str, str]) -> List[str]:
    """The settings a newcomer changes first: each one's values from the code, what it does, and
    a link down to its section (a group's heading, a key's line)."""
    keys = dict(schema_fields())
    out = ["| Setting | Values | What it does |", "|---|---|---|"]
    for setting, effect in MOST_USED:
        if setting in base_choices:
            values = ", ".join(f"`{o}`" + (" (default)" if o == base_choices[setting] else "")
                               for o in composer.options(setting))
        else:
            values = (f"{values_said(setting, key_hint(setting), keys[setting], allowed)}; "
                      f"default {code(default_of(base, setting))}")
        out.append(f"| [`{setting}`](#{setting}) | {values} | {cell(effect)} |")
    return out


INTRO = [
    "Every setting of a run. On the command line `group=option` picks one of a group's options (a file "
    "in conf/&lt;group&gt;/) and `key=value` sets one key: "
    "`python -m bertaccel.run precision=bf16 train.batch_size=64`.", "",
    '??? note "How this page is made, and how a config is checked"', "",
    f"    Generated from the code by `{COMMAND}`; do not edit it by hand "
    "(tests/test_config_reference.py fails when it is out of date). The keys, their types and ranges come from the schema (bertaccel/config/), the options and "
    "defaults from Hydra's composition of bertaccel/conf/, the allowed values and checks from the "
    "checks' own code. A run's config is the schema, then conf/config.yaml with one option per group, "
    "then the command line. Before any work every number is checked to be finite and in its declared "
    "range, then each section's own check and every rule between sections (a rule only when the "
    "sections it reads passed their own); the checks that build or reach out (the optimizer's class, "
    "the tracking store) come last. A bad config is refused with every problem found, one line each. "
    "A machine check says why this machine cannot run a choice: the run is then recorded skipped, "
    "with that reason.", ""]


def generate(conf_dir: Path = CONF_DIR, searchpath: Optional[Path] = None) -> str:
    """The reference page, for conf_dir's options (plus a search path's, as a user adds them)."""
    checks, rules = section_checks(), section_rules()
    out = ["# Config reference", ""] + INTRO
    with Composer(conf_dir, searchpath) as composer:
        base, base_choices = composer.compose()
        all_sections = list(sections())
        allowed: Dict[str, str] = {}
        for name, kind, _ in all_sections:
            keys = [key for key, _ in _top_level_fields()] if kind == "settings" else [name]
            for check in (c for key in keys for c in checks.get(key, [])):
                allowed.update(allowed_values(check, name))
        out += ["## Most used", ""] + most_used(composer, base, base_choices, allowed) + [""]
        groups = [f"[{n}](#{n.lower()}) (`{base_choices[n]}`)" for n, k, _ in all_sections if k == "group"]
        blocks = [f"[{n}](#{n.lower()})" for n, k, _ in all_sections if k != "group"]
        out += [f"**Groups** (default option): {', '.join(groups)}. **Settings and blocks**: {', '.join(blocks)}. "
                f"**[Papers cited](#{ANCHOR})**.", ""]
        for name, kind, cls in all_sections:
            out += render_section(composer, name, kind, cls, base, base_choices, checks, rules, allowed)
        presets = composer.options("preset")
    out += ["## Papers cited", "",
            "The papers the options come from. Option texts cite them by title and section; preset names "
            "and a few recorded values name them by number (`seed 001`, `preset=seed001_k4`).", ""]
    out += papers_table(presets, cell)
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
