"""The report leads with the answer: per strategy the winning run against a baseline (the one
--baseline names, else the run on the config groups' defaults, else the slowest), with the
warnings that change the answer beside it (a warm-up that does not pay off within the winner's
run, runs of different sweeps, datasets or devices, no repeats). Real MLflow stores, written as
job.py writes runs, read through the report's own command; expected numbers worked by hand."""
from __future__ import annotations

import sys

import pytest
from browser import browser  # noqa: F401  (the headless Chromium fixture)
from report_store import Store

from bertaccel.config import TECHNIQUE_GROUPS
from bertaccel.report import rows_from_mlflow
from bertaccel.report.baseline import choose_baseline, default_choices
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)


def _cli(args, cwd):
    return warm_cli.run([sys.executable, "-m", "bertaccel.report", *args], cwd=cwd, capture_output=True, text=True)


def _answer(md: str) -> str:
    """The answer's section of report.md (up to the next section)."""
    assert md.split("\n## ")[1].startswith("The answer: which configuration to adopt"), "the answer is not first"
    return md.split("\n## ")[1]


def _row(section: str, strategy: str) -> list:
    line = next(x for x in section.splitlines() if x.startswith(f"| {strategy} |"))
    return [c.strip() for c in line.strip("|").split("|")]


# No energy or occupancy and cost = time / 100: every strategy ranks by time (one line for all 7).
METRICS = {"test_accuracy": 0.9}


def _store(path):
    path.mkdir()
    return Store(path)


def _run(store, name, choices, time_s, accuracy=0.9, tags=None, params=None, **metrics):
    """A finished run that logged its group choices as job.py does (a param per group)."""
    return store.log(name, {**choices, "accumulation": "1", "num_gpus": "1", **(params or {})},
                     {"train_time_s": time_s, "cost_usd": time_s / 100, "test_accuracy": accuracy, **metrics},
                     tags or {})


def test_default_choices_are_config_yamls_defaults_list():
    d = default_choices()
    assert set(d) == set(TECHNIQUE_GROUPS)  # the technique groups: not model, dataset, hardware (the context)
    assert d["precision"] == "fp32" and d["compile"] == "off" and d["preset"] == "none"


@pytest.mark.slow
def test_baseline_given_then_defaults_run_then_slowest(tmp_path):
    defaults = default_choices()
    store = Store(tmp_path)
    _run(store, "precision=bf16", {**defaults, "precision": "bf16"}, 40.0)   # the slowest
    _run(store, "defaults", defaults, 20.0)
    _run(store, "attention=sdpa", {**defaults, "attention": "sdpa"}, 10.0)
    rows = rows_from_mlflow(store.uri, "bertaccel")
    names = [r.name for r in rows]
    b = choose_baseline(rows)
    assert (names[b.index], b.how) == ("defaults", "defaults") and "the config groups' defaults" in b.why
    given = choose_baseline(rows, names.index("attention=sdpa"))
    assert (names[given.index], given.how) == ("attention=sdpa", "given") and "--baseline" in given.why
    # The same runs without their group choices (a CSV, older runs): the slowest.
    bare = _store(tmp_path / "bare")
    for name, t in (("a", 40.0), ("b", 20.0), ("c", 10.0)):
        bare.log(name, {"precision": "fp32"} if name == "c" else {}, {**METRICS, "train_time_s": t})
    rows = rows_from_mlflow(bare.uri, "bertaccel")
    slow = choose_baseline(rows)
    assert (rows[slow.index].name, slow.how) == ("a", "slowest") and "no run has the config groups' defaults" in slow.why

    # Through the command: the answer names the baseline and why, and compares against it.
    r = _cli(["--uri", store.uri, "--out", "rep"], tmp_path)
    assert r.returncode == 0, r.stderr
    answer = _answer((tmp_path / "rep" / "report.md").read_text())
    assert "Baseline: 'defaults', the run with the config groups' defaults (precision=fp32," in answer
    # Every strategy picks attention=sdpa (fastest, cheapest): 20 s / 10 s = 2x, cost 0.1 / 0.2 - 1 =
    # -50 %, accuracy unchanged; no run measured energy: null with the reason, never 0.
    assert _row(answer, "all 7 strategies")[1:6] == ["attention=sdpa", "2.00x faster", "null (baseline's energy_kwh null: "
                                                     "not logged)", "-50.0 %", "+0.00 pts"]
    # --baseline precision=bf16 through the command (the answer names it, sdpa is 40 s / 10 s = 4.00x
    # faster): checked on the same three runs by the Chromium test below, which runs that very command.


