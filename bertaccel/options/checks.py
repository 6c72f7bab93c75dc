"""validate(): every setting of a run checked before any work. A bad config is one ConfigError
whose message says every problem found, one line each (with one problem, that one line), all at
once: a user who fixes what one refusal says is not refused again for something it left out.
1. every key is one of the schema's (a misspelt `+key=` would otherwise train without it);
2. every number finite, and in the range its field declares (config/ `bounded`);
3. the config without the unknown keys typed as config.RunConfig, and every registered option's
   own check (options/registry.py);
4. every rule between sections (options/rules.py) whose sections all passed 1-3: a rule compares
   values each section vouched for;
5. the options' later checks, which build or reach out (the optimizer's class, the tracking
   store), of the sections that passed 1-3, unless `leave` names them: a sweep leaves them to
   each run's own process; then the later rules whose sections passed those too.
What one stage relies on is a section's own values, so a problem holds back only the checks of
its own section's later stages, never another section's."""
from __future__ import annotations

import copy
import difflib
import math
from dataclasses import MISSING, is_dataclass
from typing import Any, Collection, Iterator, List, Set, Tuple, Union, get_type_hints

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from bertaccel.config import ConfigError, RunConfig, schema_fields


def _refuse(found: List[str]) -> None:
    """The problems found, if any, as the run's refusal: one line each, each said once."""
    if found:
        raise ConfigError("\n".join(dict.fromkeys(found)))


def _leaves(node: Any, key: str = "") -> Iterator[Tuple[str, Any]]:
    """Every value of a composed config with its dotted key (list items as key[i])."""
    if isinstance(node, DictConfig):
        for k in node.keys():
            # (??? : a required value, refused by its own check; !s: keys are str, OmegaConf's type allows bytes)
            if not OmegaConf.is_missing(node, k):
                yield from _leaves(node[k], f"{key}.{k!s}" if key else str(k))
    elif isinstance(node, ListConfig):
        for i in range(len(node)):
            yield from _leaves(node[i], f"{key}[{i}]")
    else:
        yield key, node


