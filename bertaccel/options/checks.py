"""validate(): every setting of a run checked before any work, the first bad one raised as a
ConfigError in one line that names it and says how to fix it. The numbers are checked here, over
the whole schema (config.py declares each field's range); every option then checks its own
values and combinations in its own module, through one `check(cfg) -> Optional[str]`, asked in
the order of option_checks()."""
from __future__ import annotations

import difflib
import math
from dataclasses import MISSING, is_dataclass
from typing import Any, Callable, Collection, Iterator, Optional, Tuple, get_type_hints

from omegaconf import DictConfig, ListConfig, OmegaConf

from bertaccel.config import ConfigError, RunConfig, schema_fields


def _refuse(why: Optional[str]) -> None:
    """An option's own check says why it cannot run (or None): that is the run's one line."""
    if why:
        raise ConfigError(why)


def _leaves(node: Any, key: str = "") -> Iterator[Tuple[str, Any]]:
    """Every value of a composed config with its dotted key (list items as key[i])."""
    if isinstance(node, DictConfig):
        for k in node.keys():
            if not OmegaConf.is_missing(node, k):  # (??? : a required value, refused by its own check)
                yield from _leaves(node[k], f"{key}.{k}" if key else str(k))
    elif isinstance(node, ListConfig):
        for i in range(len(node)):
            yield from _leaves(node[i], f"{key}[{i}]")
    else:
        yield key, node


def unknown_setting(key: str) -> str:
    """The one line for a key the schema does not have, given plainly (Hydra refuses it while it
    composes: run.input_error) or added with `+` (Hydra adds it: check_known_keys): the same line."""
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


def check_known_keys(cfg: Any) -> None:
    """Every key of the composed config is one of the schema's. Hydra refuses an unknown key typed
    plainly, but `+key=value` (and `++`) adds it to the struct config: the run would log it as a
    param and train without it (+train.bacth_size=64 trained at the default batch size). Below a
    field that is not a block of the schema (optimizer.impl, a Dict: the optimizer class's own
    settings, which its check_built asks the class about), the keys are the user's."""
    def walk(node: DictConfig, cls: type, prefix: str) -> None:
        hints = get_type_hints(cls)
        for k in node.keys():
            key = f"{prefix}{k}"
            if k not in hints:
                raise ConfigError(unknown_setting(key))
            if is_dataclass(hints[k]) and isinstance(node[k], DictConfig):
                walk(node[k], hints[k], f"{key}.")

    if isinstance(cfg, DictConfig):
        walk(cfg, RunConfig, "")


def _finite_everywhere(cfg: Any) -> None:
    """No NaN or infinity anywhere, schema field or an option's own setting (optimizer.impl's betas,
    eps ...): a range check cannot catch NaN (every comparison with it is false), and no setting
    here means anything by one: a timeout or a limit of inf would read as "none" by accident."""
    defaults = {key: f.default for key, f in schema_fields()}
    for key, value in _leaves(cfg):
        if isinstance(value, float) and not math.isfinite(value):
            example = defaults.get(key, MISSING)
            hint = (f", e.g. {key}={example:g}" if isinstance(example, (int, float)) and not isinstance(example, bool)
                    else f", or null ({key}=null)" if example is None else "")
            raise ConfigError(f"{key}={value!r} is not a finite number; give a finite value{hint}")


def _declared_ranges(cfg: Any) -> None:
    """Every numeric field's range, declared on the field in config.py (`bounded`)."""
    for key, f in schema_fields():
        declared = f.metadata.get("range")
        if declared is not None:
            _refuse(declared.refusal(key, OmegaConf.select(cfg, key)))


def option_checks() -> Tuple[Callable[[Any], Optional[str]], ...]:
    """Every option's check, in the order validate() asks them: the first refusal is the one
    raised, so this order is part of what a bad config prints. Imported here, not at the top:
    several option modules import torch, and the sweep process imports this module first."""
    from bertaccel.attention import option as attention
    from bertaccel.encoder import option as encoder
    from bertaccel.measure import carbon
    from bertaccel.options import accumulation, cache_dir
    from bertaccel.options import compile as compiling  # (the module's name is the option's; not the builtin)
    from bertaccel.options import dataset, freezing, launcher, model, optimizer, precision, search, tracking, train

    return (precision.check, attention.check, encoder.check, compiling.check, accumulation.check, freezing.check, optimizer.check,
            optimizer.check_built, carbon.check, freezing.check_num_gpus, launcher.check, model.check, dataset.check, train.check,
            search.check, cache_dir.check, tracking.check,
            tracking.check_store)  # last: it may wait on the network


def validate(cfg: Any, leave: Collection[str] = ()) -> None:
    """Raise ConfigError with one line naming the first bad value and how to fix it.
    leave: the names ("optimizer.check_built") of checks not asked here, because the run's own
    process asks them first (runs/launch.py)."""
    # Every key first: one the schema lacks would be refused by nothing else. Then every number:
    # finite, then in its field's declared range; the options' checks can then compare, divide
    # and combine values knowing each one is sane on its own.
    check_known_keys(cfg)
    _finite_everywhere(cfg)
    _declared_ranges(cfg)
    for check in option_checks():
        if check_name(check) not in leave:
            _refuse(check(cfg))


def check_section(check: Callable[..., Any]) -> str:
    """The section a check belongs to, by its module's name: options/<section>.py, or
    <section>/option.py (attention, encoder), or measure/carbon.py (the carbon block)."""
    parts = check.__module__.split(".")
    return parts[-2] if parts[-1] == "option" else parts[-1]


def check_name(check: Callable[..., Any]) -> str:
    """A check's name as `leave` names it: <section>.<function> (optimizer.check_built)."""
    return f"{check_section(check)}.{check.__name__}"
