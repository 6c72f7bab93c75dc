"""What an option is and how it says a problem, below everything else (the schema, config/, uses
it): `Option`, the base of the one object each config group or block registers
(options/registry.py lists them); ConfigError (the run's refusal, one line per problem); a numeric
field's declared Range (`bounded` on the schema); the named-choices and count-or-word forms the
checks say their refusals in; `first_line`, the one line an exception becomes wherever a
message is shown to the user; and `user_path`, the one expansion of every path written to."""
from __future__ import annotations

import json
import os
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterable, List, Mapping, Optional, Tuple

# (cfg below is a config.RunConfig and device a torch.device: the base layer imports neither)


def user_path(text: Any) -> Path:
    """The one way a path bertaccel writes to is read, its defaults' (cache_dir's
    "~/.cache/bertaccel") and the user's alike: `~` and environment variables expanded, then
    absolute (from the working directory). Path("~/...") alone is a folder named `~` in the
    working directory (a plan saved there was not found from another one, and `rm -rf ~` of it
    deletes the home). A variable that is not set stays `$NAME` (options/cache_dir.py refuses it)."""
    return Path(os.path.expandvars(os.path.expanduser(str(text)))).absolute()


def first_line(e: Any, *, limit: Optional[int] = None, default: Optional[str] = None, last: bool = False) -> str:
    """The first (last=True: the last) non-empty line of an exception's message (or of a text),
    stripped and cut to `limit` characters; `default` when there is none (the exception's type
    name unless given). Hydra and OmegaConf wrap their causes in several lines: one is shown."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    if not lines:
        return type(e).__name__ if default is None else default
    return (lines[-1] if last else lines[0])[:limit]


class ConfigError(ValueError):
    """A config value that cannot work; the message is the one line the user sees."""


@dataclass(frozen=True)
class Range:
    """The values a numeric setting may take, declared on its field (`bounded`) so the setting and
    its check have one home; checks.py walks the schema and applies every declared Range. A null
    passes: an Optional field's null has its own meaning, said in the field's comment and note.
    Written as `not (value > low)` etc., so NaN is refused here too, not only by the finite check."""
    gt: Optional[float] = None
    ge: Optional[float] = None
    lt: Optional[float] = None
    le: Optional[float] = None
    note: str = ""  # why the range, or what null means: said with the refusal

    def text(self) -> str:
        def num(x: float) -> str:  # 4294967295, not 4.29497e+09
            return str(int(x)) if float(x).is_integer() else f"{x:g}"

        low = f"[{num(self.ge)}" if self.ge is not None else f"({num(self.gt)}" if self.gt is not None else None
        high = f"{num(self.le)}]" if self.le is not None else f"{num(self.lt)})" if self.lt is not None else None
        if low and high:
            return f"in {low}, {high}"
        if low:
            return (">= " if self.ge is not None else "> ") + low[1:]
        if high:
            return ("<= " if self.le is not None else "< ") + high[:-1]
        raise ValueError("a Range declares at least one bound (bounded(..., gt=/ge=/lt=/le=))")

    def refusal(self, key: str, value: Any) -> Optional[str]:
        """Why `key=value` is out of range (one line), or None."""
        if value is None:
            return None
        ok = ((self.gt is None or value > self.gt) and (self.ge is None or value >= self.ge)
              and (self.lt is None or value < self.lt) and (self.le is None or value <= self.le))
        if ok:
            return None
        return f"{key}={value!r} must be {self.text()}" + (f" ({self.note})" if self.note else "")


def not_one_of(key: str, value: Any, allowed: Iterable[str]) -> Optional[str]:
    """Why `key=value` is none of a setting's named options (one line), or None. allowed: the
    names, or a mapping keyed by them (what each name is)."""
    return None if value in allowed else f"{key}={value!r} is not one of {', '.join(allowed)}"


def not_count_or(key: str, value: Any, word: str) -> Optional[str]:
    """Why an Any-typed setting (accumulation, train.batch_size) is neither an integer >= 1 nor
    its one word (adaptive, auto), or None. bool is refused: true would count as 1."""
    if value == word or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return None
    return f"{key}={value!r} must be an integer >= 1 or {word}"


def bounded(default: Any, *, gt: Optional[float] = None, ge: Optional[float] = None, lt: Optional[float] = None,
            le: Optional[float] = None, note: str = "") -> Any:
    """A numeric schema field with its range: `lr: float = bounded(5e-5, gt=0)`."""
    return field(default=default, metadata={"range": Range(gt, ge, lt, le, note)})


class Option:
    """One config group or block, subclassed once in the module that is its home:
    - `section` and `schema`: the config key it owns (a group, a block, or a top-level setting)
      and the dataclass that types it, in its own module of config/ (None for a top-level
      setting); the registry holds it equal to RunConfig's type of the section;
    - `check(cfg)`: every problem of its own values, one line each (a list, not the first);
    - `later`: checks that build or reach out (an optimizer class, the tracking store), asked once
      its own section is sound (no unknown key, number out of range or own problem), and left to the run's own process where that is cheaper
      (`validate(leave=...)` names them `<section>.<function>`);
    - `unusable(cfg, device, caps)`: why this machine cannot run it (a skip, not bad input), or None.
    Each reads its own section only: a combination of several sections is no option's, it is a
    row of options/rules.py's table (tests/test_typed_registry.py holds both)."""
    section: str = ""
    schema: Optional[type] = None
    # (cfg) -> one line or None each, asked when the section's own keys, numbers and `check` found nothing.
    later: Tuple[Callable[[Any], Optional[str]], ...] = ()

    def check(self, cfg: Any) -> List[str]:
        """Every problem of this section's own values, one line each ([] when there is none)."""
        return []

    def unusable(self, cfg: Any, device: Any, caps: Any) -> Optional[str]:
        """Why this machine cannot run the section's choice (a skip, not bad input), or None."""
        return None

    def later_name(self, check: Callable[..., Any]) -> str:
        """A later check's name as validate(leave=...) gives it: <section>.<function>."""
        return f"{self.section}.{check.__name__}"

    def from_params(self, params: Mapping[str, str]) -> Any:
        """This section read back from a logged run's settings (record.run_settings, or the plan's
        flattened config): its schema's dataclass, typed (read_back). An option whose values a log
        spells otherwise says so by overriding this (compile: YAML 1.1's false for off)."""
        return read_back(self.schema, self.section, params)


