"""CLI command ``gfaas logs WORKFLOW``: a workflow's function logs, read from a running gateway."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable
from typing import Any

from .cli_gateway import add_gateway_args, client


def add_parsers(sub: Any) -> None:
    s = sub.add_parser("logs", help="a workflow's function logs (stdout, stderr, log records) from a gateway",
                       description="Print a workflow's kept log lines, one per line: TIME FUNCTION INVOCATION "
                                   "STREAM: TEXT (invocation '-': printed outside any task).")
    s.add_argument("workflow")
    s.add_argument("--function", help="only this function's lines")
    s.add_argument("--invocation", help="only this invocation's lines")
    s.add_argument("--limit", type=int, default=None, help="the last N lines (gateway default 1000)")
    s.add_argument("--follow", "-f", action="store_true", help="keep printing new lines (Ctrl-C stops)")
    s.add_argument("--for", dest="for_s", type=float, default=3600.0, help="follow: stop after S seconds")
    s.add_argument("--json", action="store_true", help="print the records as JSON lines")
    add_gateway_args(s)
    s.set_defaults(func=cmd_logs)


def format_record(r: dict[str, Any]) -> str:
    """``TIME FUNCTION INVOCATION STREAM: TEXT``, the time in UTC to the millisecond."""
    t = float(r.get("time", 0.0))
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"
    stream = r.get("stream", "")
    if stream == "log" and r.get("level"):
        stream = f"log {r['level']}"
    return f"{stamp} {r.get('function', '')} {r.get('invocation') or '-'} {stream}: {r.get('text', '')}"


def _print(recs: Iterable[dict[str, Any]], as_json: bool) -> None:
    import json

    for r in recs:
        print(json.dumps(r, ensure_ascii=False) if as_json else format_record(r), flush=True)


def cmd_logs(a: argparse.Namespace) -> int:
    with client(a, timeout=30.0) as gw:
        if not a.follow:
            _print(gw.logs(a.workflow, function=a.function, invocation=a.invocation, limit=a.limit), a.json)
            return 0
        # The gateway ends a follow after its longest wait: reconnect after the last line seen.
        end, after, limit = time.monotonic() + a.for_s, None, a.limit
        try:
            while (left := end - time.monotonic()) > 0:
                for rec in gw.follow_logs(a.workflow, function=a.function, invocation=a.invocation, limit=limit,
                                          for_s=left, after=after):
                    _print([rec], a.json)
                    after = int(rec["seq"])
                limit = None if after is not None else limit
        except KeyboardInterrupt:
            print(file=sys.stderr)
    return 0
