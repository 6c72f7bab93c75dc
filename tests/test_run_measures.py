"""A real CLI run records every measurement the metrics issue names, measured or null with a reason."""
from __future__ import annotations

import json

import pytest
from conftest import JOB_PARTS, MAIN_PARTS, TINY, startup_phases_of
from mlflow import MlflowClient

from bertaccel.measure.profiling import CATEGORIES
from bertaccel.options.optimizer import lr_factor
from bertaccel.runs import startup
from bertaccel.record.run_record import run_settings
from bertaccel.record.tracking import runs_by_status

# Every test here starts a real process (the CLI, a script, a server) or trains: slow (docs/contributing.md).
pytestmark = pytest.mark.slow

MEASURES = ("energy_kwh", "avg_power_w", "energy_per_sample_j", "samples_per_kwh", "occupancy_pct",
            "sm_active_pct", "tensor_active_pct", "dram_bw_util_pct", "gpu_util_pct", "mfu",
            "model_flops", "achieved_tflops", "padded_tokens", "real_tokens", "co2e_kg") + tuple(
    f"profile_{c}_share" for c in CATEGORIES)


def test_profiled_cpu_run_records_measures_sources_and_profile_artifacts(cli):
    steps = 6
    r = cli([*TINY, "profile=true", f"train.max_steps_per_epoch={steps}", "profile_window.warmup_steps=1",
             "profile_window.active_steps=2"])
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = runs_by_status(cli.store, "bertaccel")["finished"]
    m, tags = run.data.metrics, run.data.tags
    for name in MEASURES:
        source = tags[f"{name}_source"]
        assert source, name
        if name in m:
            assert not source.startswith("null:"), (name, source)
        else:
            assert source.startswith("null: "), (name, source)  # not measured: a reason, never 0
    # This CPU run has no GPU: activity is null with that reason, and so is MFU (no peak FLOP/s).
    assert tags["occupancy_pct_source"] == "null: no GPU: this run is on the CPU"
    assert "mfu" not in m and "peak_tflops_fp32" in tags["mfu_source"]
    assert ("energy_kwh" in m) == ("samples_per_kwh" in m) == ("co2e_kg" in m)
    # The mean step beside the median, and every step's time as a series (which steps were slow)
    assert m["step_time_mean_ms"] == pytest.approx(1000 * m["train_time_s"] / m["optimizer_steps"])
    series = MlflowClient(cli.store).get_metric_history(run.info.run_id, "step_ms")
    assert [x.step for x in series] == list(range(steps)) and all(x.value > 0 for x in series)
    assert tags["step_ms_source"] and tags["step_time_mean_ms_source"].startswith("train_time_s / optimizer steps")
    # FLOPs and tokens are measured here; the profile shares add up to one.
    assert m["model_flops"] > 0 and m["padded_tokens"] >= m["real_tokens"] > 0
    assert sum(m[f"profile_{c}_share"] for c in CATEGORIES) == pytest.approx(1.0)
    # The profiled steps are outside the training window: the window holds exactly the steps asked.
    assert m["optimizer_steps"] == steps
    windows = json.loads(tags["train_windows_unix"])
    assert len(windows) == 1 and windows[0][1] > windows[0][0]
    client = MlflowClient(tracking_uri=cli.store)
    files = {a.path for a in client.list_artifacts(run.info.run_id, "profile")}
    assert files == {"profile/kernels.md", "profile/kernels.json", "profile/trace.json.gz"}
    # the lr of every optimizer step (linear warm-up then decay), and the one-step breakdown
    lrs = [h.value for h in sorted(client.get_metric_history(run.info.run_id, "lr"), key=lambda h: h.step)]
    base = float(run_settings(run)["optimizer.lr"])  # (a restated setting: the tag config.optimizer.lr)
    assert lrs == pytest.approx([base * lr_factor("linear", i, steps, 0.1) for i in range(steps)])
    assert lrs[-1] < lrs[0]
    assert all(m[p] > 0 for p in ("forward_ms", "backward_ms", "optimizer_ms"))


def test_unprofiled_run_says_why_profile_is_null(cli):
    r = cli([*TINY, "train.max_steps_per_epoch=2"])
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = runs_by_status(cli.store, "bertaccel")["finished"]
    assert "profile_gemm_share" not in run.data.metrics
    assert run.data.tags["profile_gemm_share_source"].startswith("null: profile=false")


def test_only_the_first_job_of_a_sweep_is_charged_the_interpreter_start(cli):
    # Hydra's job number says which job is first; later jobs of the same process start their
    # clock at their own start, not at the process's.
    proc = cli(["-m", "model=tiny", "train.device=cpu", "dataset.train_subset=32", "dataset.test_subset=16",
                "train.batch_size=16", "train.seed=1,2", "launcher.name=inline"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = _runs_in_order(cli.store)
    sources = [r.data.tags["startup_overhead_s_source"] for r in runs]
    assert len(sources) == 2
    assert sources[0].endswith("minus process start"), sources
    assert sources[1].endswith("minus job start (later job of a multirun)"), sources
    # Where the start-up went: named phases, none negative, summing to startup_overhead_s; the
    # first run's from the sweep process's start, the later run's from its job's start.
    first, later = (startup_phases_of(r) for r in runs)
    assert list(first)[:7] == [*MAIN_PARTS, *JOB_PARTS] and "model build" in first, first
    assert list(later)[:3] == JOB_PARTS and not set(MAIN_PARTS) & set(later), later
    assert not [p for p in [*first, *later] if p.startswith("run process")]  # inline: no process of its own


def test_a_spawned_single_run_accounts_for_its_process_start(cli):
    # No sweep: no parent run; the run's process is a fresh interpreter (spawn), which imports
    # everything itself in multiprocessing's set-up (the main module run again) and after.
    # (fresh: the main process's interpreter start and imports are measured here too)
    proc = cli([*TINY, "train.max_steps_per_epoch=2", "launcher.start_method=spawn"], fresh=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run,) = _runs_in_order(cli.store)
    phases = startup_phases_of(run)
    assert list(phases)[:8] == [startup.MAIN_IMPORTS, startup.MAIN_COMPOSE, *JOB_PARTS, startup.PROCESS_SPAWN,
                                startup.PROCESS_SETUP, startup.PROCESS_IMPORTS], phases
    # A fresh interpreter's imports (torch, MLflow, Hydra) take a measurable while, and in the
    # main process as in the spawned one (seconds on a CPU core).
    assert phases[startup.MAIN_IMPORTS] > 0.1 and phases[startup.PROCESS_SETUP] > 0.1, phases


def _runs_in_order(store):
    client = MlflowClient(store)
    exp = client.get_experiment_by_name("bertaccel")
    return sorted((r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("bertaccel.role") != "sweep"),
                  key=lambda r: r.info.start_time)