def unknown_setting(key: str) -> str:
    """The one line for a key the schema does not have, given plainly (Hydra refuses it while it
    composes: run.input_error) or added with `+` (Hydra adds it: unknown_keys): the same line."""
    leaves = [k for k, _ in schema_fields()]
    blocks = {k.rsplit(".", i)[0] for k in leaves for i in range(1, k.count(".") + 1)}  # train, optimizer ...
    block, _, name = key.rpartition(".")
    if block in blocks:  # a misspelt name in a real block (train.bacth_size): its names only
        names = [k.rpartition(".")[2] for k in leaves if k.rpartition(".")[0] == block]
        close = [f"{block}.{n}" for n in difflib.get_close_matches(name, names, n=1, cutoff=0.6)]
    else:  # a misspelt block or top-level key (trian.epochs, precison)
        close = difflib.get_close_matches(key, leaves + sorted(blocks), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else ""
    return (f"{key} is not a setting of bertaccel{hint} (the settings: docs/reference/config.md, "
            "or python -m bertaccel.run --cfg job)")


def unknown_keys(cfg: DictConfig) -> List[str]:
    """Every key of the composed config that is not one of the schema's. Hydra refuses an unknown key
    typed plainly, but `+key=value` (and `++`) adds it to the struct config: the run would log it as
    a param and train without it (+train.bacth_size=64 trained at the default batch size). Below a
    field that is not a block of the schema (optimizer.impl, a Dict: the optimizer class's own
    settings, which its check_built asks the class about), the keys are the user's."""
    return [unknown_setting(key) for key in _unknown_paths(cfg)]


def _unknown_paths(cfg: DictConfig) -> List[str]:
    """The dotted keys unknown_keys refuses."""
    found: List[str] = []

    def walk(node: DictConfig, cls: type, prefix: str) -> None:
        hints = get_type_hints(cls)
        for k in node.keys():
            key = f"{prefix}{k!s}"
            if k not in hints:
                found.append(key)
            elif is_dataclass(hints[k]) and isinstance(node[k], DictConfig):
                walk(node[k], hints[k], f"{key}.")

    walk(cfg, RunConfig, "")
    return found


def _without(cfg: DictConfig, keys: List[str]) -> DictConfig:
    """A copy of cfg without these keys (the unknown ones: typed() could not hold them)."""
    if not keys:
        return cfg
    cfg = copy.deepcopy(cfg)
    for key in keys:
        parent, _, name = key.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        with open_dict(node):
            node.pop(name)
    return cfg


def _root(key: str) -> str:
    """The top-level setting a dotted key belongs to (train.epochs -> train, model[0] -> model)."""
    return key.split(".", 1)[0].split("[", 1)[0]


def _failed(roots: Set[str], section: str) -> bool:
    """Whether a section (an option's, or a rule's read) had a problem at one of these top-level
    keys: its own (train, num_gpus), or a top-level setting of its family (accumulation_max is
    accumulation's)."""
    return any(root == section or root.startswith(section + "_") for root in roots)


def check_known_keys(cfg: DictConfig) -> None:
    """Refuses the keys the schema does not have (unknown_keys), one line each."""
    _refuse(unknown_keys(cfg))


def not_finite(cfg: DictConfig) -> List[str]:
    """No NaN or infinity anywhere, schema field or an option's own setting (optimizer.impl's betas,
    eps ...): a range check cannot catch NaN (every comparison with it is false), and no setting
    here means anything by one: a timeout or a limit of inf would read as "none" by accident."""
    return [why for _, why in _not_finite(cfg)]


def _not_finite(cfg: DictConfig) -> List[Tuple[str, str]]:
    """not_finite's lines with their keys."""
    defaults = {key: f.default for key, f in schema_fields()}
    found = []
    for key, value in _leaves(cfg):
        if isinstance(value, float) and not math.isfinite(value):
            example = defaults.get(key, MISSING)
            hint = (f", e.g. {key}={example:g}" if isinstance(example, (int, float)) and not isinstance(example, bool)
                    else f", or null ({key}=null)" if example is None else "")
            found.append((key, f"{key}={value!r} is not a finite number; give a finite value{hint}"))
    return found


def out_of_range(cfg: DictConfig, schema: type = RunConfig) -> List[str]:
    """Every numeric field's range, declared on the field in config/ (`bounded`); schema: what
    cfg is (a hardware profile's file is a HardwareConfig: options/hardware.py load_profiles)."""
    return [why for _, why in _out_of_range(cfg, schema)]


def _out_of_range(cfg: DictConfig, schema: type = RunConfig) -> List[Tuple[str, str]]:
    """out_of_range's lines with their keys."""
    found = []
    for key, f in schema_fields(schema):
        declared = f.metadata.get("range")
        value = OmegaConf.select(cfg, key)
        if isinstance(value, float) and not math.isfinite(value):
            continue  # (not_finite says it)
        why = declared.refusal(key, value) if declared is not None else None
        if why:
            found.append((key, why))
    return found


def typed(cfg: Union[DictConfig, RunConfig]) -> RunConfig:
    """The composed config as the schema's own objects (RunConfig, PrecisionConfig ...), so the
    checks read typed fields: a mistyped attribute is an AttributeError there, not a None."""
    if isinstance(cfg, RunConfig):
        return cfg
    composed: Union[DictConfig, ListConfig] = cfg
    if OmegaConf.get_type(cfg) is not RunConfig:  # (a run's own process gets the config as plain data)
        composed = OmegaConf.merge(OmegaConf.structured(RunConfig), cfg)
    run = OmegaConf.to_object(composed)
    if not isinstance(run, RunConfig):  # (a merge onto RunConfig's structured config becomes one)
        raise TypeError(f"typed(): the config became a {type(run).__name__}, not a RunConfig")
    return run


def sound(run: RunConfig, failed: Collection[str] = ()) -> Tuple[List[str], Set[str]]:
    """Every registered option's own problems, then every rule's between sections whose sections
    all passed (a rule compares values each section vouched for); and the top-level keys with a
    problem, failed's and the options' own. failed: the keys that already had one (an unknown key,
    a number out of range): their rules are not asked, and their option's own check may find what
    it relies on out of range (a division by a count refused as 0): it then leaves it to the line
    already said."""
    from bertaccel.options.registry import options
    from bertaccel.options.rules import rules_at

    found, roots = [], set(failed)
    for option in options():
        try:
            own = option.check(run)
        except Exception:  # noqa: BLE001 - only where its section's values were refused already
            if not _failed(roots, option.section):
                raise
            own = []
        if own:
            roots.add(option.section)
            found += own
    return found + [why for rule in rules_at("check") if not any(_failed(roots, r) for r in rule.reads)
                    for why in [rule.refusal(run)] if why], roots


def later(run: RunConfig, leave: Collection[str], failed: Collection[str] = ()) -> List[str]:
    """The options' later checks (they build or reach out), but those `leave` names and those of
    a section with a problem already (failed: the top-level keys that had one); then the later
    rules (options/rules.py) whose sections all passed theirs. A section whose later checks are
    left has not vouched for what they check: its later rules are left with them."""
    from bertaccel.options.registry import options
    from bertaccel.options.rules import rules_at

    found, unsure = [], set(failed)
    for option in options():
        if _failed(set(failed), option.section):
            continue
        for check in option.later:
            why = None if option.later_name(check) in leave else check(run)
            if why or option.later_name(check) in leave:
                unsure.add(option.section)
            if why:
                found.append(why)
    return found + [why for rule in rules_at("later") if not any(_failed(unsure, r) for r in rule.reads)
                    for why in [rule.refusal(run)] if why]


def validate(cfg: Union[DictConfig, RunConfig], leave: Collection[str] = ()) -> RunConfig:
    """Raise ConfigError saying every problem found, one line each (see the module's docstring);
    return the config typed (RunConfig) when there is none.
    leave: the names (optimizer.check_built, tracking.check_store) of later checks not asked here,
    because the run's own process asks them (runs/launch.py, runs/sweep_plan.py)."""
    composed = OmegaConf.structured(cfg) if isinstance(cfg, RunConfig) else cfg
    unknown = _unknown_paths(composed)
    known = _without(composed, unknown)
    values = _not_finite(known) + _out_of_range(known)
    failed = {_root(key) for key in unknown + [key for key, _ in values]}
    run = typed(known)
    own, failed = sound(run, failed)
    # (a value already refused as a number is not said again by its option's own check:
    # `hardware.pue=nan` is one line, not "not finite" and then "must be >= 1")
    own = [why for why in own if not any(why.startswith(f"{key}=") for key, _ in values)]
    found = [unknown_setting(key) for key in unknown] + [why for _, why in values] + own
    _refuse(found + later(run, leave, failed))
    return run


def ask_later(run: RunConfig, names: Collection[str]) -> None:
    """The later checks `names` (those a validate(leave=...) left, e.g. to the run's own process)
    asked of a config validate() typed already: those checks alone, no second conversion. Raises
    ConfigError saying every problem, one line each."""
    _refuse(later(run, [name for name in check_names() if name not in names]))


def check_names() -> List[str]:
    """The names `leave` may give: every option's later checks."""
    from bertaccel.options.registry import options

    return [option.later_name(check) for option in options() for check in option.later]
