"""Headless Chromium for the dashboard's browser tests (issue 19), through Selenium and Debian's
chromium-driver. `make test` installs chromium and chromium-driver with apt when it can; elsewhere
these tests skip, naming what is missing."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest


def browser_skip_reason() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "needs selenium (pip install -e '.[dev]')"
    for exe in ("chromium", "chromedriver"):
        if shutil.which(exe) is None:
            return f"needs {exe}: apt-get install chromium chromium-driver (make test does, as root)"
    return None


def new_driver(width: int = 1400, height: int = 1000) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or "chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", "--no-proxy-server"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)


@pytest.fixture
def driver() -> Iterator[Any]:
    why = browser_skip_reason()
    if why:
        pytest.skip(why)
    d = new_driver()
    try:
        yield d
    finally:
        d.quit()