def _compile_pair(store, compile_time_s, steps=188):
    """One configuration run uncompiled (30 ms/step) and compiled (28 ms/step, faster overall)."""
    same = {"train.batch_size": "32", "model": "tiny"}
    store.log("compile=off", {**same, "compile": "off", "compile.mode": "off"},
              {**METRICS, "train_time_s": 6.0, "cost_usd": 0.06, "step_time_ms": 30.0, "compile_time_s": 0.0,
               "optimizer_steps": steps})
    store.log("compile=default", {**same, "compile": "default", "compile.mode": "default"},
              {**METRICS, "train_time_s": 5.5, "cost_usd": 0.055, "step_time_ms": 28.0,
               "compile_time_s": compile_time_s, "optimizer_steps": steps})


@pytest.mark.slow
def test_a_winner_whose_warm_up_does_not_pay_off_is_warned_beside_it(tmp_path):
    store = Store(tmp_path)
    _compile_pair(store, compile_time_s=100.0)  # 100 s / (2 ms saved a step) = 50,000 steps; it took 188
    r = _cli(["--uri", store.uri, "--out", "rep"], tmp_path)
    assert r.returncode == 0, r.stderr
    answer = _answer((tmp_path / "rep" / "report.md").read_text())
    row = _row(answer, "all 7 strategies")
    # (the sweep's names, compile=default and compile=off, are labelled by their value: report/labels.py)
    assert row[1] == "default" and "Runs are labelled compile (" in answer
    assert ("default's warm-up (100 s more than 'off') pays off only after 50,000 steps; its run "
            "took 188; the ranking leaves the warm-up out (--time train): --time total counts it") in row[-1]
    # A warm-up of 0.2 s pays off after 100 steps, within the run's 188: no warning.
    quick = _store(tmp_path / "q")
    _compile_pair(quick, compile_time_s=0.2)
    r = _cli(["--uri", quick.uri, "--out", "rep2"], tmp_path)
    answer = _answer((tmp_path / "rep2" / "report.md").read_text())
    assert _row(answer, "all 7 strategies")[1] == "default" and "pays off" not in answer


@pytest.mark.slow
def test_runs_of_different_sweeps_datasets_and_devices_are_warned_beside_the_answer(tmp_path):
    store = Store(tmp_path)
    _run(store, "a", {}, 10.0, tags={"sweep_id": "sw1", "device_name": "cpu"}, params={"dataset.name": "imdb"})
    _run(store, "b", {}, 12.0, tags={"sweep_id": "sw2", "device_name": "NVIDIA H100"},
         params={"dataset.name": "ag_news"})
    r = _cli(["--uri", store.uri, "--out", "rep"], tmp_path)
    assert r.returncode == 0, r.stderr
    answer = _answer((tmp_path / "rep" / "report.md").read_text())
    warned = next(x for x in answer.splitlines() if "not like for like" in x)
    for part in ("sweep: sw1 (1 run), sw2 (1 run)", "device: cpu (1 run), NVIDIA H100 (1 run)",
                 "dataset: imdb (1 run), ag_news (1 run)", "A winner may be ahead for how it was measured"):
        assert part in warned, part
    # Two runs in one sweep, on one device and dataset, give no such warning: checked on the first
    # store of test_no_repeats_is_warned_with_the_runner_up_and_repeats_say_ties (runs a and b of
    # sweep sw1, cpu, imdb), which reports it anyway: one report command fewer.


