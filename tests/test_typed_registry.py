"""Issue 61, item 3: the registry's contract kept by the code. `hardware` is an Option; every
option check says every problem; a rule's sections are read from its code; every check between
sections is a row of options/rules.py; Option has no `effect` nothing reads; every default lives in
the schema's dataclasses only (no conf/ YAML and no code restates one)."""
from __future__ import annotations

import ast
import inspect
import sys
import textwrap
from dataclasses import MISSING, fields
from pathlib import Path

import pytest
import torch
import yaml

import bertaccel
from bertaccel.config import CONF_DIR, GROUP_SCHEMAS, ConfigError, HardwareConfig, RunConfig, schema_fields
from bertaccel.option import Option
from bertaccel.options.checks import typed, validate
from bertaccel.options.introspect import _with_helpers
from bertaccel.options.registry import option, options
from bertaccel.options import rules

WHAT_IF_ON_AUTO = ("hardware.what_if=true needs a named profile (hardware=h100 hardware.what_if=true): "
                   "hardware=auto always matches the device")


def refused(compose_cfg, overrides) -> list:
    with pytest.raises(ConfigError) as info:
        validate(compose_cfg(list(overrides)))
    return str(info.value).splitlines()


# --- hardware: an Option, its checks asked by validate() --------------------------------------

def test_hardware_is_a_registered_option_typed_by_its_schema():
    assert option("hardware").schema is HardwareConfig
    assert option("hardware").check(typed(RunConfig(hardware=HardwareConfig(what_if=True)))) == [WHAT_IF_ON_AUTO]


def test_what_if_with_auto_is_refused_by_validate_not_inside_the_run(compose_cfg):
    assert refused(compose_cfg, ["hardware.what_if=true"]) == [WHAT_IF_ON_AUTO]
    validate(compose_cfg(["hardware=a100", "hardware.what_if=true"]))  # a named profile: a what-if


def test_pue_is_the_hardware_options_and_said_after_carbons(compose_cfg):
    assert refused(compose_cfg, ["hardware=cpu", "hardware.pue=0.9", "carbon.region=mars"]) == [
        "carbon.region='mars' is not in bertaccel/measure/carbon.py's table; choose one of world, us, de, fr, uk, "
        "or give carbon.intensity_g_per_kwh=<grams CO2e per kWh> for another grid",
        "hardware.pue=0.9 must be >= 1 (total facility energy / IT energy); leave it null to count the IT energy "
        "alone"]
    assert option("carbon").check(typed(RunConfig(hardware=HardwareConfig(pue=0.5)))) == []


@pytest.mark.slow
def test_what_if_with_auto_is_one_line_exit_2_and_nothing_written(cli):
    r = cli(["model=tiny", "train.device=cpu", "hardware.what_if=true"], timeout=300)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2, r.stderr[-3000:]
    assert lines == [f"error: {WHAT_IF_ON_AUTO}"], r.stderr[-3000:]
    assert not (cli.dir / "outputs").exists()
    assert not (cli.dir / "mlflow.db").exists()


# --- every option check says every problem -------------------------------------------------------

EVERY_PROBLEM = {
    "precision": (["precision=fp16", "precision.fp8_recipe=bogus"], [
        "precision fp16: fp8_recipe='bogus' is not one of tensorwise, rowwise (or null for no FP8)",
        "precision fp16: fp8_recipe=bogus needs autocast_dtype bfloat16 (the layers FP8 leaves out run in bf16; "
        "float16 is not supported)"]),
    "compile": (["compile=max-autotune", "compile.cache=warm", "compile.step_graph=true"], [
        "compile.cache='warm' is not one of persistent, fresh",
        "compile.step_graph=true with compile=max-autotune would capture CUDA graphs inside CUDA graphs; use "
        "compile=default (or off) with compile.step_graph=true"]),
    "search": (["search.objectives=[a,a]", "search.directions=[up,down]"], [
        "search.directions: 'up' is not one of minimize, maximize",
        "search.directions: 'down' is not one of minimize, maximize",
        "search.objectives=['a', 'a']: an objective is named twice"]),
    "model_random_init": (["model=tiny", "model.hidden_size=null", "model.num_hidden_layers=null"], [
        "model=tiny (random_init) needs model.hidden_size: a random-init model's shape comes from the config",
        "model=tiny (random_init) needs model.num_hidden_layers: a random-init model's shape comes from the config"]),
    "model_pretrained": (["model.hidden_size=4", "model.num_hidden_layers=2"], [
        f"model.{k}={v}: model=minilm_l6 is pretrained and its weights fix the shape; drop model.{k}, or use a "
        "random_init model (model=tiny, model=bert_base_random)" for k, v in (("hidden_size", 4),
                                                                             ("num_hidden_layers", 2))]),
}


