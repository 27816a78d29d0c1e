"""The handler of ``gfaas bench autoscale``: holds its worker for ``params.seconds`` (default 0.1)."""

from __future__ import annotations

import time
from typing import Any


def hold(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """Read the input, hold the worker (a sleep: the bench measures scaling, not arithmetic), return it."""
    x = ctx.get(inputs["x"])
    time.sleep(float(ctx.params.get("seconds", 0.1)))
    return {"y": x + 0}
