"""Rows for the report: from an MLflow experiment (optionally one sweep) or from a CSV file."""
from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .runinfo import accuracy_histories, finite_metrics, group_keys, not_finite, run_fields
from .scoring import METRICS, THESIS_TERMS, Row
from .timing import COMPILE_MODES, pairing_key


class ReportInputError(ValueError):
    """Bad report input; the message is the one line the user sees."""


BLANK = ("", "null", "none", "nan", "n/a")  # a CSV cell saying "not measured"


def _number(text: str, where: str, hint: str) -> float:
    """text as a finite number; ReportInputError names where, and hint says what to give instead."""
    try:
        value = float(text.strip().rstrip("%"))
    except ValueError:
        raise ReportInputError(f"{where}: {text.strip()!r} is not a number ({hint})") from None
    if not math.isfinite(value):
        raise ReportInputError(f"{where}: {text.strip()!r} is not a finite number ({hint})")
    return value


@dataclass(frozen=True)
class Column:
    """One number or text a user gives, its one home: a CSV column (the Row field it fills) or a
    command-line value such as --accuracy-floor or a weight; its type, the values it may take and
    what it means (the meaning ends every out-of-range error, as the hint to fix it)."""
    name: str
    meaning: str
    kind: str = "number"              # number | count (whole number > 0) | compile (a mode) | text
                                      # | series (numbers separated by ';', one per epoch)
    low: Optional[float] = None       # smallest value allowed
    low_open: bool = False            # low itself not allowed (> low)
    high: Optional[float] = None      # largest value allowed
    field: str = ""                   # Row field, when it is not the column's name
    required: bool = False            # one of the six columns every CSV has
    default: Optional[int] = None     # taken when the column is absent (not when a cell is empty)

    @property
    def attr(self) -> str:
        return self.field or self.name

    @property
    def allowed(self) -> str:
        """'> 0', '>= 0', 'in [0, 1]', or '' when any number goes."""
        if self.kind == "count":
            return "a whole number > 0"
        if self.low is not None and self.high is not None:
            return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        return ""

    def parse(self, text: str, where: str, given: bool = False) -> Any:
        """The cell's value (None = empty: not measured); ReportInputError names where and why.
        given: a value the user must give (a flag, a weight), where empty or nan is refused."""
        if self.kind == "text":
            return text.strip()
        if self.kind == "series":  # each value as a number of this column (range included)
            cells = [c for c in text.split(";") if c.strip()]
            number = Column(self.name, self.meaning, low=self.low, low_open=self.low_open, high=self.high)
            values = tuple(number.parse(c, f"{where} value {k}") for k, c in enumerate(cells, 1))
            if any(v is None for v in values):
                raise ReportInputError(f"{where}: an empty value in {text.strip()!r} ({self.meaning})")
            return values
        if self.kind == "compile":
            mode = text.strip().lower()
            if mode and mode not in COMPILE_MODES:
                raise ReportInputError(f"{where}: {text.strip()!r} is not a compile mode ({', '.join(COMPILE_MODES)})")
            return mode
        if not given and text.strip().lower() in BLANK:
            return None
        value = _number(text, where, self.meaning if given else "leave the cell empty for 'not measured'")
        if self.kind == "count":
            if value <= 0 or value != int(value):
                raise ReportInputError(f"{where}: {text.strip()!r} is not {self.allowed} ({self.meaning})")
            return int(value)
        low_ok = self.low is None or (value > self.low if self.low_open else value >= self.low)
        if not low_ok or (self.high is not None and value > self.high):
            raise ReportInputError(f"{where}: {text.strip()!r} must be {self.allowed} ({self.meaning})")
        return value


def parse_weights(text: str) -> Tuple[float, ...]:
    """'0.4,0.4,0.1,0.1' or '0.3,0.3,0.1,0.1,0.2' -> weights; raises ValueError with the reason."""
    # Weights are relative: any finite numbers >= 0 will do. A nan or inf one would make every
    # score nan, and min() would still crown a "best" row.
    weight = Column("weight", "weights are relative numbers >= 0, e.g. 0.3,0.3,0.3,0.1", low=0)
    parts = text.replace(" ", "").split(",")
    if len(parts) not in (THESIS_TERMS, len(METRICS)):
        raise ValueError(f"--weights {text!r}: give four numbers w1,w2,w3,w4 (time, cost, energy, occupancy), "
                         "or five with w5 for carbon (co2e_kg)")
    w = tuple(weight.parse(p, f"--weights {text!r} w{k}", given=True) for k, p in enumerate(parts, 1))
    if sum(w) == 0:
        raise ValueError(f"--weights {text!r}: weights must not all be 0")
    if not math.isfinite(sum(w)):
        raise ValueError(f"--weights {text!r}: too large to add up; weights are relative, so scale them down, "
                         "e.g. 0.3,0.3,0.3,0.1")
    return w  # type: ignore[return-value]


