"""A command line's config composed outside hydra.main, as `python -m bertaccel.run` composes it:
for the plan (plan/grid.py) and for the run's refusals (run.cli).

- The user's own folder of studies (`--config-dir mine --config-name X`) goes on the search path
  where Hydra's own --config-dir puts it, so plan finds the study `run -m` runs (Hydra's
  `hydra.searchpath` override cannot: the primary config is looked up before it applies).
- A folder that is not there, or a study (or option) file that is not valid YAML, is one line
  naming it, and the line and what YAML expected there (study_error), not a traceback.
- Hydra stops at the first override it cannot apply (`train.batchsize=3`: not in struct), so the
  bad values beside it would be said only once it is fixed. every_problem composes again without
  each override Hydra refuses, then validates what composes: typos and bad values in one refusal.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, List, Optional, Sequence

if TYPE_CHECKING:  # (Hydra is imported lazily here: the names only)
    from hydra.core.config_loader import ConfigLoader
    from hydra.core.override_parser.types import Override

# Override prefixes by Hydra's OverrideType name (rebuilding a sweep override at its first value).
_PREFIX = {"CHANGE": "", "ADD": "+", "FORCE_ADD": "++", "DEL": "~"}


class StudyError(ValueError):
    """A --config-dir that cannot be used; the message is the one line the user sees."""


def study_dir(config_dir: str) -> Path:
    """The folder of the user's studies, absolute (as Hydra makes it: from where they run)."""
    path = Path(os.path.expanduser(config_dir)).absolute()
    if not path.is_dir():
        what = "is a file, not a folder" if path.exists() else "no such folder"
        raise StudyError(f"--config-dir {config_dir}: {what} ({path}); give the folder that holds your studies "
                         "(YAML files like bertaccel/sweeps/quick.yaml), or leave --config-dir out")
    return path


@contextmanager
def composing(config_dir: Optional[str] = None, job_name: str = "app") -> Iterator[ConfigLoader]:
    """Hydra set up with bertaccel's config groups, its studies and the user's --config-dir, as
    run.py's hydra.main sets it up; yields its config loader. Hydra's global state is cleared after."""
    from hydra import version
    from bertaccel.hydra_adapter import Hydra, create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.global_hydra import GlobalHydra

    from bertaccel.config import CONF_DIR, register_configs

    register_configs()
    version.setbase("1.3")
    search_path = create_config_search_path(str(CONF_DIR))
    if config_dir is not None:
        # (where Hydra's --config-dir goes: after bertaccel's own folders, before the schema)
        search_path.prepend(provider="command-line", path=f"file://{study_dir(config_dir)}",
                            anchor=SearchPathQuery(provider="schema"))
    GlobalHydra.instance().clear()
    try:
        Hydra.create_main_hydra2(task_name=job_name, config_search_path=search_path)
        yield GlobalHydra.instance().config_loader()
    finally:
        GlobalHydra.instance().clear()


def study_error(e: BaseException) -> Optional[str]:
    """One line for a folder of studies that is not there or a config file that is not valid YAML
    (Hydra lets both through as they are), or None for any other error."""
    import yaml
    from hydra.errors import SearchPathException

    if isinstance(e, StudyError):
        return str(e)
    if isinstance(e, SearchPathException) and "not found" in str(e):  # (run.py: Hydra's own --config-dir check)
        folder = str(e).split("'")[1] if str(e).count("'") >= 2 else "the folder"
        return (f"--config-dir {folder}: no such folder; give the folder that holds your studies (YAML files "
                "like bertaccel/sweeps/quick.yaml), or leave --config-dir out")
    if not isinstance(e, yaml.YAMLError):
        return None
    from bertaccel.config import first_line

    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    if mark is None:
        return f"a config file is not valid YAML: {first_line(e)}; fix its syntax"
    what = getattr(e, "problem", None) or first_line(e)
    context, start = getattr(e, "context", None), getattr(e, "context_mark", None)
    if context and start is not None and start.line != mark.line:
        what += f" ({context} that starts on line {start.line + 1})"
    return (f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}: not valid YAML: {what}; "
            "fix the file there and run the same command again")


