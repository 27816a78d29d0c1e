"""The node endpoints (read-only): ``GET /v1/nodes``, each node daemon's live figures, and
``GET /v1/nodes/{node}/objects/{ref}``, one object on one node.

Both ask the runtime (``node_snapshots``, ``node_object``; :class:`~gfaas.runtime.local.LocalRuntime`
has them), which asks each daemon over its admin connection with ``Snapshot`` and ``ObjectInfo``:
counters only, never a pass over the objects, so polling this every second costs the daemons little
(docs/design/node-stats.md). A runtime without them answers 501. Like every route but ``/healthz``,
these need the gateway's token: object IDs and invocation IDs are not for anyone who can connect.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Path
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from ...errors import InvalidDataRef
from .errors import error_response
from .schemas import _responses
from .state import GatewayDep

router = APIRouter(tags=["nodes"])


class TierDoc(BaseModel):
    """One storage tier of a node: ``host``, ``disk`` or ``gpu<k>``."""

    name: str
    bytes_live: int
    bytes_reserved: int
    bytes_target: int
    capacity_bytes: int
    objects: int
    bytes_pooled: int


class NodeSnapshot(BaseModel):
    """A node daemon's figures (``Admin.snapshot()``); ``node`` is the runtime's name for it."""

    node: str
    node_id: str
    time: float
    tiers: list[TierDoc]
    counters: dict[str, int]
    links: dict[str, int]


class NodeList(BaseModel):
    nodes: list[NodeSnapshot]


class ObjectDoc(BaseModel):
    """One stored object (``Admin.object_info()``); ``consumers`` null: any function of its invocation."""

    id: str
    invocation: str
    producer: str
    consumers: list[str] | None
    readers_left: list[str] | None
    nbytes: int
    dtype: str
    shape: list[int]
    state: str
    tier: str
    age_s: float


def _missing(what: str) -> JSONResponse:
    return error_response(501, "not_implemented", f"this gateway's runtime does not report {what}")


@router.get("/v1/nodes", response_model=NodeList, responses=_responses(501))
async def list_nodes(gw: GatewayDep) -> Any:
    """Each node daemon's live figures: per tier bytes and objects, counters, bytes moved per link."""
    read = getattr(gw.runtime, "node_snapshots", None)
    if read is None:
        return _missing("node figures")
    return {"nodes": await run_in_threadpool(read)}


@router.get("/v1/nodes/{node}/objects/{ref}", response_model=ObjectDoc, responses=_responses(400, 404, 501))
async def node_object(gw: GatewayDep, node: str = Path(max_length=64),
                      ref: str = Path(max_length=128, description="the object's ID: the 32 hex digits ending its "
                                      "DataRef (gfaas://NODE/ID)")) -> Any:
    """One object on one node: size, tier, producer, consumers, readers left, age. 404 if the node is not
    one of the runtime's or does not hold the object (freed, or never stored there)."""
    read = getattr(gw.runtime, "node_object", None)
    if read is None:
        return _missing("objects")
    try:
        return await run_in_threadpool(read, node, ref)
    except InvalidDataRef as exc:
        return error_response(400, "bad_request", str(exc))