NOT_MEASURED_HINT = "leave the cell empty if not measured"
COLUMNS = (
    Column("name", "the run's name", kind="text", required=True),
    Column("time_s", f"the training windows in seconds; {NOT_MEASURED_HINT}", low=0, low_open=True, required=True),
    Column("cost_usd", f"US dollars; {NOT_MEASURED_HINT}", low=0, required=True),
    Column("energy_kwh", f"kilowatt-hours; {NOT_MEASURED_HINT}", low=0, required=True),
    Column("occupancy_pct", f"SM occupancy as a percentage, 0 to 100; {NOT_MEASURED_HINT}", low=0, high=100,
           required=True),
    Column("accuracy", f"test accuracy as a fraction, 0.85 for 85%; {NOT_MEASURED_HINT}", low=0, high=1,
           required=True),
    Column("hardware", "what ran it, for the plots' colours", kind="text"),
    Column("precision", "fp32, bf16, ..., for the plots' markers", kind="text"),
    # Timing inputs (--time total, --project-epochs, break-even): time_s stays the training
    # windows; compile_time_s is the one-time warm-up before them (0 = nothing compiled).
    Column("compile_time_s", "the one-time warm-up in seconds, 0 when nothing was compiled", low=0),
    Column("step_time_ms", "the steady-state milliseconds per optimizer step", low=0, low_open=True),
    Column("train_rows_full", "rows of the full train split", kind="count"),
    Column("batch_size", "rows per micro-batch and device", kind="count"),
    # A CSV without these two columns is of runs on one device without accumulation (the
    # thesis' own Table 5.1 names its multi-GPU runs instead); an empty cell is still "not measured".
    Column("accumulation", "micro-batches per optimizer step", kind="count", default=1),
    Column("num_gpus", "devices of the run", kind="count", default=1),
    Column("compile", "the torch.compile mode", kind="compile", field="compile_mode"),
    Column("config", "a name for the configuration, to pair compiled and uncompiled runs", kind="text",
           field="config_key"),
    # What a run was measured on (a projection's input), and whether a compiled run lasted
    # past its break-even.
    Column("epochs", "epochs the run trained", low=0, low_open=True),
    Column("train_rows", "rows trained per epoch", kind="count"),
    Column("optimizer_steps", "optimizer steps the run took", kind="count"),
    # How much the run trained in all: times of runs that trained different amounts are
    # compared per sample (render.py).
    Column("train_samples", "samples trained in all, over epochs and devices", kind="count"),
    # Repeats (report/repeats.py): rows of one group (else of one name) differ only in their seed.
    Column("seed", "the run's random seed", kind="text"),
    Column("group", "a name for the configuration apart from the seed: rows with the same group are repeats",
           kind="text"),
    # --occupancy-metric sm_active|tensor_active scores one of these as O instead of occupancy_pct.
    Column("sm_active_pct", f"SM activity as a percentage, 0 to 100; {NOT_MEASURED_HINT}", low=0, high=100),
    Column("tensor_active_pct", f"tensor-core activity as a percentage, 0 to 100; {NOT_MEASURED_HINT}", low=0,
           high=100),
    # What a run was measured on: rows that differ in these are ranked with a warning (report/gate.py).
    Column("device", "the device the run measured on (else the hardware column stands for it)", kind="text"),
    Column("dataset", "the dataset's name", kind="text"),
    Column("energy_source", "what measured energy_kwh, e.g. RAPL (CPU package) or NVML (GPU board)", kind="text"),
    Column("test_rows", "rows the accuracy was measured on", kind="count"),
    # --target-accuracy: the accuracy after each epoch and each epoch's training seconds.
    Column("epoch_accuracy", "test accuracy after each epoch, fractions separated by ';'", kind="series", low=0,
           high=1),
    Column("epoch_time_s", "each epoch's training seconds, separated by ';'", kind="series", low=0, low_open=True),
    # Carbon, the optional fifth score term (--weights name=w1,w2,w3,w4,w5).
    Column("co2e_kg", f"kilograms CO2-equivalent (energy x PUE x grid intensity); {NOT_MEASURED_HINT}", low=0),
)
CSV_COLUMNS = tuple(c.name for c in COLUMNS if c.required)
OPTIONAL_COLUMNS = tuple(c.name for c in COLUMNS if not c.required)

