"""The MLflow UI a user opens on a real sweep's store, read in headless Chromium: a real 2x2 sweep
(the CLI, tiny model on the CPU), `mlflow ui` on a free port of 127.0.0.1, and the page the sweep's
summary points at. It must open on the training runs (not MLflow 3's GenAI overview), list the
parent run by its swept axes, show each run's dataset in the Dataset column and its filter, and
list the sweep's report among the parent run's artifacts.

BERTACCEL_DOCS_SCREENSHOTS=1 also writes the runs page to docs/img/mlflow-ui-runs.png (the docs'
picture, docs/mlflow-ui.md); otherwise the screenshot stays in the test's temp directory.
"""
from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
from browser import browser  # noqa: F401 - the fixture
from conftest import TINY
from services import free_port, mlflow_service

from bertaccel.record.tracking import search_runs

# Every test here starts a real process (the CLI, a script, a server) or trains: slow (docs/contributing.md).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
# (options every CPU runs: bf16 is skipped on a CPU without native bf16, and its runs have no dataset)
AXES = "optimizer=adamw,lamb x attention=eager,sdpa"
PAGE_WAIT_S = 60
STOP_WAIT_S = 10
NAME_WIDEN_PX = 190  # the screenshot's Run Name column: from 190 px to fit the parent's axes


@pytest.fixture
def swept_store(cli):
    """A store holding a finished 2x2 sweep; yields (its URI, the sweep's stdout)."""
    proc = cli(["-m", "optimizer=adamw,lamb", "attention=eager,sdpa", *TINY])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cli.store, proc.stdout


@pytest.fixture
def mlflow_ui(swept_store, tmp_path) -> Iterator[str]:
    """`mlflow ui` on the sweep's store, on a free port of 127.0.0.1; yields its address."""
    uri, _ = swept_store
    argv = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1",
            "--port", str(free_port())]
    with mlflow_service(argv, tmp_path / "mlflow-ui.log", start_timeout_s=120, stop_wait_s=STOP_WAIT_S,
                        cwd=tmp_path) as base:
        yield base


def _wait_for(driver, what: str, test, timeout_s: float = PAGE_WAIT_S):
    """The first truthy test(driver) within timeout_s; the assertion names what was awaited and
    what the page showed instead."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            found = test(driver)
        except Exception:  # noqa: BLE001 - the page is still rendering (stale or missing elements)
            found = None
        if found:
            return found
        time.sleep(0.5)
    body = driver.find_element("tag name", "body").text
    raise AssertionError(f"{what} not shown in {timeout_s} s at {driver.current_url}; the page shows:\n{body[:2000]}")


def _cells(driver, column: str):
    return driver.find_elements("css selector", f".ag-row [col-id='attributes.`{column}`']")


def _close_assistant(driver) -> None:
    """MLflow 3.17 opens its Assistant panel beside the runs: closed, as a user would, for room."""
    for button in driver.find_elements("css selector", "button[aria-label='Close']"):
        if button.is_displayed():
            button.click()
            return


def _widen_names(driver) -> None:
    """For the screenshot: the Run Name column dragged wide enough for the parent's axes."""
    from selenium.webdriver.common.action_chains import ActionChains

    handle = driver.find_element("css selector", ".ag-header-cell[col-id='attributes.`Run Name`'] .ag-header-cell-resize")
    ActionChains(driver).click_and_hold(handle).move_by_offset(NAME_WIDEN_PX, 0).release().perform()


def _runs_page(driver, base: str, stdout: str) -> str:
    """Open the page the sweep's summary points at, on this server; its experiment id."""
    line = re.search(r"MLflow UI: http://127\.0\.0\.1:5000/(#/experiments/(\d+)/runs\?\S+)", stdout)
    assert line, f"the sweep's summary gives no MLflow UI address:\n{stdout[-2000:]}"
    driver.get(f"{base}/{line.group(1)}")
    return line.group(2)


def test_the_mlflow_ui_shows_the_sweep_as_a_user_reads_it(browser, mlflow_ui, swept_store, tmp_path):  # noqa: F811
    uri, stdout = swept_store
    driver = browser
    exp_id = _runs_page(driver, mlflow_ui, stdout)
    # Opens on the training runs: the runs table, not the GenAI overview (traces, "No data").
    names = _wait_for(driver, "the runs table", lambda d: [c.text for c in _cells(d, "Run Name") if c.text])
    assert "/runs" in driver.current_url and "/overview" not in driver.current_url, driver.current_url
    assert "No data available" not in driver.find_element("tag name", "body").text
    # The parent run is named by what the sweep varied.
    assert any(AXES in n for n in names), names
    _close_assistant(driver)
    # Its runs, nested under it, show their dataset (name and digest) in the Dataset column.
    parent_cell = next(c for c in _cells(driver, "Run Name") if AXES in c.text)
    parent_cell.find_element("css selector", "button").click()
    datasets = _wait_for(driver, "the runs' datasets", lambda d: [c.text for c in _cells(d, "Dataset")
                                                                  if "ag_news_sample" in c.text])
    children = [r for r in search_runs(uri, "bertaccel") if r.data.tags.get("bertaccel.role") != "sweep"]
    digest = {i.dataset.digest for r in children for i in r.inputs.dataset_inputs if i.tags[0].value == "train"}
    assert len(children) == 4 and len(datasets) == 4 and len(digest) == 1, (datasets, digest)
    assert all(next(iter(digest)) in text for text in datasets), (datasets, digest)
    _widen_names(driver)
    shot = tmp_path / "mlflow-ui-runs.png"
    driver.save_screenshot(str(shot))
    if os.environ.get("BERTACCEL_DOCS_SCREENSHOTS") == "1":
        (ROOT / "docs" / "img").mkdir(exist_ok=True)
        driver.save_screenshot(str(ROOT / "docs" / "img" / "mlflow-ui-runs.png"))
    # The Datasets filter offers the dataset.
    driver.find_element("css selector", "button[aria-label^='Datasets']").click()
    _wait_for(driver, "ag_news_sample in the Datasets filter",
              lambda d: any("ag_news_sample" in o.text for o in d.find_elements("css selector", "[role=option]")))
    # The sweep's report is among the parent run's artifacts.
    parent = next(r for r in search_runs(uri, "bertaccel") if r.data.tags.get("bertaccel.role") == "sweep")
    driver.get(f"{mlflow_ui}/#/experiments/{exp_id}/runs/{parent.info.run_id}/artifacts?workflowType=machine_learning")
    folder = _wait_for(driver, "the report folder among the parent's artifacts",
                       lambda d: next(e for e in d.find_elements("xpath", "//*[normalize-space(text())='report']")
                                      if e.is_displayed()))
    folder.click()
    _wait_for(driver, "report.html in the parent's report folder",
              lambda d: any(e.is_displayed() for e in d.find_elements("xpath", "//*[normalize-space(text())='report.html']")))