@pytest.mark.parametrize("name", list(EVERY_PROBLEM))
def test_an_option_check_says_every_problem_not_the_first(compose_cfg, name):
    overrides, lines = EVERY_PROBLEM[name]
    assert refused(compose_cfg, overrides) == lines


# --- a rule's sections: read from its code -------------------------------------------------------

def test_a_rule_declares_no_sections_they_are_read_from_its_code():
    assert [f.name for f in fields(rules.Rule)] == ["name", "refusal", "stage"]
    reads = {rule.name: rule.reads for rule in rules.RULES}
    # the two that declared too few: each read a section its list left out
    assert reads["fp8_compile_off"] == ("precision", "encoder", "compile")
    assert reads["fp8_fused_encoder"] == ("precision", "encoder", "compile")
    top = {f.name for f in fields(RunConfig)}
    assert all(rule.reads and set(rule.reads) <= top for rule in rules.RULES)


@pytest.mark.parametrize("overrides, line", [
    (["precision=fp8_rowwise", "encoder=fused", "compile.mode=fast"],
     "compile.mode='fast' is not one of off, default, max-autotune, reduce-overhead"),
    (["precision=fp8", "encoder.layer=bogus", "compile=off"], "encoder.layer='bogus' is not one of hf, fused"),
])
def test_a_rule_is_not_asked_about_a_section_that_failed_its_own_check(compose_cfg, overrides, line):
    assert refused(compose_cfg, overrides) == [line]


def test_a_rule_that_hands_its_config_on_whole_is_refused():
    def _hands_on(cfg):
        return str(cfg)

    def _reads_a_non_section(cfg):
        return cfg.precison

    for fn in (_hands_on, _reads_a_non_section):
        with pytest.raises(TypeError, match="read the config only as cfg.<section>"):
            rules.reads_of(fn)


# --- every check between sections is a rule ------------------------------------------------------

def _sections_read(fn) -> set:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    top = {f.name for f in fields(RunConfig)}
    return {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "cfg" and n.attr in top}


def test_no_option_check_reads_another_section():
    """Its own check, its machine check and its later checks, with the helpers of its module they call."""
    other = [(o.section, f.__qualname__, sorted(_sections_read(f) - {o.section}))
             for o in options() for check in (o.check, o.unusable, *o.later) for f in _with_helpers(check)
             if _sections_read(f) - {o.section}]
    assert other == []