# MLflow metric for each report column.
MLFLOW_METRICS = {"time_s": "train_time_s", "cost_usd": "cost_usd", "energy_kwh": "energy_kwh",
                  "occupancy_pct": "occupancy_pct", "accuracy": "test_accuracy", "co2e_kg": "co2e_kg"}
# Row field -> (MLflow metric, whole number?) for the timing inputs (report/timing.py).
MLFLOW_TIMING_METRICS = {"compile_time_s": ("compile_time_s", False), "step_time_ms": ("step_time_ms", False),
                         "optimizer_steps": ("optimizer_steps", True), "train_rows": ("dataset_train_rows", True),
                         "train_rows_full": ("dataset_train_rows_full", True), "train_samples": ("train_samples", True)}
# Row field -> (MLflow param, whole number?): params are stored as strings.
MLFLOW_TIMING_PARAMS = {"batch_size": ("train.batch_size", True), "accumulation": ("accumulation", True),
                        "num_gpus": ("num_gpus", True), "epochs": ("train.epochs", False)}


def _csv_fields(rec: Dict[str, str], header: Sequence[str], where: str, problems: List[str]) -> Optional[Dict[str, Any]]:
    """Row fields from one CSV record, with why each absent or empty one is null (or filled);
    None when a cell is bad, each bad cell's line appended to problems."""
    bad = len(problems)
    fields: Dict[str, Any] = {}
    extra: Dict[str, str] = {}
    for col in COLUMNS:
        if col.name not in header:
            if col.default is not None:
                fields[col.attr] = col.default
                extra[col.attr] = f"no {col.name} column: taken as {col.default}"
            else:
                extra[col.attr] = f"no {col.name} column in the CSV"
            continue
        try:
            fields[col.attr] = col.parse(rec[col.name], f"{where} column {col.name}")
        except ReportInputError as e:
            problems.append(str(e))
            continue
        if fields[col.attr] in (None, "", ()):
            extra[col.attr] = "empty in the input" if not rec[col.name].strip() else \
                f"{rec[col.name].strip()!r} in the input: not measured"
    fields["extra"] = extra
    return fields if len(problems) == bad else None


SHOWN_PROBLEMS = 20  # bad cells named one line each; past it, one more line says how many more


def rows_from_csv(path: str, require: Sequence[Tuple[str, str]] = ()) -> List[Row]:
    """require: (optional column, what needs it) pairs, e.g. ("compile_time_s", "--time total").
    Read as data/csv_text.py reads a spreadsheet's CSV; every bad cell is named at once, one line
    each (ReportInputError's message has a line per problem)."""
    from bertaccel.data.csv_text import CsvTextError, read_path

    p = Path(path)
    if not p.is_file():
        raise ReportInputError(f"--csv {path}: " + ("is a folder; give a CSV file in it" if p.is_dir() else "no such file"))
    try:
        table = read_path(p, CSV_COLUMNS, [c.name for c in COLUMNS])
        return _rows_from_table(table, path, require)
    except CsvTextError as e:
        raise ReportInputError(f"--csv {path}: {e}") from None
    except OSError as e:
        raise ReportInputError(f"--csv {path}: cannot be read ({e.strerror})") from None
    except csv.Error as e:  # e.g. a field over the csv module's size limit: not a CSV of runs
        raise ReportInputError(f"--csv {path}: not a readable CSV ({e})") from None


_DECIMAL_COMMA = re.compile(r"(?<=\d),(?=\d)")


