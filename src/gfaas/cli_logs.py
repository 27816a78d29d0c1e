"""CLI command ``gfaas logs WORKFLOW``: a workflow's function logs, read from a running gateway."""

from __future__ import annotations

import argparse
import re
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


# What a function prints reaches the operator's terminal: control characters (C0, DEL, C1, whose
# U+009B is a CSI on some terminals) and the bidirectional overrides that reorder what is shown
# would let it rewrite the screen, set the window title or the clipboard, or disguise a line.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape_text(text: str) -> str:
    """``text`` with every control or bidi character written as a visible escape (``\\x1b``,
    ``\\u202e``, ``\\r``); the rest as it is."""
    def one(m: re.Match[str]) -> str:
        c = m.group()
        if c in _NAMED:
            return _NAMED[c]
        return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"

    return _UNSAFE.sub(one, text)


def format_record(r: dict[str, Any]) -> str:
    """``TIME FUNCTION INVOCATION STREAM: TEXT``, the time in UTC to the millisecond, every field
    escaped (:func:`escape_text`)."""
    t = float(r.get("time", 0.0))
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"
    stream = str(r.get("stream", ""))
    if stream == "log" and r.get("level"):
        stream = f"log {r['level']}"
    fields = (str(r.get("function", "")), str(r.get("invocation") or "-"), stream, str(r.get("text", "")))
    function, invocation, stream, text = (escape_text(f) for f in fields)
    return f"{stamp} {function} {invocation} {stream}: {text}"


def json_line(r: dict[str, Any]) -> str:
    """One record as a JSON line that holds no raw control or bidi character (JSON escapes C0 itself;
    C1 and bidi characters are written as ``\\uXXXX``, which decode to the same text)."""
    import json

    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(r, ensure_ascii=False))


def _print(recs: Iterable[dict[str, Any]], as_json: bool) -> None:
    for r in recs:
        print(json_line(r) if as_json else format_record(r), flush=True)


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
