"""Repeats: runs that differ only in the seed are grouped (MLflow tag, params for older runs,
CSV group/name), means and 95% t-intervals are right, and a best whose interval overlaps another
configuration's is reported tied. Expected values are computed by hand from the inputs."""
from __future__ import annotations

import math
import sys

import pytest
from report_store import Store

from bertaccel.report import STRATEGIES, Row, rows_from_csv, rows_from_mlflow, score_rows
from bertaccel.report.floor import Floor
from bertaccel.report.verdict import decide
from bertaccel.report.repeats import group_label, group_rows, repeat_stats, t_interval
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

T_975_DF2 = 4.302652729911275   # Student t, 97.5% quantile, 2 degrees of freedom (tables)
T_975_DF1 = 12.706204736174698  # ... 1 degree of freedom


def _cli(args, cwd):
    return warm_cli.run([sys.executable, "-m", "bertaccel.report", *args], cwd=cwd, capture_output=True, text=True)


def test_t_interval_by_hand_and_one_run_is_null_with_its_reason():
    iv = t_interval([1.0, 2.0, 3.0])  # mean 2, s = 1
    assert iv.n == 3 and iv.mean == pytest.approx(2.0)
    assert (iv.low, iv.high) == pytest.approx((2 - T_975_DF2 / math.sqrt(3), 2 + T_975_DF2 / math.sqrt(3)))
    iv = t_interval([10.0, 12.0])  # s = sqrt(2)
    assert iv.high - iv.mean == pytest.approx(T_975_DF1 * math.sqrt(2) / math.sqrt(2))
    one = t_interval([5.0])
    assert (one.mean, one.low, one.high, one.why) == (5.0, None, None, "one run")
    none = t_interval([])
    assert none.mean is None and none.why == "no run has it"
    same = t_interval([4.0, 4.0])  # no spread: the interval is the point, not null
    assert (same.low, same.high) == (4.0, 4.0)


def test_group_label_strips_the_seed_item():
    assert group_label(["accumulation=2,train.seed=1", "accumulation=2,train.seed=7"]) == "accumulation=2"
    assert group_label(["train.seed=1,optimizer=adamw"]) == "optimizer=adamw"
    assert group_label(["train.seed=3"]) == "defaults"


def test_ties_when_intervals_overlap_and_clear_when_not():
    # a: times 10, 11, 12; b: 10.5, 11.5, 12.5 (overlaps a); c: 20, 20.2, 19.8 (far from both).
    # cost = time x one rate, no energy or occupancy: every strategy ranks by time.
    times = {"a": [10, 11, 12], "b": [10.5, 11.5, 12.5], "c": [20, 20.2, 19.8]}
    rows = [Row(f"{g},train.seed={s}", t, t * 0.01, accuracy=0.9, seed=str(s), group=g)
            for g, ts in times.items() for s, t in enumerate(ts, 1)]
    scored = score_rows(rows, STRATEGIES)
    st = repeat_stats(rows, scored)
    assert [g.label for g in st.groups] == ["a", "b", "c"] and [g.seeds for g in st.groups][0] == ["1", "2", "3"]
    tmax = 20.2
    a_scores = [0.6 * t / tmax for t in times["a"]]  # balance: (0.3 + 0.3) x T / Tmax, renormalized to 1.0
    a_scores = [s / 0.6 for s in a_scores]
    assert st.scores["balance"][0].mean == pytest.approx(sum(a_scores) / 3)
    assert st.metrics["time_s"][2].mean == pytest.approx(20.0)
    v = decide(rows, scored, None)
    assert v.calls["balance"].winner == 0 and v.calls["balance"].tied == (1,)  # a best, b within its interval
    assert v.calls["balance"].unjudged == () and v.calls["balance"].runner_up == 1
    # The same with b moved away: a is clear.
    rows2 = [r if r.group != "b" else Row(r.name, r.time_s + 5, (r.time_s + 5) * 0.01, accuracy=0.9, seed=r.seed,
                                          group="b") for r in rows]
    v2 = decide(rows2, score_rows(rows2, STRATEGIES), None)
    assert v2.calls["balance"].winner == 0 and v2.calls["balance"].tied == ()


def test_one_run_groups_are_not_judged_and_the_floor_judges_a_configurations_mean():
    rows = [Row("a", 10, 0.1, accuracy=0.9, group="a", seed="1"), Row("a", 11, 0.11, accuracy=0.9, group="a", seed="2"),
            Row("solo", 10.6, 0.106, accuracy=0.9), Row("low", 5, 0.05, accuracy=0.5, group="low", seed="1"),
            Row("low", 5.1, 0.051, accuracy=0.91, group="low", seed="2"),
            Row("unlucky", 4, 0.04, accuracy=0.84, group="unlucky", seed="1"),
            Row("unlucky", 4.1, 0.041, accuracy=0.88, group="unlucky", seed="2")]
    v = decide(rows, score_rows(rows, STRATEGIES), Floor(0.85, "--accuracy-floor 0.85"))
    labels = [g.label for g in v.groups]
    low, unlucky = labels.index("low"), labels.index("unlucky")
    # The mean decides: low's runs average 0.705 (out), unlucky's 0.86 (in, one seed below the floor).
    assert not v.eligible[low] and v.why_out[low] == "mean accuracy of 2 runs 0.7050 < floor 0.8500"
    assert v.eligible[unlucky] and v.groups[v.calls["balance"].winner].label == "unlucky"
    assert v.groups[v.calls["balance"].runner_up].label == "a"
    assert [v.groups[k].label for k in v.calls["balance"].unjudged] == ["solo"]  # one run: no interval to compare


