"""The logs endpoint: ``GET /v1/workflows/{name}/logs``, a workflow's function logs as JSON lines.

Logs hold what function code printed, which may be anything its inputs held: this route is never open,
not even on a gateway served without authentication (there it answers 403), so reading a workflow's
logs takes the gateway's token, as deploying one does. ``follow=true`` keeps the answer open and sends
new lines as workers report them (with each task's reply), until the client goes away or ``follow_s``
seconds (at most the gateway's ``max_timeout_s``) have passed; ``gfaas logs --follow`` reconnects.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response, StreamingResponse

from .errors import error_response
from .schemas import _responses
from .state import GatewayDep

router = APIRouter(tags=["logs"])
NDJSON = "application/x-ndjson"
_POLL_S = 0.2  # how often a follower looks for new lines


def _line(rec: dict[str, Any]) -> bytes:
    return (json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


@router.get("/v1/workflows/{name}/logs", responses={
    200: {"content": {NDJSON: {}}, "description": "one JSON object per line: seq, time, workflow, version, "
                                                 "function, invocation, stream, level, text"},
    **_responses(403, 404, 422)})
async def workflow_logs(request: Request, name: str, gw: GatewayDep,
                        function: str | None = Query(None, max_length=64, description="one function's lines"),
                        invocation: str | None = Query(None, max_length=128,
                                                       description="one invocation's lines (empty: outside tasks)"),
                        since: float | None = Query(None, description="lines at or after this UNIX time"),
                        limit: int = Query(1000, ge=0, le=10_000, description="the last this many lines"),
                        after: int | None = Query(None, ge=0, description="only lines with a larger seq (resume)"),
                        follow: bool = Query(False, description="keep sending new lines"),
                        follow_s: float = Query(60.0, gt=0, le=3600, description="how long to follow (at most the gateway's max_timeout_s)")) -> Response:
    """A workflow's function logs, oldest first, as JSON lines (``application/x-ndjson``)."""
    if gw.token is None:
        return error_response(403, "forbidden", "function logs are served only with authentication: this gateway "
                              "runs without a token (--no-auth); start it with one to read logs")
    read = getattr(gw.runtime, "logs", None)
    if read is None:
        return error_response(501, "not_implemented", "this gateway's runtime keeps no logs")
    recs: list[dict[str, Any]] = await run_in_threadpool(read, name, function, invocation, since, max(limit, 1),
                                                            after)
    first = recs[-limit:] if limit else []
    if not follow:
        return Response(b"".join(_line(r) for r in first), media_type=NDJSON)

    async def stream() -> AsyncIterator[bytes]:
        cursor = recs[-1]["seq"] if recs else (after or 0)
        for r in first:
            yield _line(r)
        end = time.monotonic() + min(follow_s, gw.max_timeout_s)  # the gateway's longest wait bounds it too
        while time.monotonic() < end and not await request.is_disconnected():
            await asyncio.sleep(_POLL_S)
            new = await run_in_threadpool(read, name, function, invocation, since, 10_000, cursor)
            if new:
                cursor = new[-1]["seq"]
                yield b"".join(_line(r) for r in new)

    return StreamingResponse(stream(), media_type=NDJSON)
