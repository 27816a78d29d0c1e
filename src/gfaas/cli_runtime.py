"""CLI commands of the workflow runtime: ``gfaas serve`` and ``gfaas workflows list|show``."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from typing import Any


def add_parsers(sub: Any) -> None:
    s = sub.add_parser("serve", help="run workflows: a local runtime behind the HTTP gateway")
    s.add_argument("--workflows", default="all",
                   help="reference workflows to deploy at start: all (default), none, or a comma-separated list")
    s.add_argument("--spec", action="append", default=[], metavar="FILE", help="also deploy this spec (repeatable)")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    s.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 picks a free one)")
    s.add_argument("--scale", choices=["small", "full"], default="small", help="model sizes (default small)")
    s.add_argument("--transport", choices=["gfaas", "redis"], default="gfaas",
                   help="default transport of invocations (default gfaas)")
    s.add_argument("--executor", choices=["process", "ray"], default="process", help="where functions run")
    s.add_argument("--workers", type=int, default=1, help="warm workers per function (default 1)")
    s.set_defaults(func=cmd_serve)

    w = sub.add_parser("workflows", help="the reference workflows: list them or print one's spec")
    w.add_argument("action", choices=["list", "show"])
    w.add_argument("name", nargs="?", help="show: the workflow")
    w.add_argument("--json", action="store_true")
    w.set_defaults(func=cmd_workflows)


def cmd_workflows(a: argparse.Namespace) -> int:
    from . import workflows
    from .runtime.spec import loads

    if a.action == "list":
        rows = [{"name": n, "description": loads(workflows.spec_text(n)).description} for n in workflows.names()]
        if a.json:
            print(json.dumps(rows, indent=2))
        else:
            for r in rows:
                print(f"{r['name']:10s} {r['description']}")
        return 0
    if not a.name:
        print("gfaas workflows show: name a workflow (see `gfaas workflows list`)", file=sys.stderr)
        return 2
    text = workflows.spec_text(a.name)
    print(json.dumps(loads(text).describe(), indent=2) if a.json else text, end="" if not a.json else "\n")
    return 0


def cmd_serve(a: argparse.Namespace) -> int:
    from . import workflows
    from .runtime.gateway import serve
    from .runtime.local import LocalRuntime, RuntimeConfig

    names = [] if a.workflows == "none" else workflows.names() if a.workflows == "all" else \
        [n.strip() for n in a.workflows.split(",") if n.strip()]
    texts = [workflows.spec_text(n) for n in names]
    for path in a.spec:
        with open(path) as f:
            texts.append(f.read())
    cfg = RuntimeConfig(transport=a.transport, executor=a.executor, scale=a.scale, workers_per_function=a.workers)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with LocalRuntime(cfg, input_generator=workflows.make_inputs) as rt:
        for text in texts:
            name = rt.deploy(text)
            print(f"deployed {name}", file=sys.stderr, flush=True)
        with serve(rt, host=a.host, port=a.port) as gw:
            print(f"gfaas gateway at {gw.url} (OpenAPI: {gw.url}/docs); Ctrl-C stops", file=sys.stderr, flush=True)
            stop.wait()
    print("stopped", file=sys.stderr)
    return 0
