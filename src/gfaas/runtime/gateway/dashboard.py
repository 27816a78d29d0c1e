"""The dashboard (issue 19): one web page served by the gateway, its live state and the results browser.

* ``GET /dashboard``: the page; its script, style and the vendored chart library under
  ``/dashboard/static/`` (shipped in the package: no CDN, no build step).
* ``GET /v1/dashboard/state``: one JSON snapshot of the nodes, the workflows (rates, latency
  percentiles, where the time goes, workers, queues, admission), page merging's savings.
* ``GET /v1/dashboard/stream``: the same snapshot as server-sent events, one per ``interval`` seconds.
* ``GET /v1/results``, ``/v1/results/{id}``, ``/v1/results/{id}/figure``: every result file found
  in the result directories (the checkout's committed ``benchmarks/results`` and the local ``out``
  tree that ``gfaas bench``/``gfaas sim run`` write), each with the commit it measured.

All of these only read. The guard (:mod:`.guard`) lets them through without a token from loopback;
what changes state (deploy, invoke, undeploy) keeps needing the token.
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
import mimetypes
import time
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    Response,
    StreamingResponse,
)

from ...errors import NotFound
from .result_files import find_result as _find
from .result_files import list_results, read_inside
from .schemas import _responses
from .state import GatewayDep, _Gateway

log = logging.getLogger("gfaas.gateway.dashboard")

#: Paths the guard serves without a token to loopback clients (GET only).
READ_ONLY_PREFIXES = ("/dashboard", "/v1/dashboard/", "/v1/results", "/v1/nodes")
# Committed results whose figure lives under docs/ (local runs keep theirs beside the JSON).
MAX_RESULT_BYTES = 32 << 20  # a result document larger than this is listed but not served


def _static_dir() -> Any:
    return resources.files("gfaas.runtime.gateway") / "static"


def _static_names() -> set[str]:
    return {p.name for p in _static_dir().iterdir() if p.is_file()}


router = APIRouter()


@router.get("/dashboard", include_in_schema=False)
def page() -> HTMLResponse:
    page = (_static_dir() / "dashboard.html").read_text(encoding="utf-8")
    return HTMLResponse(page.replace("{{EXAMPLE_SPEC}}", html.escape(_example_spec())),
                        headers={"cache-control": "no-cache"})


def _example_spec() -> str:
    """The Deploy tab's example: ``static/example.yaml``, the tiny workflow of ``gfaas.workflows.tiny``
    (handlers any gateway allows; a test keeps the two the same)."""
    return (_static_dir() / "example.yaml").read_text(encoding="utf-8")


@router.get("/dashboard/static/{name}", include_in_schema=False)
def static(name: str) -> Response:
    if name not in _static_names():  # an allow-list: nothing outside the folder can be named
        raise NotFound(f"no dashboard file {name[:80]!r}")
    kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
    return Response((_static_dir() / name).read_bytes(), media_type=kind, headers={"cache-control": "max-age=3600"})


@router.get("/v1/dashboard/state", tags=["dashboard"])
async def state(gw: GatewayDep) -> JSONResponse:
    """The dashboard's snapshot: nodes, workflows, page merging (read-only)."""
    return JSONResponse(await run_in_threadpool(dashboard_state, gw))


async def _events(gw: _Gateway, interval: float) -> AsyncIterator[bytes]:
    while True:
        doc = await run_in_threadpool(dashboard_state, gw)
        yield b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"
        await asyncio.sleep(interval)


@router.get("/v1/dashboard/stream", tags=["dashboard"], response_class=StreamingResponse,
            responses={200: {"description": "server-sent events, each `data: ` and one state document",
                             "content": {"text/event-stream": {"schema": {"type": "object"}}}}})
async def stream(gw: GatewayDep, interval: float = Query(1.0, ge=0.2, le=60.0)) -> StreamingResponse:
    """The snapshot as server-sent events (``data: {...}``), one every ``interval`` seconds."""
    return StreamingResponse(_events(gw, interval), media_type="text/event-stream",
                             headers={"cache-control": "no-cache", "x-accel-buffering": "no"})


@router.get("/v1/results", tags=["dashboard"])
async def results(gw: GatewayDep) -> JSONResponse:
    """Every result file in the result directories: id, where, size, the commit it measured."""
    return JSONResponse(await run_in_threadpool(list_results, gw.results_dirs))


@router.get("/v1/results/{rid:path}/figure", tags=["dashboard"], response_class=Response,
            responses={**_responses(404), 200: {"description": "the figure", "content": {
                "image/png": {"schema": {"type": "string", "format": "binary"}}}}})
