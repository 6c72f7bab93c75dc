"""The 4-objective Pareto front, the best run per hardware, and the weight-space shares on a case
worked by hand (counts of integer points under linear inequalities)."""
from __future__ import annotations

import sys
from math import comb

import pytest

from bertaccel.report import OBJECTIVES, STRATEGIES, Row, pareto_front, score_rows
from bertaccel.report.pareto import pareto, row_points
from bertaccel.report.verdict import decide
from bertaccel.report.sections import hardware_table
from bertaccel.report.weights import simplex_grid, weight_map
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)


def _cli(args, cwd):
    return warm_cli.run([sys.executable, "-m", "bertaccel.report", *args], cwd=cwd, capture_output=True, text=True)


def test_four_objective_front_and_missing_values_are_explicit():
    rows = [Row("fast", 10, 1.0, 0.010, accuracy=0.80),
            Row("cheap", 20, 0.5, 0.020, accuracy=0.80),     # cheaper than fast: on the front too
            Row("beaten", 20, 1.0, 0.020, accuracy=0.80),    # fast is no worse anywhere, better on time
            Row("twin", 10, 1.0, 0.010, accuracy=0.80),      # equal to fast: neither beats the other
            Row("accurate", 30, 2.0, 0.030, accuracy=0.95),
            Row("no energy", 5, 0.1, None, accuracy=0.99, extra={"energy_kwh": "RAPL unavailable"})]
    points, why = row_points(rows)
    front = pareto(points, why)
    assert front.objectives == ["time_s", "cost_usd", "energy_kwh", "accuracy"]
    assert front.on_front == [0, 1, 3, 4]
    assert front.dominated_by == {2: [0, 1, 3]}
    assert front.left_out == {5: "energy_kwh null (RAPL unavailable)"}
    # With no run measuring energy, energy is dropped (said so) rather than every run left out.
    no_e = [Row(r.name, r.time_s, r.cost_usd, None, accuracy=r.accuracy) for r in rows]
    front = pareto(*row_points(no_e))
    assert front.dropped == {"energy_kwh": "no point has it"} and front.left_out == {}
    assert front.on_front == [5]  # 5 s, 0.1 USD, 0.99: beats every other on time, cost and accuracy


def test_pareto_front_keeps_its_two_objective_signature():
    rows = [Row("a", 10, 1.0, 0.01, 50, 0.90), Row("b", 5, 0.5, None, None, 0.80), Row("c", 8, 0.8, 0.008, 40, 0.91)]
    assert [r.name for r in pareto_front(rows)] == ["b", "c"]               # time vs accuracy, by time
    assert [r.name for r in pareto_front(rows, OBJECTIVES)] == ["c"]        # b has no energy: left out


def test_best_per_hardware_table():
    rows = [Row("a100 fp32", 10, 1.0, 0.01, 50, 0.9, hardware="a100"), Row("a100 bf16", 5, 0.5, 0.005, 50, 0.9,
                                                                           hardware="a100"),
            Row("t4 fp32", 40, 0.4, 0.02, 50, 0.9, hardware="t4"), Row("t4 fp16", 20, 0.2, 0.01, 50, 0.9,
                                                                       hardware="t4")]
    scored = score_rows(rows, STRATEGIES)
    title, note, headers, cells = hardware_table(rows, decide(rows, scored, None))
    assert headers[0] == "hardware" and headers[1:-1] == list(STRATEGIES)
    by_hw = {c[0]: c for c in cells}
    # balance: 0.3 T/40 + 0.3 C/1.0 + 0.3 E/0.02 - 0.1 x 1 (occupancy all equal)
    assert by_hw["a100"][1] == f"a100 bf16 ({0.3 * 5 / 40 + 0.3 * 0.5 + 0.3 * 0.25 - 0.1:.3f})"
    assert by_hw["t4"][1] == f"t4 fp16 ({0.3 * 20 / 40 + 0.3 * 0.2 + 0.3 * 0.5 - 0.1:.3f})"
    assert hardware_table(rows[:2], decide(rows[:2], score_rows(rows[:2], STRATEGIES), None)) is None  # one hardware


def test_simplex_grid_is_every_twentieth_once():
    grid = simplex_grid()
    assert len(grid) == len(set(grid)) == comb(23, 3) == 1771
    assert all(sum(p) == 20 and min(p) >= 0 for p in grid)
    for w in STRATEGIES.values():  # the thesis' strategies are grid points
        assert tuple(round(x * 20) for x in w) in grid


