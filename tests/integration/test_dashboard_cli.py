"""`gfaas dashboard`: starts a runtime and gateway on loopback, prints the page's address, serves it to
this user without a token, and stops on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.timeout(120)


def test_gfaas_dashboard_prints_its_address_and_serves_the_page(tmp_path: Path) -> None:
    env = {**os.environ, "GFAAS_RUN_DIR": str(tmp_path / "run")}
    proc = subprocess.Popen([sys.executable, "-m", "gfaas", "dashboard", "--port", "0", "--state-dir",
                             str(tmp_path / "gw")], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env=env)
    try:
        assert proc.stderr is not None
        url = None
        deadline = time.monotonic() + 90
        seen = []
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            seen.append(line)
            m = re.match(r"dashboard: (http://127\.0\.0\.1:\d+/dashboard)$", line.strip())
            url = m.group(1) if m else None
        assert url, "".join(seen)
        page = httpx.get(url, timeout=30)
        assert page.status_code == 200 and "gfaas dashboard" in page.text
        state = httpx.get(url.replace("/dashboard", "/v1/dashboard/state"), timeout=30).json()
        assert state["workflows"] == [] and state["nodes"][0]["tiers"]  # nothing deployed; the node reports
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