def test_mlflow_groups_by_tag_and_by_params_for_runs_without_it(tmp_path):
    store = Store(tmp_path)
    base = {"model": "tiny", "train.batch_size": "16", "dataset.name": "ag_news_sample", "tracking.uri": "x"}
    metrics = {"train_time_s": 10.0, "cost_usd": 0.01, "test_accuracy": 0.8}
    for seed in (1, 2):
        store.log(f"accumulation=1,train.seed={seed}", {**base, "train.seed": str(seed), "accumulation": "1"},
                  metrics, {"config_key_noseed": "k1"})
        store.log(f"accumulation=2,train.seed={seed}", {**base, "train.seed": str(seed), "accumulation": "2"},
                  metrics, {"config_key_noseed": "k2"})
    rows = rows_from_mlflow(store.uri, "bertaccel")
    groups = group_rows(rows)
    assert sorted((g.label, tuple(sorted(g.seeds))) for g in groups) == [("accumulation=1", ("1", "2")),
                                                                         ("accumulation=2", ("1", "2"))]
    assert {r.group for r in rows} == {"k1", "k2"}
    # A run logged before the tag: every key then comes from params without train.seed and
    # without where results go (tracking.uri differs here), so old and new runs still group.
    store.log("accumulation=1,train.seed=3", {**base, "train.seed": "3", "accumulation": "1", "tracking.uri": "y"},
              metrics)
    rows = rows_from_mlflow(store.uri, "bertaccel")
    by_label = {g.label: sorted(g.seeds) for g in group_rows(rows)}
    assert by_label == {"accumulation=1": ["1", "2", "3"], "accumulation=2": ["1", "2"]}
    assert all(r.group.startswith("params:") for r in rows)


@pytest.mark.slow
def test_csv_seed_and_group_columns_and_the_cli_tables(tmp_path):
    csv = tmp_path / "runs.csv"
    csv.write_text("name,time_s,cost_usd,energy_kwh,occupancy_pct,accuracy,seed,group\n"
                   "fast s1,10,0.10,0.010,50,0.90,1,fast\nfast s2,11,0.11,0.011,52,0.91,2,fast\n"
                   "fast s3,12,0.12,0.012,48,0.89,3,fast\n"
                   "slow s1,30,0.30,0.030,60,0.92,1,slow\nslow s2,31,0.31,0.031,61,0.92,2,slow\n")
    rows = rows_from_csv(str(csv))
    assert [(r.seed, r.group) for r in rows][:2] == [("1", "fast"), ("2", "fast")]
    # (fast's mean accuracy is 2 points below slow's: the default floor would keep it from best)
    r = _cli(["--csv", str(csv), "--accuracy-floor", "off", "--out", "rep"], tmp_path)
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "rep" / "report.md").read_text()
    table = md.split("## Repeats: mean and 95% interval per configuration")[1].split("\n## ")[0]
    fast = next(line for line in table.splitlines() if line.startswith("| fast |"))
    half = T_975_DF2 * 1.0 / math.sqrt(3)  # times 10, 11, 12: s = 1
    assert f"| fast | 3 | 1,2,3 | 11.00 [{11 - half:.2f}, {11 + half:.2f}] |" in fast
    best = md.split("## Best configuration per strategy")[1].split("\n## ")[0]
    assert "| all 7 strategies | fast (3 runs) |" in best, best
    assert "| slow (2 runs) (score +" in best and "clear: no other configuration's interval overlaps" in best


@pytest.mark.slow
def test_cli_without_repeats_says_so_once(tmp_path):
    csv = tmp_path / "runs.csv"
    csv.write_text("name,time_s,cost_usd,energy_kwh,occupancy_pct,accuracy\na,10,0.1,,,0.9\nb,12,0.12,,,0.91\n")
    r = _cli(["--csv", str(csv), "--out", "rep"], tmp_path)
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "rep" / "report.md").read_text()
    assert md.count("no configuration ran more than once") == 1 and "## Repeats" not in md


def test_config_key_noseed_ignores_only_the_seed():
    from bertaccel.record.run_record import config_key_noseed
    from bertaccel.record.tracking import config_hash

    cfg = {"train": {"seed": 1, "batch_size": 16}, "model": {"name": "tiny"}, "tracking": {"uri": "a"}}
    other_seed = {**cfg, "train": {"seed": 2, "batch_size": 16}, "tracking": {"uri": "b"}}
    other_batch = {**cfg, "train": {"seed": 1, "batch_size": 32}}
    assert config_hash(cfg) != config_hash(other_seed)              # the run's identity includes its seed
    assert config_key_noseed(cfg) == config_key_noseed(other_seed)  # the configuration's does not
    assert config_key_noseed(cfg) != config_key_noseed(other_batch)


@pytest.mark.slow
def test_real_sweep_over_two_seeds_is_one_configuration(cli, tmp_path):
    from conftest import TINY

    proc = cli(["-m", "train.seed=1,2", *TINY, "train.max_steps_per_epoch=2"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = rows_from_mlflow(cli.store, "bertaccel")
    assert len(rows) == 2 and rows[0].group == rows[1].group and not rows[0].group.startswith("params:")
    (group,) = group_rows(rows)
    assert group.label == "defaults" and sorted(group.seeds) == ["1", "2"]
    r = _cli(["--uri", cli.store, "--target-accuracy", "0.01", "--out", "rep"], tmp_path)
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "| defaults | 2 | 1,2 |" in md.split("## Repeats: mean and 95% interval per configuration")[1]
    # Every run's accuracy after its first epoch is >= 0.01: reached by the end of epoch 1.
    assert md.count("by the end of epoch 1 (no accuracy is measured before it") == 2
