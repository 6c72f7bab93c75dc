"""Hardware profiles, device checks and the skip rules for combinations a machine cannot run."""
from __future__ import annotations

import pytest
import torch
from conftest import TINY

from bertaccel.config import ConfigError
from bertaccel.options.hardware import (Capabilities, check_gpu_count, load_profiles, match_profile, resolve_profile,
                                        skip_reason)
from bertaccel.report import rows_from_mlflow
from bertaccel.record.tracking import runs_by_status


@pytest.mark.parametrize("device_name, profile", [
    ("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA A10", "a10"), ("Tesla V100-SXM2-32GB", "v100"), ("Tesla T4", "t4"),
])
def test_auto_matches_whole_name_tokens(device_name, profile):
    assert match_profile(device_name, load_profiles())["name"] == profile


def test_unknown_gpu_matches_nothing():
    assert match_profile("NVIDIA A10G", load_profiles()) is None
    assert match_profile("NVIDIA GeForce RTX 4090", load_profiles()) is None


def test_auto_on_cpu_says_which_profile(compose_cfg):
    prof, note = resolve_profile(compose_cfg([]).hardware, torch.device("cpu"))
    assert prof["name"] == "cpu" and "using profile 'cpu'" in note
    prof, note = resolve_profile(compose_cfg(["hardware=cpu"]).hardware, torch.device("cpu"))
    assert prof["name"] == "cpu" and note == "hardware=cpu (as configured)"


def test_a_profile_for_another_device_is_refused_unless_what_if(compose_cfg):
    with pytest.raises(ConfigError, match=r"^hardware=a100 is a profile for A100, but this run uses .cpu: "):
        resolve_profile(compose_cfg(["hardware=a100"]).hardware, torch.device("cpu"))
    prof, note = resolve_profile(compose_cfg(["hardware=a100", "hardware.what_if=true"]).hardware, torch.device("cpu"))
    assert prof["name"] == "a100" and prof["peak_tflops_bf16"] == 312 and "what-if" in note
    # what_if with auto means nothing (auto always matches): refused rather than ignored
    with pytest.raises(ConfigError, match=r"^hardware.what_if=true needs a named profile"):
        resolve_profile(compose_cfg(["hardware.what_if=true"]).hardware, torch.device("cpu"))


@pytest.mark.parametrize("device_name, profile, ok", [
    ("NVIDIA H100 80GB HBM3", "h100", True), ("NVIDIA H100 80GB HBM3", "h200", False),
    ("NVIDIA A100-SXM4-80GB", "a10", False), ("NVIDIA A10", "a10", True), ("NVIDIA A10", "cpu", False),
])
def test_profile_mismatch_on_a_gpu(device_name, profile, ok):
    from bertaccel.options.hardware import profile_mismatch

    prof = next(p for p in load_profiles() if p["name"] == profile)
    why = profile_mismatch(prof, device_name, "cuda")
    assert (why is None) == ok, why


def test_gpu_count_checks():
    # On the CPU num_gpus=N means N gloo processes (the data-parallel logic): allowed.
    check_gpu_count(2, torch.device("cpu"))
    check_gpu_count(1, torch.device("cpu"))
    too_many = torch.cuda.device_count() + 1
    with pytest.raises(ConfigError, match=f"num_gpus={too_many} but only {too_many - 1} GPU"):
        check_gpu_count(too_many, torch.device("cuda"))


CPU_NO_BF16 = Capabilities(cpu_native_bf16=False, cxx_compiler="/usr/bin/g++", triton=False)