def result_figure(rid: str, gw: GatewayDep) -> Response:
    """The figure drawn from a result, if there is one."""
    entry = _find(gw.results_dirs, rid)
    if not entry.get("figure"):
        raise NotFound(f"result {rid!r} has no figure")
    return Response(_read(entry["_figure"], f"the figure of result {rid!r}"), media_type="image/png")


@router.get("/v1/results/{rid:path}", tags=["dashboard"],
            responses={**_responses(404), 200: {"description": "the result document",
                                                "content": {"application/json": {}}}})
def result(rid: str, gw: GatewayDep) -> Response:
    """One result document as it is on disk."""
    entry = _find(gw.results_dirs, rid)
    if entry["bytes"] > MAX_RESULT_BYTES:
        raise NotFound(f"result {rid!r} is {entry['bytes']} bytes, over the dashboard's {MAX_RESULT_BYTES}; "
                       f"open {entry['path']} directly")
    return Response(_read(entry["_at"], f"result {rid!r}"), media_type="application/json")


def _read(at: tuple[str, str], what: str) -> bytes:
    """The file at ``(folder, path inside it)``, read without following links (result_files), or 404."""
    try:
        return read_inside(at[0], at[1], MAX_RESULT_BYTES)
    except OSError as exc:
        raise NotFound(f"{what} cannot be read ({exc})") from None


# -- the live snapshot

def _call(what: str, fn: Any, *args: Any) -> Any:
    """A runtime call for the dashboard: a failure is logged and shown as missing, never a 500."""
    try:
        return fn(*args)
    except NotFound:
        return None
    except Exception:
        log.warning("dashboard: %s failed", what, exc_info=True)
        return None


def dashboard_state(gw: _Gateway) -> dict[str, Any]:
    """What the dashboard shows now (see the module docstring). Costs the runtime one status call per
    workflow and, where the runtime offers them, one node snapshot round trip per node."""
    rt = gw.runtime
    live = gw.tracker.live.snapshot()
    depths = _call("queue_depths", rt.queue_depths) or {}
    admission = gw.admissions.describe()
    workflows = []
    merged = {"rss_bytes": 0, "pss_bytes": 0, "processes": 0}
    for name in sorted(_call("workflows", rt.workflows) or []):
        st = _call("scaling_status", getattr(rt, "scaling_status", lambda w: None), name) or {}
        fns = {}
        for fn, c in (st.get("functions") or {}).items():
            mem = c.get("memory") or {}
            for k in merged:
                merged[k] += int(mem.get(k, 0) or 0)
            fns[fn] = {k: c.get(k) for k in ("warm", "idle", "busy", "starting", "cold_starts", "queued",
                                             "start_ms_p50")
                       if k in c} | {"queue_depth": depths.get(f"{name}/{fn}", 0), "memory": mem}
        row = live.get(name) or {"rate_per_s": 0.0, "done": 0, "failed": 0, "p50_ms": None, "p99_ms": None,
                                 "breakdown_ms": None}
        workflows.append({"name": name, "version": st.get("version"), **row, "functions": fns,
                          "admission": admission.get(name)})
    dedup: dict[str, Any] = {**merged, "saved_bytes": max(0, merged["rss_bytes"] - merged["pss_bytes"])}
    report = _memory_report(gw)
    if report is not None:
        dedup.update(mode=report.get("mode"), saved_bytes=int(report.get("saved_bytes", 0) or 0),
                     shared_saved_bytes=int((report.get("shared") or {}).get("saved_bytes", 0) or 0),
                     merged_saved_bytes=int(report.get("merged_saved_bytes", 0) or 0))
    snaps = getattr(rt, "node_snapshots", None)
    nodes = _call("node_snapshots", snaps) if snaps is not None else None
    return {
        "t": time.time(),
        "workflows": workflows,
        "nodes": nodes if nodes is not None else [],
        "nodes_note": None if nodes is not None else "this runtime reports no node figures",
        "dedup": dedup,
        "gateway": {"pending": gw.tracker.pending()},
    }


_REPORT_EVERY_S = 5.0  # page merging's report asks every node daemon: not at every update


def _memory_report(gw: _Gateway) -> dict[str, Any] | None:
    """The runtime's page-merging report (``LocalRuntime.memory_report``), at most every few seconds."""
    fn = getattr(gw.runtime, "memory_report", None)
    mode = getattr(getattr(gw.runtime, "dedup", None), "mode", "off")
    if fn is None or mode == "off":
        return None
    cached = getattr(gw, "_dashboard_report", None)
    now = time.monotonic()
    if cached is None or now - cached[0] > _REPORT_EVERY_S:
        cached = (now, _call("memory_report", fn))
        gw._dashboard_report = cached  # type: ignore[attr-defined]
    report: dict[str, Any] | None = cached[1]
    return report