def test_the_moved_checks_still_refuse_and_skip(compose_cfg, monkeypatch):
    capturable = ("optimizer=lamb has no capturable mode, which compile.step_graph=true needs (the step runs "
                  "inside a CUDA graph)")
    cfg = compose_cfg(["compile.step_graph=true", "optimizer=lamb", "attention=sdpa"])
    assert refused(compose_cfg, ["compile.step_graph=true", "optimizer=lamb", "attention=sdpa"]) == [capturable]
    validate(cfg, leave=("optimizer.check_built",))  # a sweep leaves the build, and the rule with it
    machine = {rule.name: rule for rule in rules.rules_at("machine")}
    for name in [m for m in sys.modules if m == "torchao" or m.startswith("torchao.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torchao", None)  # as where it is not installed
    gpu = torch.device("cuda", 0)
    fp8 = typed(compose_cfg(["precision=fp8", "compile=default"]))
    assert machine["fp8_torchao"].refusal(fp8, gpu, None).startswith(
        "precision=fp8 needs torchao's float8 training (ModuleNotFoundError")
    fp8_fused = typed(compose_cfg(["precision=fp8_rowwise", "encoder=fused"]))
    assert machine["fp8_torchao"].refusal(fp8_fused, gpu, None) is None
    fused = typed(compose_cfg(["encoder=fused", "attention=sdpa"]))
    assert machine["fused_encoder_core"].refusal(fused, torch.device("cpu"), None) == (
        "encoder=fused: attention=sdpa with encoder=fused runs torch's varlen flash / memory-efficient kernels: "
        "CUDA GPU only")
    assert machine["fused_encoder_core"].refusal(typed(compose_cfg([])), torch.device("cpu"), None) is None


# --- Option.effect: read by nothing, so gone -------------------------------------------------------

def test_no_option_carries_an_effect_string():
    assert not hasattr(Option, "effect")
    assert [o.section for o in options() if hasattr(o, "effect")] == []


# --- defaults: in the schema's dataclasses only ---------------------------------------------------

def _default(f):
    return f.default if f.default is not MISSING else f.default_factory() if f.default_factory is not MISSING else MISSING


def restated_in_yaml() -> list:
    """Every value of a group's option file equal to its schema's default (`name` aside: each option
    names itself)."""
    found = []
    for group, schema in GROUP_SCHEMAS:
        defaults = {key: _default(f) for key, f in schema_fields(schema)}
        for path in sorted((CONF_DIR / group).glob("**/*.yaml")):
            node = yaml.safe_load(path.read_text()) or {}
            found += [f"{group}/{path.name}: {k}" for k, v in node.items()
                      if k != "name" and k in defaults and defaults[k] == v]
    return found


def test_no_option_file_restates_a_schema_default():
    assert restated_in_yaml() == []


def restated_in_code(root: Path) -> list:
    """Calls that fall back to a literal equal to a schema field's default (`.get("repeats", 1)`,
    `select(cfg, "sweep.repeats", default=1)`, `getattr(x, "name", default)`) and module constants
    DEFAULT_<FIELD> equal to it: a second home of that default."""
    defaults: dict = {}
    for key, f in schema_fields():
        if f.default is not MISSING:
            for name in (key, key.rsplit(".", 1)[-1]):
                defaults.setdefault(name, set()).add(repr(f.default))

    def same(name, node) -> bool:
        return isinstance(node, ast.Constant) and repr(node.value) in defaults.get(str(name), ())

    found = []
    for path in sorted(root.rglob("*.py")):
        if path.parent.name == "config" and path.parent.parent == root:  # the schema: the defaults' one home
            continue
        for n in ast.walk(ast.parse(path.read_text())):
            hit = False
            if isinstance(n, ast.Call):
                fn, args = (n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")), n.args
                key = args[0] if fn in ("get", "pop", "setdefault") and args else args[1] if len(args) > 1 else None
                if fn in ("get", "pop", "setdefault", "getattr") and isinstance(key, ast.Constant):
                    hit = len(args) == (3 if fn == "getattr" else 2) and same(key.value, args[-1])
                elif fn == "select" and isinstance(key, ast.Constant):
                    hit = any(kw.arg == "default" and same(key.value, kw.value) for kw in n.keywords)
            elif isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
                target = n.targets[0].id
                hit = target.startswith("DEFAULT_") and same(target[len("DEFAULT_"):].lower(), n.value)
            if hit:
                found.append(f"{path.relative_to(root)}:{n.lineno}")
    return found


def test_no_code_restates_a_schema_default():
    root = Path(bertaccel.__file__).parent
    # plan/roofline.py reads a logged run's params back (its two fall-backs): issue 61's item 2
    # moves that reading onto the options, where this test then holds it too.
    assert [hit for hit in restated_in_code(root) if not hit.startswith("plan/roofline.py:")] == []
