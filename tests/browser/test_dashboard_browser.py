"""The dashboard as a person uses it, in headless Chromium: the page paints within a second, its live
numbers move while a workload runs, a deploy through the page works, and the console stays clean."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from gfaas.bench.overload_handlers import SPEC
from gfaas.runtime.wire import encode_array as encode

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def served(make_config: Any) -> Iterator[tuple[Any, Any]]:
    from gfaas.dataplane.local import LocalNode
    from gfaas.runtime.gateway import GatewayLimits, serve
    from gfaas.runtime.local import LocalRuntime, NodeEndpoint, RuntimeConfig

    with LocalNode(make_config()) as node:
        ep = NodeEndpoint("n0", node.config.socket_path, node.config.state_dir)
        limits = GatewayLimits(handler_packages=("gfaas.workflows",))
        with LocalRuntime(RuntimeConfig(nodes=(ep,))) as rt, \
                serve(rt, host="127.0.0.1", port=0, limits=limits) as gw:
            rt.deploy(SPEC)
            yield rt, gw


def _errors(driver: Any) -> list[dict[str, Any]]:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def _wait(pred: Any, timeout: float = 30.0) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError("timed out waiting")


def test_page_paints_fast_and_live_numbers_move_under_load(served: tuple[Any, Any], driver: Any) -> None:
    from selenium.webdriver.common.by import By

    rt, gw = served
    driver.get(gw.url + "/dashboard")
    fcp = _wait(lambda: driver.execute_script(  # the entry appears once the browser has painted
        "const e = performance.getEntriesByName('first-contentful-paint')[0]; return e ? e.startTime : null;"), 5.0)
    assert fcp <= 1000, f"first contentful paint {fcp} ms"
    _wait(lambda: "live" in driver.find_element(By.ID, "conn").get_attribute("class"))

    def cell(css: str) -> str | None:  # read in the page: the rows are redrawn every second
        got: str | None = driver.execute_script(
            "const c = document.querySelector(arguments[0]); return c ? c.textContent : null;", css)
        return got

    def done() -> int:
        text = cell('tr[data-workflow="overload"] td.done')
        return int(text) if text else -1

    _wait(lambda: done() >= 0)  # the deployed workflow's row is there
    stop = threading.Event()

    def load() -> None:  # through the gateway, as clients do: the dashboard shows the gateway's traffic
        with httpx.Client(base_url=gw.url, timeout=60, headers={"authorization": f"Bearer {gw.token}"}) as c:
            while not stop.is_set():
                r = c.post("/v1/workflows/overload/invocations", json={"inputs": {"n": encode(np.int64(256))}})
                assert r.status_code == 200, r.text

    t = threading.Thread(target=load, daemon=True)
    t.start()
    try:
        first = _wait(lambda: done() if done() > 0 else None)
        _wait(lambda: done() > first)  # it keeps moving, pushed by the stream
        assert float(cell('tr[data-workflow="overload"] td.rate') or 0) > 0
    finally:
        stop.set()
        t.join(60)
    assert _errors(driver) == []


def test_a_deploy_through_the_page_works(served: tuple[Any, Any], driver: Any) -> None:
    from selenium.webdriver.common.by import By

    rt, gw = served
    driver.get(gw.url + "/dashboard#deploy")
    driver.find_element(By.ID, "token").send_keys(gw.token)
    spec = driver.find_element(By.ID, "spec")
    text = spec.get_attribute("value").replace("name: tiny", "name: from-the-page", 1)
    driver.execute_script("arguments[0].value = arguments[1];", spec, text)
    driver.find_element(By.ID, "deploy-btn").click()
    out = _wait(lambda: driver.find_element(By.ID, "deploy-out").text.startswith("201") and
                driver.find_element(By.ID, "deploy-out").text)
    assert "from-the-page" in out and "from-the-page" in rt.workflows()
    driver.get(gw.url + "/dashboard#overview")
    _wait(lambda: driver.execute_script(
        "return document.querySelector('tr[data-workflow=\"from-the-page\"]') !== null;"))
    assert _errors(driver) == []


def test_results_tab_shows_a_committed_result_with_its_commit(served: tuple[Any, Any], driver: Any) -> None:
    from selenium.webdriver.common.by import By

    _, gw = served
    driver.get(gw.url + "/dashboard#results")
    rows = _wait(lambda: driver.find_elements(By.CSS_SELECTOR, "#results tr.clickable"))
    pick = next(r for r in rows if "overload.json" in r.text)
    pick.click()
    # Until the document is in, the panel shows its id ("committed/...", which holds "commit") and
    # "loading...": wait for what only the loaded document shows.
    header = _wait(lambda: driver.find_element(By.ID, "result").text if "Targets" in
                   driver.find_element(By.ID, "result").text else None)
    assert "overload.json" in header and "Targets" in header and "loading" not in header
    assert _errors(driver) == []


def test_nodes_tab_shows_the_daemons_tiers_and_topology(served: tuple[Any, Any], driver: Any) -> None:
    _, gw = served
    driver.get(gw.url + "/dashboard#nodes")
    text = _wait(lambda: driver.execute_script(
        "const n = document.querySelector('#nodes .node'); return n && n.querySelector('svg.topology') ? "
        "n.textContent : null;"))
    assert "host" in text and "live" in text and "Counters" in text
    assert _errors(driver) == []
