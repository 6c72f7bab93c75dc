"""A real headless Chromium for the tests that read what a user sees (the report's HTML, the MLflow
UI), driven with Selenium.

Chromium and its driver come from Debian's packages (`chromium`, `chromium-driver`): installed here
if missing (apt-get; CI runs as root), skipped with the reason only where that cannot be done.
The driver's path is given to Selenium, so Selenium Manager never tries to download one.
"""
from __future__ import annotations

import shutil
from typing import Iterator, Optional

import pytest
from services import apt_install

PACKAGES = ("chromium", "chromium-driver")


def _binaries() -> Optional[tuple]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


@pytest.fixture
def browser() -> Iterator["object"]:
    """A headless Chromium WebDriver, 1400x1000, closed at the end."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed: pip install -e '.[test]'")
    found = _binaries()
    if found is None:
        why = apt_install(PACKAGES, "Chromium")
        if why is not None:
            pytest.skip(why)
        found = _binaries()
        assert found is not None, "apt-get installed chromium but chromium or chromedriver is not on PATH"
    chromium, chromedriver = found
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    # --no-sandbox: Chromium's sandbox refuses to run as root (CI runs as root).
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=opts)
    driver.set_page_load_timeout(120)
    try:
        yield driver
    finally:
        driver.quit()
