"""A 24-run grid that reads (issue 44 item 6), on a real store written as job.py writes a sweep's
runs and read in a real headless Chromium at 1,200 px: runs labelled by their varying values with
the order said once, tables within the page, hollow markers hoverable inside, accuracy changes in
points, no time-vs-cost plot when cost is time at one price, predicted-vs-measured last with its
basis named and a cold profile's prediction warned."""
from __future__ import annotations

import itertools
import re
import sys

import pytest
from browser import browser  # noqa: F401  (the headless Chromium fixture)
from report_store import Store
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

PRICE_PER_S = 3.0 / 3600  # one hardware profile's price: every run's cost is its time x this
GRID = {"encoder": ("hf", "fused"), "optimizer": ("adamw", "adan_fused"), "precision": ("fp32", "fp16"),
        "train.batch_size": ("8", "16", "32")}
ORDER = "encoder / optimizer / precision / train.batch_size"


def _name(values) -> str:
    return ",".join(f"{k}={v}" for k, v in zip(GRID, values))


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """The thesis grid's shape (2 x 2 x 2 x 3 = 24 runs, named by their overrides as the sweeper
    names them), its report written once: (folder, markdown, html, store)."""
    tmp = tmp_path_factory.mktemp("grid")
    store = Store(tmp)
    ids = {}
    for k, values in enumerate(itertools.product(*GRID.values())):
        choice = dict(zip(GRID, values))
        batch = int(choice["train.batch_size"])
        time_s = 40.0 / batch * (0.8 if choice["encoder"] == "fused" else 1.0) * (0.7 if choice["precision"] == "fp16"
                                                                                   else 1.0) + k * 0.01
        metrics = {"train_time_s": time_s, "cost_usd": time_s * PRICE_PER_S, "energy_kwh": time_s * 2e-4,
                   "occupancy_pct": 20.0 + k, "test_accuracy": 0.85 - 0.001 * k}
        tags = {"hardware_profile": "h200"}
        # The first run was predicted from the profile's default MFU (cold), the later ones from it.
        if k == 0:
            tags["prediction_basis"] = "profile 'h200': no similar finished run; default MFU 0.3 x peak_tflops_fp32 66.9"
            metrics["predicted_train_time_s"] = time_s / 60
        else:
            first = _name(next(itertools.product(*GRID.values())))
            tags["prediction_basis"] = f"runs: {first} ({ids[first][:8]}); let go: optimizer"
            metrics["predicted_train_time_s"] = time_s * 1.1
        params = {**choice, "attention": "eager", "compile": "off", "freezing": "none", "preset": "none",
                  "accumulation": "1", "num_gpus": "1", "train.seed": "42"}
        ids[_name(values)] = store.log(_name(values), params, metrics, tags)
    out = tmp / "rep"
    r = warm_cli.run([sys.executable, "-m", "bertaccel.report", "--uri", store.uri, "--out", str(out)],
                     capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out, (out / "report.md").read_text(), out / "report.html", ids


def _section(md: str, title_start: str) -> str:
    parts = re.split(r"^## ", md, flags=re.M)
    return next(p for p in parts if p.startswith(title_start))


@pytest.mark.slow
def test_runs_are_labelled_by_their_values_and_the_order_is_said_once(grid):
    out, md, html, ids = grid
    answer = _section(md, "The answer")
    assert f"Runs are labelled {ORDER} (" in answer
    raw = _section(md, "Raw metrics")
    assert "| 0 | hf / adamw / fp32 / 8 | h200 |" in raw and "| 23 | fused / adan_fused / fp16 / 32 | h200 |" in raw
    # A full name appears only in the table that maps each label to its MLflow run (and in tooltips).
    full = "encoder=fused,optimizer=adan_fused,precision=fp16,train.batch_size=32"
    assert [p.split("\n")[0] for p in re.split(r"^#{2,3} ", md, flags=re.M) if full in p] == [
        "Runs: each label's MLflow run name and id"]
    assert f"| fused / adan_fused / fp16 / 32 | {full} | {ids[full]} |" in md
    assert f"title='{full}'>fused / adan_<wbr>fused / fp16 / 32</td>" in html.read_text()


@pytest.mark.slow
def test_no_table_is_wider_than_a_1200_px_window(grid, browser):  # noqa: F811
    _, _, html, _ = grid
    browser.set_window_size(1200, 1000)
    browser.get(html.as_uri())
    browser.execute_script("document.querySelectorAll('details').forEach(d => d.open = true)")  # (folded sections)
    inner = browser.execute_script("return window.innerWidth")
    assert inner <= 1200
    widest = browser.execute_script(
        "return Math.max(...[...document.querySelectorAll('table')].map(t => t.getBoundingClientRect().right))")
    assert widest <= inner and browser.execute_script("return document.documentElement.scrollWidth") <= inner


@pytest.mark.slow
def test_a_hollow_marker_is_hoverable_at_its_centre(grid, browser):  # noqa: F811
    _, _, html, _ = grid
    browser.get(html.as_uri())
    browser.execute_script("document.querySelectorAll('details').forEach(d => d.open = true)")  # (folded sections)
    # A dominated run's marker on the Pareto plot: hollow (fill none), its outline a pixel wide.
    found = browser.execute_script("""
        const marks = [...document.querySelectorAll('#figure-pareto_front .mark')].filter(
            m => m.querySelector('path') && getComputedStyle(m.querySelector('path')).fill === 'none');
        const m = marks[0];
        m.scrollIntoView({block: 'center'});
        const b = m.querySelector('path').getBoundingClientRect();
        const hit = document.elementFromPoint(b.left + b.width / 2, b.top + b.height / 2);
        return [marks.length, m.id, hit && hit.closest('.mark') ? hit.closest('.mark').id : String(hit && hit.tagName)];
    """)
    count, mark, hit = found
    assert count > 0 and hit == mark


@pytest.mark.slow
def test_the_baseline_table_shows_accuracy_changes_in_points(grid):
    _, md, _, _ = grid
    table = _section(md, "Against the baseline")
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ") and not line.startswith("| run |")]
    assert len(rows) == 24
    changes = [r[-1].rstrip(" |") for r in rows]
    assert all(re.fullmatch(r"[+-]\d+\.\d\d pts", c) for c in changes), changes
    assert "+0.00 pts" in changes  # the baseline's own row
    # Run 0 (hf / adamw / fp32 / 8, 0.850) is 0.2 points above the defaults run (batch 32, 0.848).
    assert rows[0][-1].rstrip(" |") == "+0.20 pts"


@pytest.mark.slow
def test_no_time_vs_cost_plot_when_cost_is_time_at_one_price(grid):
    out, md, _, _ = grid
    plots = {p.name for p in (out / "plots").iterdir()}
    assert "time_vs_cost.png" not in plots and "cost_vs_accuracy.png" not in plots
    assert "time_vs_energy.png" in plots
    assert "cost = time x one price (3 USD/h) for every run: no time-vs-cost plot" in md


@pytest.mark.slow
def test_predicted_vs_measured_is_the_last_section_and_names_its_basis(grid):
    _, md, html, ids = grid
    last = re.split(r"^#{2,3} ", md, flags=re.M)[-1]
    assert last.startswith("Appendix: predicted vs measured (bertaccel.plan)")
    cold = next(line for line in last.splitlines() if line.startswith("| hf / adamw / fp32 / 8 |"))
    assert "a default MFU (cold profile)" in cold and "cold profile: expect tens of % off" in cold
    first = _name(next(itertools.product(*GRID.values())))
    warm = next(line for line in last.splitlines() if line.startswith("| fused / adan_fused / fp16 / 32 |"))
    assert f"calibrated from runs hf / adamw / fp32 / 8 ({ids[first][:8]}); let go: optimizer" in warm
    assert "cold profile" not in warm
    page = html.read_text()  # (the last heading of the page: an appendix section's <h3>, or an <h2>)
    assert max(page.rindex("<h2>"), page.rindex("<h3>")) == page.index("Appendix: predicted vs measured", page.index("<section")) - 4


def test_the_weight_map_gives_each_winner_its_own_colour():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bertaccel.report.figures import distinct_colours

    colours = distinct_colours([0, 3, 10, 13], plt)  # k % 10 gave 0 and 10 (3 and 13) one colour
    assert len(set(colours.values())) == 4
    assert len(set(distinct_colours(list(range(24)), plt).values())) == 24
