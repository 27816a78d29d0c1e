"""The dashboard's routes (issue 19): the page and its files, the live snapshot and stream, the results browser."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gfaas.runtime.gateway import create_app
from gfaas.runtime.result import Breakdown, InvocationResult

PNG = b"\\x89PNG\\r\\n\\x1a\\n" + b"\\0" * 32


class _Runtime:
    """The read side of a runtime the dashboard asks."""

    def workflows(self) -> list[str]:
        return ["w"]

    def queue_depths(self) -> dict[str, int]:
        return {"w/f": 3}

    def scaling_status(self, name: str) -> dict[str, Any]:
        return {"workflow": name, "version": 2, "functions": {"f": {"warm": 2, "idle": 1, "busy": 1, "starting": 0,
                "cold_starts": 4, "memory": {"rss_bytes": 300, "pss_bytes": 200, "processes": 2}}}, "nodes": {}}



class _RuntimeWithNodes(_Runtime):
    """... and ``node_snapshots`` as the node daemons answer them."""

    def node_snapshots(self) -> list[dict[str, Any]]:
        return [{"node_id": "n0", "tiers": {"host": {"bytes_live": 10, "capacity_bytes": 100}}}]


def _results(tmp: Path) -> list[tuple[str, str]]:
    (tmp / "c").mkdir()
    (tmp / "c" / "a.json").write_text(json.dumps({"provenance": {"commit": "f" * 40, "utc": "2026-01-01T00:00:00Z"},
                                                  "rows": [{"x": 1}]}))
    (tmp / "o" / "run").mkdir(parents=True)
    (tmp / "o" / "run" / "results.json").write_text(json.dumps({"experiments": []}))
    (tmp / "o" / "run" / "fig.png").write_bytes(PNG)
    (tmp / "o" / "broken.json").write_text("{not json")
    return [("committed", str(tmp / "c")), ("local", str(tmp / "o"))]


@pytest.fixture
def client(tmp_path: Path) -> Any:
    app = create_app(_RuntimeWithNodes(), token="t0k", results_dirs=_results(tmp_path))  # type: ignore[arg-type]
    with TestClient(app, headers={"authorization": "Bearer t0k"}) as c:
        yield c


def test_page_and_its_files_come_from_the_package(client: TestClient) -> None:
    page = client.get("/dashboard")
    assert page.status_code == 200 and "gfaas dashboard" in page.text
    for ref in ("/dashboard/static/dashboard.js", "/dashboard/static/dashboard.css",
                "/dashboard/static/uplot-1.6.32.iife.min.js", "/dashboard/static/uplot-LICENSE.txt"):
        assert ref.rsplit("/", 1)[1] in page.text or ref.endswith("LICENSE.txt")
        assert client.get(ref).status_code == 200, ref
    assert "http://" not in page.text and "https://" not in page.text  # nothing from the network
    assert client.get("/dashboard/static/nope.js").status_code == 404


def test_state_reports_live_rates_workers_and_the_nodes(client: TestClient) -> None:
    gw = client.app.state.gateway  # type: ignore[attr-defined]
    gw.tracker.submitted("i1", "w")
    gw.tracker.finished(InvocationResult(invocation_id="i1", workflow="w", status="done",
                                         breakdown=Breakdown(queue_s=0.001, compute_s=0.004, total_s=0.010)))
    s = client.get("/v1/dashboard/state").json()
    (w,) = s["workflows"]
    assert (w["name"], w["version"], w["done"], w["failed"]) == ("w", 2, 1, 0)
    assert w["p50_ms"] == pytest.approx(10.0) and w["breakdown_ms"]["compute"] == pytest.approx(4.0)
    assert w["functions"]["f"]["queue_depth"] == 3 and w["functions"]["f"]["warm"] == 2
    assert s["nodes"] == [{"node_id": "n0", "tiers": {"host": {"bytes_live": 10, "capacity_bytes": 100}}}]
    assert s["dedup"] == {"rss_bytes": 300, "pss_bytes": 200, "processes": 2, "saved_bytes": 100}


def test_stream_sends_snapshots_as_server_sent_events(client: TestClient) -> None:
    with client.stream("GET", "/v1/dashboard/stream?interval=0.2") as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = []
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
            if len(events) == 2:
                break
    assert [e["workflows"][0]["name"] for e in events] == ["w", "w"] and events[1]["t"] > events[0]["t"]


def test_results_browser_lists_serves_and_refuses_what_it_did_not_list(client: TestClient) -> None:
    listed = {e["id"]: e for e in client.get("/v1/results").json()}
    assert set(listed) == {"committed/a.json", "local/run/results.json", "local/broken.json"}
    assert listed["committed/a.json"]["commit"] == "f" * 40 and listed["committed/a.json"]["kind"] == "rows"
    assert listed["local/run/results.json"]["kind"] == "experiments"
    assert listed["local/broken.json"]["commit"] is None  # listed, not parsed: no 500
    assert client.get("/v1/results/committed/a.json").json()["rows"] == [{"x": 1}]
    fig = client.get("/v1/results/local/run/results.json/figure")
    assert fig.status_code == 200 and fig.content.startswith(b"\\x89PNG")
    assert client.get("/v1/results/committed/a.json/figure").status_code == 404
    assert client.get("/v1/results/committed/../c/a.json").status_code == 404
    assert client.get("/v1/results/local/nope.json").status_code == 404


def test_the_page_works_without_node_figures() -> None:
    app = create_app(_Runtime(), token="t", results_dirs=[])  # type: ignore[arg-type]
    with TestClient(app, headers={"authorization": "Bearer t"}) as c:
        s = c.get("/v1/dashboard/state").json()
    assert s["nodes"] == [] and s["nodes_note"] and s["workflows"][0]["name"] == "w"