def problems(*lines: Optional[str]) -> List[str]:
    """The lines that say something (an option's check collects its findings with it)."""
    return [line for line in lines if line]


def _parsed(text: str, hint: Any) -> Any:
    """One logged value (record.tracking.flatten's str: "null", "True", JSON lists) as its field's type."""
    args = typing.get_args(hint)
    if type(None) in args:  # Optional[X]
        return None if text in ("null", "None") else _parsed(text, next(a for a in args if a is not type(None)))
    if hint is bool:
        return text.lower() == "true"
    if hint in (int, float):
        return hint(text)
    if hint is str:
        return text
    try:  # lists (JSON), and an Any or a dict's value: a number, a bool, null, or the text itself
        return json.loads(text.replace("True", "true").replace("False", "false").replace("None", "null"))
    except ValueError:
        return text


def read_back(schema: Any, section: str, params: Mapping[str, str]) -> Any:
    """A section's dataclass from a logged run's flattened settings (`<section>.<field>`; a dict
    field from its `<section>.<field>.<key>` entries); a field not logged keeps its default."""
    hints = typing.get_type_hints(schema)
    values = {}
    for f in fields(schema):
        key = f"{section}.{f.name}"
        if typing.get_origin(hints[f.name]) in (dict, typing.Dict) or hints[f.name] is dict:
            inner = {k[len(key) + 1:]: _parsed(str(v), Any) for k, v in params.items() if k.startswith(key + ".")}
            if inner:
                values[f.name] = inner
        elif key in params:
            values[f.name] = _parsed(str(params[key]), hints[f.name])
    return schema(**values)