def _culprit(e: BaseException) -> Optional[str]:
    """The key (or config group) of the override Hydra refused, when the error names one."""
    missing = getattr(e, "missing_cfg_file", None)  # group=option that is no option: the group
    if isinstance(missing, str) and "/" in missing:
        return missing.rsplit("/", 1)[0]
    key = getattr(e.__cause__, "full_key", None)
    text = str(e)
    if isinstance(key, str) and key and not key.startswith("hydra.") and text.startswith(("Could not override", "Error merging override")):
        return key
    return None


def _names(override: Override, key: str) -> bool:
    own = override.key_or_group
    return own == key or own.startswith(key + ".")


def _first_value(override: Override) -> Optional[str]:
    """A sweep override at its first value (the sweep's first configuration), else as typed."""
    if not override.is_sweep_override():
        return override.input_line
    try:
        value = next(iter(override.sweep_string_iterator()))
    except Exception:  # noqa: BLE001 - an empty sweep or an interval: not a grid's, left out
        return None
    return f"{_PREFIX.get(override.type.name, '')}{override.get_key_element()}={value}"


def every_problem(error: BaseException, config_name: str, config_dir: Optional[str], overrides: Sequence[str],
                  multirun: bool, word: Callable[[BaseException], str]) -> List[str]:
    """The lines of a command line Hydra refused while composing: the error's (word: run.input_error),
    then each other override Hydra refuses, then every problem validate() finds in the config
    composed without them (of a sweep: its first configuration; no check that builds or reaches
    out). Only the error's line where it names no override of the command line."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from hydra.types import RunMode
    from omegaconf import open_dict
    from omegaconf.errors import OmegaConfBaseException

    from bertaccel.config import ConfigError
    from bertaccel.options.checks import validate
    # (what a refused command line leaves unasked, as a sweep's plan does: they build the optimizer or reach the store)
    from bertaccel.runs.checked import LEFT_TO_THE_RUNS

    lines = [word(error)]
    parser = OverridesParser.create()
    parsed = []
    for text in overrides:
        try:
            parsed += parser.parse_overrides([text])
        except HydraException as e:  # (OverrideParseException: each unreadable one said)
            lines.append(word(e))
    key = _culprit(error)
    if key is None or not any(_names(o, key) for o in parsed):
        return list(dict.fromkeys(lines))
    try:
        with composing(config_dir) as loader:
            while key is not None:
                parsed = [o for o in parsed if not _names(o, key)]
                given = [line for line in map(_first_value if multirun else (lambda o: o.input_line), parsed) if line]
                try:
                    cfg = loader.load_configuration(config_name, given, run_mode=RunMode.RUN)
                except (HydraException, OmegaConfBaseException) as e:
                    lines.append(word(e))
                    key = _culprit(e)
                    if key is None or not any(_names(o, key) for o in parsed):
                        break
                    continue
                with open_dict(cfg):
                    del cfg["hydra"]
                try:
                    validate(cfg, leave=LEFT_TO_THE_RUNS)
                except ConfigError as e:
                    lines += str(e).splitlines()
                break
    except Exception:  # noqa: BLE001 - the refusal stands on the error's own line
        pass
    return list(dict.fromkeys(lines))


def every_problem_of_argv(error: BaseException, argv: Sequence[str], word: Callable[[BaseException], str]) -> List[str]:
    """every_problem of `python -m bertaccel.run ARGV` (read with Hydra's own argument parser)."""
    from bertaccel.hydra_adapter import get_args_parser

    try:
        args, _ = get_args_parser().parse_known_args(list(argv))
    except BaseException:  # noqa: BLE001 - (argparse exits on what it cannot read)
        return [word(error)]
    return every_problem(error, args.config_name or "config", args.config_dir, args.overrides, args.multirun, word)