def test_weight_shares_on_a_case_worked_by_hand():
    # Normalized (T, C, E, O): A = (1, 1, 1, 1), B = (0.5, 1, 1, 0.5), C = (1, 1, 1, 0.5).
    # B - A = 0.5 (w4 - w1): B wins where a > d, A where a < d ((a, b, c, d) in twentieths), tie at
    # a = d. C - B = 0.5 w1 >= 0: C never wins alone, ties B at a = 0. Counts: a = d = k leaves
    # b + c = 20 - 2k, 21 - 2k points, k = 0..10: 121 points with a = d; a > d and a < d split the
    # other 1650 evenly, 825 each; a = d = 0 (21 points) ties all three, a = d > 0 (100) ties A, B.
    rows = [Row("A", 10, 1, 1, 100), Row("B", 5, 1, 1, 50), Row("C", 10, 1, 1, 50)]
    scored = score_rows(rows, STRATEGIES)
    wm = weight_map(scored.normalized, [[0], [1], [2]], ["A", "B", "C"])
    assert wm.won == {0: 825, 1: 825}
    assert wm.ties == {(0, 1): 100, (0, 1, 2): 21}
    assert wm.unscored == 0 and sum(wm.won.values()) + sum(wm.ties.values()) == 1771
    assert wm.share(825) == pytest.approx(825 / 1771)
    # A wins where w4 > w1: its region's mean w4 exceeds its mean w1, and B's the other way.
    assert wm.centroid(0)[3] > wm.centroid(0)[0] and wm.centroid(1)[0] > wm.centroid(1)[3]
    # A candidate kept from "best" does not compete: B against C alone, tied where a = 0 (b + c + d
    # = 20: C(22, 2) = 231 points), B everywhere else.
    wm = weight_map(scored.normalized, [[0], [1], [2]], ["A", "B", "C"], left_out={0: "accuracy < floor"})
    assert wm.won == {1: 1771 - 231} and wm.ties == {(1, 2): 231} and wm.left_out == {0: "accuracy < floor"}


def test_weight_shares_of_groups_average_their_runs_and_unmeasured_corners_have_no_score():
    # No energy, no occupancy: at the 21 points with w1 = w2 = 0 nothing weighted is measured.
    rows = [Row("x1", 10, 1.0), Row("x2", 14, 1.4), Row("y1", 11, 1.1), Row("y2", 12, 1.2)]
    scored = score_rows(rows, STRATEGIES)
    wm = weight_map(scored.normalized, [[0, 1], [2, 3]], ["x", "y"])
    assert wm.unscored == 21 and wm.won == {1: 1750}  # y's mean 11.5 < x's mean 12


@pytest.mark.slow
def test_cli_writes_the_front_the_shares_and_their_plots(tmp_path):
    csv = tmp_path / "runs.csv"
    csv.write_text("name,time_s,cost_usd,energy_kwh,occupancy_pct,accuracy,hardware\n"
                   "A,10,1,1,100,0.9,gpu1\nB,5,1,1,50,0.9,gpu2\nC,10,1,1,50,0.9,gpu2\n")
    r = _cli(["--csv", str(csv), "--out", "rep"], tmp_path)
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "rep" / "report.md").read_text()
    shares = md.split("## Weight sensitivity")[1].split("\n## ")[0]
    assert "| A | 825 | 46.6% |" in shares and "| B | 825 | 46.6% |" in shares
    assert "| tie: A = B | 100 | 5.6% |" in shares and "| tie: A = B = C | 21 | 1.2% |" in shares
    front = md.split("## Pareto front over time, cost, energy and accuracy (runs)")[1].split("\n## ")[0]
    assert "| B | 5.00 | 1 | 1.00000 | 0.9000 | **yes** |" in front
    assert "| A | 10.00 | 1 | 1.00000 | 0.9000 | no: beaten by B |" in front
    assert "## Best configuration per hardware (thesis Table 4.16 form)" in md
    plots = {p.name for p in (tmp_path / "rep" / "plots").iterdir()}
    assert {"pareto_front.png", "weight_map.png"} <= plots
    html = (tmp_path / "rep" / "report.html").read_text()
    assert html.count("<svg ") + html.count("data:image/png;base64,") == 6  # the answer's chart + 5 as before