@pytest.mark.parametrize("overrides, expected", [
    (["precision=fp16"], "precision=fp16 needs a CUDA GPU"),
    (["precision=bf16"], "precision=bf16 on a CPU without native bf16"),
    (["compile=reduce-overhead"], "compile=reduce-overhead means CUDA graphs"),
    # max-autotune replays CUDA graphs too (Inductor's mode table): without them on a CPU it is a different mode
    (["compile=max-autotune"], "compile=max-autotune means CUDA graphs"),
    (["compile=default"], None),
    (["precision=fp32", "attention=sdpa"], None),
])
def test_cpu_skip_rules(compose_cfg, overrides, expected):
    reason = skip_reason(compose_cfg(overrides), torch.device("cpu"), CPU_NO_BF16)
    if expected is None:
        assert reason is None
    else:
        assert reason.startswith(expected)


def test_bf16_runs_on_a_cpu_with_native_bf16(compose_cfg):
    caps = Capabilities(cpu_native_bf16=True, cxx_compiler="/usr/bin/g++", triton=False)
    assert skip_reason(compose_cfg(["precision=bf16"]), torch.device("cpu"), caps) is None


def test_compile_without_compiler_is_skipped(compose_cfg):
    caps = Capabilities(cpu_native_bf16=False, cxx_compiler=None, triton=False)
    assert "needs a C++ compiler" in skip_reason(compose_cfg(["compile=default"]), torch.device("cpu"), caps)


def test_auto_reads_profiles_through_the_schema_hydra_applies(tmp_path, monkeypatch):
    import bertaccel.options.hardware as hw

    profiles = hw.load_profiles()
    assert {p["name"] for p in profiles} >= {"cpu", "h100", "h200"} and "auto" not in {p["name"] for p in profiles}
    assert all(isinstance(p["match"], list) for p in profiles)  # the schema's defaults filled in
    (tmp_path / "fast.yaml").write_text("name: fast\nmatch: [X1]\npeak_tflops_bf16: very fast\n")
    monkeypatch.setattr(hw, "PROFILES_DIR", tmp_path)
    with pytest.raises(hw.ConfigError, match=r"^conf/hardware/fast.yaml: .*peak_tflops_bf16"):
        hw.load_profiles()


@pytest.mark.slow
def test_profile_for_another_device_is_one_line_before_any_work(cli):
    r = cli([*TINY, "hardware=h100", "train.max_steps_per_epoch=2"])
    assert r.returncode == 2, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith("error: hardware=h100 is a profile for ") and "but this run uses 'cpu: " in lines[0]
    assert "hardware=auto" in lines[0] and "hardware=cpu" in lines[0] and "hardware.what_if=true" in lines[0]
    assert not (cli.dir / "cache").exists()  # nothing tokenized, nothing trained
    assert runs_by_status(cli.store, "bertaccel") == {}


@pytest.mark.slow
def test_what_if_profile_is_shown_by_the_record_and_the_report(cli):
    r = cli([*TINY, "hardware=h100", "hardware.what_if=true", "train.max_steps_per_epoch=2"])
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = runs_by_status(cli.store, "bertaccel")["finished"]
    tags, m = run.data.tags, run.data.metrics
    assert run.data.params["hardware.what_if"] == "True"
    assert tags["hardware_profile"] == "h100 (what-if)"
    assert tags["hardware_what_if"].startswith("hardware=h100 priced and peaked a run that used cpu: ")
    assert "what-if" in tags["cost_usd_source"]
    assert m["cost_usd"] == pytest.approx(m["train_time_s"] / 3600 * 2.99)
    (row,) = rows_from_mlflow(cli.store, "bertaccel")
    assert row.hardware == "h100 (what-if)"  # the report's hardware column and plot colour


@pytest.mark.slow
def test_a_mismatching_profile_in_a_sweep_is_recorded_and_the_sweep_goes_on(cli):
    r = cli(["-m", *TINY, "hardware=h100,auto", "train.max_steps_per_epoch=2"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "2 runs: finished=1 skipped=0 failed=1" in r.stdout
    runs = runs_by_status(cli.store, "bertaccel")
    assert runs["finished"][0].data.params["hardware"] == "auto"
    (failed,) = runs["failed"]
    assert failed.data.tags["reason"].startswith("bad input: hardware=h100 is a profile for ")
