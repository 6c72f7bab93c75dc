"""The report and one-time costs: --time train|total, break-even of compiling, --project-epochs,
from a CSV and from a real MLflow store. Expectations are hand-computed from the inputs."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from bertaccel.report import STRATEGIES, Row, rows_from_csv, rows_from_mlflow, score_rows, time_view
from bertaccel.report.timing import break_even_pairs, break_even_steps, project, steps_per_epoch
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

DATA = Path(__file__).parent / "data"
# base off / base default / base max-autotune: one configuration ("base") uncompiled and compiled
# twice; two gpus off: 2 GPUs x batch 32 x accumulation 2; no step time: no warm-up or step time.
TIMING_CSV = DATA / "compile_timing.csv"
OFF, DEFAULT, AUTOTUNE, TWO_GPUS, NO_STEP = range(5)


def _cli(args, cwd):
    return warm_cli.run([sys.executable, "-m", "bertaccel.report", *args], cwd=cwd, capture_output=True, text=True)


def _balance(t, tmax, c, cmax, e, emax, o, omax):
    w = STRATEGIES["balance"]
    return w[0] * t / tmax + w[1] * c / cmax + w[2] * e / emax - w[3] * o / omax


def test_time_train_is_the_windows_and_total_adds_the_warm_up_and_its_cost():
    rows = rows_from_csv(str(TIMING_CSV))
    train, total = time_view(rows, "train"), time_view(rows, "total")
    assert [r.time_s for r in train.rows] == [100, 80, 90, 60, 50]
    # total: T = compile_time_s + train_time_s; cost x T / train_time_s (the GPU is paid while compiling).
    assert [r.time_s for r in total.rows[:4]] == [100, 140, 390, 60]
    assert [r.cost_usd for r in total.rows[:4]] == pytest.approx([1.0, 0.8 * 140 / 80, 0.9 * 390 / 90, 1.2])
    assert [r.energy_kwh for r in total.rows] == [r.energy_kwh for r in rows]  # warm-up energy not measured
    # No compile_time_s: no T, never a warm-up of 0; nor a cost, which could not be scaled.
    nulled = total.rows[NO_STEP]
    assert nulled.time_s is None and nulled.cost_usd is None
    assert "compile_time_s empty in the input" in nulled.extra["time_s"]
    assert "never taken as 0" in nulled.extra["time_s"]
    assert total.excluded.keys() == {NO_STEP} and train.excluded == {}
    assert rows[DEFAULT].time_s == 80  # the rows as loaded are not changed

    s_train = score_rows(train.rows, STRATEGIES, excluded=train.excluded).scores["balance"]
    s_total = score_rows(total.rows, STRATEGIES, excluded=total.excluded).scores["balance"]
    # Column maxima: train T 100, C 1.2, E 0.03, O 55; total T 390, C 3.9 (energy and occupancy unchanged).
    assert s_train[OFF] == pytest.approx(_balance(100, 100, 1.0, 1.2, 0.02, 0.03, 50, 55))
    assert s_train[DEFAULT] == pytest.approx(_balance(80, 100, 0.8, 1.2, 0.018, 0.03, 55, 55))
    assert s_total[OFF] == pytest.approx(_balance(100, 390, 1.0, 3.9, 0.02, 0.03, 50, 55))
    assert s_total[DEFAULT] == pytest.approx(_balance(140, 390, 1.4, 3.9, 0.018, 0.03, 55, 55))
    # Compiling wins on the windows, loses once its 60 s warm-up (and the GPU paid meanwhile) counts.
    assert s_train[DEFAULT] < s_train[OFF] and s_total[DEFAULT] > s_total[OFF]
    best_total = score_rows(total.rows, STRATEGIES, excluded=total.excluded)
    assert all(b != NO_STEP for b in best_total.best.values())
    assert "compile_time_s" in best_total.ineligible_reason[NO_STEP]


def test_break_even_arithmetic_and_never():
    assert break_even_steps(0.0, 60.0, 100.0, 80.0) == pytest.approx(60 / 0.020)  # 3000 steps
    assert break_even_steps(1.5, 10.5, 50.0, 47.0) == pytest.approx(9 / 0.003)
    assert break_even_steps(0.0, 300.0, 100.0, 110.0) == math.inf  # compiled step slower: never
    assert break_even_steps(0.0, 5.0, 100.0, 100.0) == math.inf   # not faster: never
    assert break_even_steps(10.0, 4.0, 100.0, 90.0) == 0.0        # less warm-up and faster: from step 0

    pairs = break_even_pairs(rows_from_csv(str(TIMING_CSV)))
    assert [(b.config, b.compile_mode, b.off, b.compiled) for b in pairs] == [
        ("base", "default", OFF, DEFAULT), ("base", "max-autotune", OFF, AUTOTUNE)]
    default, autotune = pairs
    assert (default.saving_ms, default.extra_warmup_s, default.steps) == (20.0, 60.0, pytest.approx(3000))
    assert autotune.saving_ms == -10.0 and autotune.steps == math.inf

    missing = [Row("k off", compile_mode="off", config_key="k", compile_time_s=0.0,
                   extra={"step_time_ms": "null: fewer than 3 steady-state steps"}),
               Row("k default", compile_mode="default", config_key="k", compile_time_s=20.0, step_time_ms=40.0),
               Row("other off", compile_mode="off", config_key="other", compile_time_s=0.0, step_time_ms=50.0)]
    (b,) = break_even_pairs(missing)
    assert b.steps is None and b.why == "k off: step_time_ms null: fewer than 3 steady-state steps"


def test_projection_arithmetic():
    assert steps_per_epoch(12000, 32, 1, 1) == 375
    assert steps_per_epoch(12001, 32, 1, 1) == 376  # a last shorter window still steps
    assert steps_per_epoch(12000, 32, 2, 2) == 94    # 12000 / 128 = 93.75
    rows = rows_from_csv(str(TIMING_CSV))
    view = time_view(rows, "train", project_epochs=3)
    p = view.projections
    assert [x.steps for x in p] == [1125, 1125, 1125, 282, None]
    assert p[OFF].time_s == pytest.approx(1125 * 0.100)                  # 112.5 s
    assert p[OFF].energy_kwh == pytest.approx(0.02 / 100 * 112.5)         # the run's average power
    assert p[OFF].cost_usd == pytest.approx(1.0 / 100 * 112.5)
    assert p[TWO_GPUS].time_s == pytest.approx(282 * 0.120)               # 33.84 s
    assert p[TWO_GPUS].cost_usd == pytest.approx(1.2 / 60 * 33.84)
    # The scored rows are the projected ones; occupancy and accuracy stay measured.
    assert [r.time_s for r in view.rows[:4]] == pytest.approx([112.5, 90.0, 123.75, 33.84])
    assert [(r.occupancy_pct, r.accuracy) for r in view.rows] == [(r.occupancy_pct, r.accuracy) for r in rows]
    # total on top: the warm-up once, whatever the length of the run; cost at the run's rate.
    total = time_view(rows, "total", project_epochs=3).rows
    assert total[DEFAULT].time_s == pytest.approx(60 + 90.0)
    assert total[DEFAULT].cost_usd == pytest.approx(0.8 / 80 * 150)
    assert total[DEFAULT].energy_kwh == pytest.approx(0.018 / 80 * 90)  # windows only


def test_projection_nulls_say_why_and_are_kept_from_best():
    rows = rows_from_csv(str(TIMING_CSV))
    view = time_view(rows, "train", project_epochs=3)
    p = view.projections[NO_STEP]
    assert (p.steps, p.time_s, p.energy_kwh, p.cost_usd) == (None, None, None, None)
    assert p.why["time_s"] == "no projection: step_time_ms empty in the input"
    assert view.rows[NO_STEP].extra["energy_kwh"] == p.why["time_s"]
    scored = score_rows(view.rows, STRATEGIES, excluded=view.excluded)
    assert all(b != NO_STEP for b in scored.best.values())  # never "best" on occupancy alone

    full = dict(step_time_ms=10.0, train_rows_full=1000, batch_size=10, accumulation=1, num_gpus=1)
    no_rows = project(Row("r", 5.0, 0.1, 0.001, **dict(full, train_rows_full=None),
                          extra={"train_rows_full": "not logged"}), 2)
    assert no_rows.time_s is None and no_rows.why["cost_usd"] == "no projection: train_rows_full not logged"
    no_energy = project(Row("e", 5.0, 0.1, None, extra={"energy_kwh": "null: no RAPL"}, **full), 2)
    assert no_energy.time_s == pytest.approx(200 * 0.010) and no_energy.cost_usd == pytest.approx(0.1 / 5 * 2)
    assert no_energy.energy_kwh is None and no_energy.why == {"energy_kwh": "null: no RAPL"}
    no_time = project(Row("t", None, 0.1, 0.001, extra={"time_s": "not logged"}, **full), 2)
    assert no_time.time_s == pytest.approx(2.0) and no_time.cost_usd is None
    assert no_time.why["cost_usd"] == "no average rate: train_time_s not logged"


@pytest.mark.slow
def test_cli_on_csv_writes_the_new_tables_and_the_mode_note(tmp_path):
    r = _cli(["--csv", str(TIMING_CSV), "--time", "total", "--project-epochs", "3", "--out", "rep"], tmp_path)
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "--time total (the default is train): T = compile_time_s + the projected train time_s" in md
    assert "the GPU is paid while compiling" in md and "warm-up energy is not measured" in md
    assert "Projected to 3 epoch(s) of the full train split" in md and "x step_time_ms / 1000" in md
    assert "## Projection to 3 epoch(s) of the full train split (projected)" in md
    assert "| base off | 1 ep x 3200 of 12000 rows | 100.00 | 12000 | 1x32x1 | 1125 | 100.00 | 112.50 |" in md
    assert "time_s (warm-up + projected train)" in md and "accuracy (measured)" in md
    assert "## Break-even of compiling (measured)" in md
    assert "| base | default |  | base off | base default | 100.00 | 80.00 | 20.00 | 60.00 | 3000 | 1125 | no |" in md
    assert "| base | max-autotune |  | base off | base max-autotune | 100.00 | 110.00 | -10.00 | 300.00 | never |" in md
    assert "no break-even: no step time" in md
    assert (tmp_path / "rep" / "report.html").read_text().count("<h2>Break-even of compiling") == 1

    r = _cli(["--csv", str(TIMING_CSV), "--out", "rep2"], tmp_path)
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "rep2" / "report.md").read_text()
    assert "--time train (the default): T = train_time_s" in md and "Projection to" not in md
    assert "| 3000 | 100 | no |" in md  # break-even against the run's own 100 steps


@pytest.mark.slow
@pytest.mark.parametrize("args,content,expected", [
    (["--time", "total"], None, "no compile_time_s column, which --time total needs"),
    (["--project-epochs", "3"], None, "no step_time_ms column, which --project-epochs needs"),
    (["--project-epochs", "0"], "", "--project-epochs: '0' is not a whole number > 0 (epochs to project every run to)"),
    ([], "name,time_s,cost_usd,energy_kwh,occupancy_pct,accuracy,compile\na,1,1,1,1,1,fast\n",
     "line 2 column compile: 'fast' is not a compile mode (off, default, max-autotune, reduce-overhead)"),
    ([], "name,time_s,cost_usd,energy_kwh,occupancy_pct,accuracy,batch_size\na,1,1,1,1,1,3.5\n",
     "line 2 column batch_size: '3.5' is not a whole number > 0"),
    ([], "name,time_s,cost_usd,energy_kwh,occupancy_pct,accuracy,step_time_ms\na,1,1,1,1,1,slow\n",
     "line 2 column step_time_ms: 'slow' is not a number"),
    ([], "name,time_s,cost_usd,energy_kwh,occupancy_pct,accuracy,compile_time_s\na,1,1,1,1,1,-2\n",
     "line 2 column compile_time_s: '-2' must be >= 0"),
])
def test_cli_bad_timing_input_is_one_line_exit_2(tmp_path, args, content, expected):
    csv_path = DATA / "thesis_table_5_1.csv"
    if content:
        csv_path = tmp_path / "bad.csv"
        csv_path.write_text(content)
    r = _cli(["--csv", str(csv_path), *args, "--out", "rep"], tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and expected in r.stderr
    assert not (tmp_path / "rep").exists()


def test_csv_without_accumulation_or_gpu_columns_projects_on_one_device(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("name,time_s,cost_usd,energy_kwh,occupancy_pct,accuracy,step_time_ms,train_rows_full,batch_size\n"
                    "a,10,0.1,0.001,50,0.9,20,1000,16\n")
    (row,) = rows_from_csv(str(path))
    assert (row.accumulation, row.num_gpus) == (1, 1) and "taken as 1" in row.extra["num_gpus"]
    p = time_view([row], project_epochs=2).projections[0]
    assert p.steps == 2 * 63 and p.time_s == pytest.approx(126 * 0.020)


@pytest.mark.slow  # several seconds on one core: the full suite runs it, the inner loop does not
def test_rows_from_a_real_mlflow_store_carry_the_timing_metrics(tmp_path):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("bertaccel", artifact_location=(tmp_path / "artifacts").as_uri())
    common = {"model": "tiny", "train.batch_size": "16", "accumulation": "2", "train.epochs": "1", "num_gpus": "1",
              "dataset.train_subset": "128", "precision": "fp32"}

    def log(name, params, metrics, tags):
        run = client.create_run(exp, run_name=name, tags={"status": "finished", **tags})
        for k, v in {**common, **params}.items():
            client.log_param(run.info.run_id, k, v)
        for k, v in metrics.items():
            client.log_metric(run.info.run_id, k, v)
        client.set_terminated(run.info.run_id)

    base = {"train_time_s": 20.0, "energy_kwh": 0.002, "cost_usd": 0.04, "test_accuracy": 0.8, "occupancy_pct": 30.0,
            "optimizer_steps": 4, "dataset_train_rows": 128, "dataset_train_rows_full": 1000}
    # Same configuration: only the compile choice, its cache and where results go differ.
    log("off", {"compile": "off", "compile.mode": "off", "tracking.uri": "sqlite:///a.db", "sweep.resume": "true",
                "cache_dir": "/a"},
        {**base, "compile_time_s": 0.0, "step_time_ms": 50.0, "time_to_train_s": 25.0},
        {"compile_time_s_source": "nothing compiled", "compile_cache": "none"})
    log("compiled", {"compile": "default", "compile.mode": "default", "compile.cache": "on",
                     "tracking.uri": "sqlite:///b.db", "sweep.resume": "false", "cache_dir": "/b"},
        {**base, "train_time_s": 15.0, "compile_time_s": 30.0, "step_time_ms": 40.0, "time_to_train_s": 50.0},
        {"compile_cache": "cold"})
    # Another configuration (batch 32) whose step time was not measured.
    log("other", {"compile": "default", "compile.mode": "default", "train.batch_size": "32"},
        {k: v for k, v in base.items()}, {"step_time_ms_source": "null: fewer than 3 steady-state steps"})

    rows = {r.name: r for r in rows_from_mlflow(uri, "bertaccel")}
    off, comp, other = rows["off"], rows["compiled"], rows["other"]
    assert (off.time_s, off.compile_time_s, off.step_time_ms, off.compile_mode) == (20.0, 0.0, 50.0, "off")
    assert (comp.compile_time_s, comp.step_time_ms, comp.compile_mode, comp.compile_cache) == (
        30.0, 40.0, "default", "cold")
    assert (comp.train_rows, comp.train_rows_full, comp.batch_size, comp.accumulation, comp.num_gpus, comp.epochs,
            comp.optimizer_steps) == (128, 1000, 16, 2, 1, 1.0, 4)
    assert off.config_key == comp.config_key != other.config_key
    assert other.extra["step_time_ms"] == "null: fewer than 3 steady-state steps"
    assert other.extra["compile_time_s"] == "not logged"

    view = time_view(list(rows.values()), "total", project_epochs=2)
    (b,) = view.break_even
    assert view.measured[b.compiled].name == "compiled" and b.steps == pytest.approx(30.0 / 0.010)  # 3000 steps
    proj = {view.measured[i].name: p for i, p in enumerate(view.projections)}
    assert proj["compiled"].steps == 2 * 32  # ceil(1000 / (16 x 2)) = 32 per epoch
    assert proj["compiled"].time_s == pytest.approx(64 * 0.040)
    assert proj["other"].why["time_s"] == "no projection: step_time_ms null: fewer than 3 steady-state steps"
    scored = {view.measured[i].name: r for i, r in enumerate(view.rows)}
    assert scored["compiled"].time_s == pytest.approx(30.0 + 2.56)  # warm-up + projected windows
    assert scored["compiled"].cost_usd == pytest.approx(0.04 / 15.0 * 2.56 * (32.56 / 2.56))