@pytest.mark.slow
def test_no_repeats_is_warned_with_the_runner_up_and_repeats_say_ties(tmp_path):
    store = Store(tmp_path)  # two configurations (their params differ), once each
    # ... of one sweep, on one device and dataset: like for like (the negative case of
    # test_runs_of_different_sweeps_datasets_and_devices_are_warned_beside_the_answer, checked here).
    like = {"tags": {"sweep_id": "sw1", "device_name": "cpu"}, "params": {"dataset.name": "imdb"}}
    _run(store, "a", {"attention": "eager"}, 10.0, **like)
    _run(store, "b", {"attention": "sdpa"}, 10.5, **like)
    r = _cli(["--uri", store.uri, "--out", "rep"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "not like for like" not in (tmp_path / "rep" / "report.md").read_text()
    answer = _answer((tmp_path / "rep" / "report.md").read_text())
    assert "WARNING, no repeats: every configuration ran once" in answer
    # Time and cost rank alike here (cost = time / 100): b's score is 10.5 / 10 of a's, +5.0 %.
    assert _row(answer, "all 7 strategies")[1] == "a" and _row(answer, "all 7 strategies")[7] == "b (score +5.0 %)"

    # Each configuration three times (seeds), their times overlapping: repeats, and the tie said.
    rep = _store(tmp_path / "r")
    for group, times in (("a", (10.0, 11.0, 12.0)), ("b", (10.5, 11.5, 12.5))):
        for seed, t in enumerate(times, 1):
            _run(rep, f"{group},train.seed={seed}", {}, t, tags={"config_key_noseed": group},
                 params={"train.seed": str(seed)})
    r = _cli(["--uri", rep.uri, "--out", "rep2"], tmp_path)
    answer = _answer((tmp_path / "rep2" / "report.md").read_text())
    assert "no repeats" not in answer
    assert "tied with b (95 % intervals overlap: the repeats cannot tell them apart)" in answer
    # The answer names configurations, never a seed, and its changes are of means over repeats: the
    # baseline (the slowest run, b's seed 3) stands for b's three runs, 11.5 s against a's 11.0 s.
    md = (tmp_path / "rep2" / "report.md").read_text()
    # b is the baseline and the repeats cannot tell a from it: keep what you run, with what a would change.
    assert ("**Keep what you run, 'b (3 runs)': no configuration is clearly better under any strategy: 'a (3 runs)' "
            "leads under every strategy (1.05x faster, -4.3 % cost, +0.00 pts accuracy against the baseline), tied "
            "with 'b', the baseline among them (the repeats cannot tell them apart).**") in md
    assert "the baseline is its configuration, 'b (3 runs)'" in md
    assert _row(answer, "all 7 strategies")[1:3] == ["a (3 runs)", "1.05x faster"]
    assert "train.seed=" not in _row(answer, "all 7 strategies")[1] and "Adopt" not in md

    # One configuration's three seeds: nothing to adopt, whichever seed happened to be fastest.
    one = _store(tmp_path / "one")
    for seed, t in enumerate((12.0, 10.0, 11.0), 1):
        _run(one, f"a,train.seed={seed}", {}, t, tags={"config_key_noseed": "a"}, params={"train.seed": str(seed)})
    r = _cli(["--uri", one.uri, "--out", "rep3"], tmp_path)
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "rep3" / "report.md").read_text()
    assert "Nothing to choose between: every run is one configuration, 'a (3 runs)'" in md
    assert "Adopt" not in md


@pytest.mark.slow
def test_the_answer_leads_the_page_and_its_chart_is_drawn_in_chromium(tmp_path, browser):
    # One store and one browser for both baselines (the defaults run, then --baseline precision=bf16):
    # the two reports are of the same three runs, each checked whole.
    from selenium.webdriver.common.by import By

    defaults = default_choices()
    store = Store(tmp_path)
    _run(store, "precision=bf16", {**defaults, "precision": "bf16"}, 40.0, energy_kwh=0.04)
    _run(store, "defaults", defaults, 20.0, energy_kwh=0.02)
    _run(store, "attention=sdpa", {**defaults, "attention": "sdpa"}, 10.0, energy_kwh=0.015, accuracy=0.91)
    for given in (None, "precision=bf16"):
        out = f"rep-{given or 'defaults'}"
        r = _cli(["--uri", store.uri, "--out", out] + (["--baseline", given] if given else []), tmp_path)
        assert r.returncode == 0, r.stderr
        if given:  # (was a second report in test_baseline_given_then_defaults_run_then_slowest, on these runs
            # without energy: the answer names the given baseline; sdpa 40 s / 10 s = 4.00x under all 7)
            answer = _answer((tmp_path / out / "report.md").read_text())
            assert "Baseline: 'precision=bf16', given with --baseline" in answer
            assert _row(answer, "all 7 strategies")[1:3] == ["attention=sdpa", "4.00x faster"]
        page = tmp_path / out / "report.html"
        browser.get(page.as_uri())
        sections = browser.find_elements(By.CSS_SELECTOR, "body > section")
        assert sections[0].get_attribute("id") == "answer"
        assert browser.find_elements(By.TAG_NAME, "h2")[0].text == "The answer: which configuration to adopt"
        # The chart is drawn: its bars (one per change: time, energy, cost of the one winner) have a size
        # on the page, and each carries its tooltip, the run's name and values.
        bars = sections[0].find_elements(By.CSS_SELECTOR, "svg .mark")
        assert len(bars) == 3
        for bar in bars:
            assert bar.size["width"] > 0 and bar.size["height"] > 0, bar.size
            tip = bar.find_element(By.TAG_NAME, "title").get_attribute("textContent")
            assert tip.startswith("attention=sdpa\nwins: all 7 strategies") and "speed: 2.00x faster" in tip \
                if not given else "speed: 4.00x faster" in tip
        # The bars are as long as the changes: against the defaults run time -50 %, energy 0.015 / 0.02 - 1 =
        # -25 %, cost -50 %; against bf16 -75 %, 0.015 / 0.04 - 1 = -62.5 %, -75 %.
        changes = {None: (-50.0, -25.0, -50.0), "precision=bf16": (-75.0, -62.5, -75.0)}[given]
        widths = [b.size["width"] for b in bars]
        for w, c in zip(widths, changes):
            assert w / widths[0] == pytest.approx(c / changes[0], rel=0.03)
        # Nothing was fetched: the page is one file (no script, stylesheet or image from elsewhere).
        assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0


@pytest.mark.slow
def test_weights_given_are_the_question_the_answer_answers(tmp_path):
    """With --weights the answer has a row per given strategy only (the thesis' seven stay in the
    tables below); a CSV has no group choices, so without --baseline its slowest row is the baseline."""
    (tmp_path / "runs.csv").write_text("name,time_s,cost_usd,energy_kwh,occupancy_pct,accuracy\n"
                                       "slow,20,2,0.4,50,0.90\nfast,10,1,0.3,50,0.88\nfrugal,15,0.5,0.1,50,0.89\n")
    r = _cli(["--csv", "runs.csv", "--weights", "money=0,1,0,0", "--weights", "speed=1,0,0,0", "--accuracy-floor",
              "off", "--out", "rep"], tmp_path)  # (fast is 2 points below slow: the default floor would leave it out)
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "rep" / "report.md").read_text()
    answer = _answer(md)
    rows = [x.split("|")[1].strip() for x in answer.splitlines() if x.startswith("| ") and "---" not in x][1:]
    assert rows == ["money", "speed"]
    assert "Baseline: 'slow', the slowest run: no run logged its config group choices" in answer
    # money: frugal (cost 0.5), 20 / 15 = 1.33x, energy 0.1 / 0.4 - 1 = -75 %, cost -75 %, accuracy -1 pt.
    assert _row(answer, "money")[1:6] == ["frugal", "1.33x faster", "-75.0 %", "-75.0 %", "-1.00 pts"]
    # speed: fast, 2x, energy -25 %, cost -50 %, accuracy -2 pts.
    assert _row(answer, "speed")[1:6] == ["fast", "2.00x faster", "-25.0 %", "-50.0 %", "-2.00 pts"]
    assert ("The weights decide: 2 configurations win under different strategies. 'frugal' is best under money "
            "(1.33x faster, -75.0 % energy, -75.0 % cost, -1.00 pts accuracy against the baseline); 'fast' is best "
            "under speed (2.00x faster") in answer
    assert "| balance |" in md.split("## Scores (thesis Table 5.4 form)")[1]
