"""The dashboard's screenshots in docs/ (`make dashboard-screenshots`): a local runtime and gateway, two
tiny workflows under a steady load, and headless Chromium on each tab. It also records the page's first
contentful paint (loaded five times, cold browser each time) in benchmarks/results/dashboard-cpu.json.

    .venv/bin/python scripts/dashboard_screenshots.py docs     # writes docs/dashboard-*.png and the result
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "browser"))


def driver_version() -> str:
    try:
        return subprocess.run(["chromium", "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except OSError:
        return "?"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default="docs", help="where the screenshots go (default docs)")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "dashboard-cpu.json"), metavar="FILE",
                    help="where the first-paint times go (default benchmarks/results/dashboard-cpu.json)")
    return ap


def main() -> int:
    import httpx
    from selenium.webdriver.common.by import By

    from conftest import browser_skip_reason, new_driver  # type: ignore[import-not-found]
    from gfaas.bench.overload_handlers import SPEC
    from gfaas.runtime.gateway import GatewayLimits, serve
    from gfaas.runtime.local import LocalRuntime, RuntimeConfig
    from gfaas.runtime.wire import encode_array

    a = build_parser().parse_args()
    out = Path(a.out)
    why = browser_skip_reason()
    if why:
        print(f"dashboard_screenshots: {why}", file=sys.stderr)
        return 2
    limits = GatewayLimits(handler_packages=("gfaas.workflows",))
    with LocalRuntime(RuntimeConfig()) as rt, serve(rt, host="127.0.0.1", port=0, limits=limits) as gw:
        rt.deploy(SPEC)
        rt.deploy(SPEC.replace("name: overload", "name: overload-big", 1))
        stop = threading.Event()

        def load(name: str, n: int, pause: float) -> None:  # through the gateway, as clients do
            body = {"inputs": {"n": encode_array(np.int64(n))}}
            with httpx.Client(base_url=gw.url, timeout=60, headers={"authorization": f"Bearer {gw.token}"}) as c:
                while not stop.is_set():
                    c.post(f"/v1/workflows/{name}/invocations", json=body)
                    time.sleep(pause)

        threads = [threading.Thread(target=load, args=a, daemon=True)
                   for a in (("overload", 256, 0.01), ("overload-big", 1 << 20, 0.05))]
        for t in threads:
            t.start()
        paints = []
        for _ in range(5):  # a fresh browser each time: nothing cached
            d = new_driver(1400, 900)
            try:
                d.get(gw.url + "/dashboard")
                fcp = None
                for _ in range(50):  # the entry appears once the browser has painted: wait for it (5 s at most)
                    fcp = d.execute_script("const e = performance.getEntriesByName('first-contentful-paint')[0]; "
                                           "return e ? e.startTime : null;")
                    if fcp is not None:
                        break
                    time.sleep(0.1)
                paints.append(fcp)
            finally:
                d.quit()
        from gfaas.cli_bench import cli_settings
        from gfaas.provenance import provenance

        doc = {"first_contentful_paint_ms": paints, "max_ms": max((p for p in paints if p is not None), default=None),
               "target": {"what": "first paint <= 1 s on loopback", "met": all(p is not None and p <= 1000 for p in paints)},
               "chromium": driver_version(), "provenance": provenance(settings=cli_settings(a))}
        Path(a.json).write_text(json.dumps(doc, indent=2) + "\n")
        print(f"  first contentful paint {paints} ms", file=sys.stderr)
        driver = new_driver(1400, 900)
        try:
            print(f"dashboard at {gw.url}/dashboard; letting the chart fill for 20 s ...", file=sys.stderr)
            driver.get(gw.url + "/dashboard#overview")
            time.sleep(20)
            shots = {"overview": None, "nodes": None, "scaling": None}
            for tab in shots:
                driver.get(f"{gw.url}/dashboard#{tab}")
                time.sleep(3)
                path = out / f"dashboard-{tab}.png"
                driver.save_screenshot(str(path))
                print(f"  {path}", file=sys.stderr)
            driver.get(gw.url + "/dashboard#results")
            time.sleep(1)
            rows = driver.find_elements(By.CSS_SELECTOR, "#results tr.clickable")
            pick = next((r for r in rows if "sim-experiments.json" in r.text), rows[0] if rows else None)
            if pick is not None:
                pick.click()
                time.sleep(2)
                driver.execute_script("document.getElementById('result').scrollIntoView();")
            path = out / "dashboard-results.png"
            driver.save_screenshot(str(path))
            print(f"  {path}", file=sys.stderr)
        finally:
            driver.quit()
            stop.set()
            for t in threads:
                t.join(60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