def _rows_from_table(table: Any, path: str, require: Sequence[Tuple[str, str]]) -> List[Row]:
    header = table.header
    missing = [c for c in CSV_COLUMNS if c not in header]
    if missing:
        raise ReportInputError(f"--csv {path}: missing column(s) {', '.join(missing)}; the header must have "
                               f"{','.join(CSV_COLUMNS)} (optional: {','.join(OPTIONAL_COLUMNS)})")
    for col, why in require:
        if col not in header:
            raise ReportInputError(f"--csv {path}: no {col} column, which {why} needs")
    # Excel in a locale with a decimal comma writes ';' between cells and 0,85 for 0.85.
    decimal_comma = table.delimiter == ";"
    numeric = {c.name for c in COLUMNS if c.kind in ("number", "count", "series")}
    rows, problems = [], []
    for lineno, fields in table.records:
        if not any(f.strip() for f in fields):
            continue  # a blank line (a spreadsheet's trailing empty row): no run
        where = f"--csv {path} line {lineno}"
        if len(fields) != len(header):
            problems.append(f"{where}: expected {len(header)} fields (as the header), found {len(fields)}")
            continue
        rec = {h: v for h, v in zip(header, fields) if h}
        if decimal_comma:
            rec = {h: _DECIMAL_COMMA.sub(".", v) if h in numeric and "." not in v else v for h, v in rec.items()}
        if not rec["name"].strip():
            problems.append(f"{where} column name: empty name")
        fields_or_none = _csv_fields(rec, header, where, problems)
        if fields_or_none is not None:
            rows.append(Row(**fields_or_none))
    if problems:
        more = len(problems) - SHOWN_PROBLEMS
        raise ReportInputError("\n".join(problems[:SHOWN_PROBLEMS] + (
            [f"--csv {path}: and {more} more bad cell(s) after these"] if more > 0 else [])))
    if not rows:
        raise ReportInputError(f"--csv {path}: no data rows")
    return rows


def _mlflow_timing(metrics: Mapping[str, float], params: Mapping[str, str], tags: Mapping[str, str]) -> Dict[str, Any]:
    """Row fields for --time total, --project-epochs and break-even, with why each is null."""
    from bertaccel.record.tracking import HASH_EXCLUDED_KEYS

    fields: Dict[str, Any] = {}
    extra: Dict[str, str] = {}
    for attr, (metric, whole) in MLFLOW_TIMING_METRICS.items():
        value = metrics.get(metric)
        if value is None:
            extra[attr] = tags.get(f"{metric}_source", "not logged")
        fields[attr] = int(value) if whole and value is not None else value
    # A run logged before train_samples was: its samples are throughput_samples_s x train_time_s
    # (throughput is samples trained / train_time_s), to the nearest whole sample.
    rate, seconds = metrics.get("throughput_samples_s"), metrics.get("train_time_s")
    if fields["train_samples"] is None and rate is not None and seconds is not None:
        fields["train_samples"] = round(rate * seconds)
        extra["train_samples"] = "throughput_samples_s x train_time_s (train_samples not logged)"
    for attr, (param, whole) in MLFLOW_TIMING_PARAMS.items():
        text = params.get(param)
        try:
            value = None if text is None else float(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or (whole and value != int(value)):
            extra[attr] = f"param {param} not logged" if text is None else f"param {param} = {text!r}, not a number"
            value = None
        fields[attr] = int(value) if whole and value is not None else value
    if params.get("train.batch_size") == "auto" and metrics.get("batch_size_used") is not None:
        fields["batch_size"] = int(metrics["batch_size_used"])  # the batch the search found (batch_fit.py)
        extra["batch_size"] = "train.batch_size=auto: metric batch_size_used"
    mode = params.get("compile.mode", params.get("compile", ""))
    fields["compile_mode"] = "off" if mode.lower() in ("off", "false") else mode  # YAML 1.1 reads a bare off as false
    fields["compile_cache"] = tags.get("compile_cache", "")
    # Where results go (tracking, cache_dir, sweep) says nothing about what was trained.
    fields["config_key"] = pairing_key(params, HASH_EXCLUDED_KEYS)
    fields["extra"] = extra
    return fields


def tag_equals(tag: str, value: str, given_as: str) -> str:
    """The MLflow filter clause `tags.TAG = VALUE`. MLflow's filters have no escapes: a value is
    quoted with the quote it does not contain, and one holding both cannot be asked for (no id
    bertaccel writes does); given_as names where the value came from, for the error."""
    quote = "'" if "'" not in value else '"'
    if quote in value:
        raise ReportInputError(f"{given_as} {value}: holds both ' and \", which an MLflow filter cannot match; "
                               "give the id as bertaccel printed it")
    return f"tags.{tag} = {quote}{value}{quote}"


def _why_none_finished(uri: str, experiment: str, sweep_id: Optional[str]) -> str:
    """What the runs there ended as instead, and the most common reason per status."""
    from collections import Counter

    runs = _configuration_runs(uri, experiment, sweep_id, "")
    if not runs:
        return ": it has no runs"
    by_status = Counter(r.data.tags.get("status", "unknown") for r in runs)
    parts = []
    for status, n in by_status.most_common():
        reasons = Counter(r.data.tags.get("reason", "") for r in runs if r.data.tags.get("status") == status)
        reason = reasons.most_common(1)[0][0]
        parts.append(f"{n} {status}" + (f" (e.g. {reason[:200]})" if reason else ""))
    return ": " + ", ".join(parts)


def _configuration_runs(uri: str, experiment: str, sweep_id: Optional[str], flt: str) -> List[Any]:
    """The configuration runs (not sweep parents, which hold no metrics) matching an MLflow filter:
    of the experiment, or of one sweep, those it ran and those it took from earlier runs or from
    another sweep (record/sweep.py sweep_runs), through the shared query, under the store lock."""
    from bertaccel.record.sweep import sweep_runs
    from bertaccel.record.tracking import search_runs

    if sweep_id:
        tag_equals("sweep_id", sweep_id, "--sweep")  # (an id with both quotes, which no sweep has: one line)
        return sweep_runs(uri, experiment, sweep_id, flt)
    return [r for r in search_runs(uri, experiment, flt) if r.data.tags.get("bertaccel.role") != "sweep"]


def rows_from_mlflow(uri: str, experiment: str, sweep_id: Optional[str] = None) -> List[Row]:
    from bertaccel.record.access import experiment_id, reader

    if experiment_id(uri, experiment) is None:
        raise ReportInputError(f"--experiment {experiment}: no such experiment in {uri}")
    runs = _configuration_runs(uri, experiment, sweep_id, "tags.status = 'finished'")
    if not runs:
        where = f"sweep {sweep_id} of " if sweep_id else ""
        raise ReportInputError(f"no finished runs in {where}experiment {experiment} ({uri})"
                               + _why_none_finished(uri, experiment, sweep_id))
    from bertaccel.record.run_record import run_settings
    from bertaccel.record.sweep import MEMBER_TAG

    rows = []
    client = reader(uri)
    groups, _ = group_keys(runs)
    histories = accuracy_histories(client, [r.info.run_id for r in runs])
    for r, group in zip(runs, groups):
        # A metric logged as nan or inf (a diverged run) is null with that reason: never scored, ranked or crowned.
        m, tags, params = finite_metrics(r), r.data.tags, run_settings(r)
        timing = _mlflow_timing(m, params, tags)
        more = run_fields(r, client, None if histories is None else histories.get(r.info.run_id, []))
        more["extra"].update(timing.pop("extra"))
        # Row's metric columns by name (MLFLOW_METRICS: column -> metric), each a float or None; typed
        # Any as keyword arguments whose names the checker cannot match to Row's fields.
        measured: Dict[str, Any] = {col: m.get(metric) for col, metric in MLFLOW_METRICS.items()}
        row = Row(name=r.info.run_name or r.info.run_id, run_id=r.info.run_id,
                  hardware=tags.get("hardware_profile", ""), precision=params.get("precision", ""), group=group,
                  **measured, **timing, **more)
        for col, metric in MLFLOW_METRICS.items():
            if m.get(metric) is None:
                row.extra[col] = not_finite(r.data.metrics, metric) or tags.get(f"{metric}_source", "not logged")
        for col, (metric, _) in MLFLOW_TIMING_METRICS.items():
            row.extra[col] = not_finite(r.data.metrics, metric) or row.extra.get(col, "")
            if not row.extra[col]:
                del row.extra[col]
        if sweep_id and f"{MEMBER_TAG}{sweep_id}" in tags:
            # An earlier run the sweep took for one of its configurations (resume: same config_hash,
            # same data; e.g. the default job as its baseline): of this sweep, for the gate too.
            row.sweep = sweep_id
        rows.append(row)
    return rows
