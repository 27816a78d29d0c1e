"""CLI commands of the workflow runtime: ``gfaas serve`` and ``gfaas workflows list|show``."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from typing import Any


def add_parsers(sub: Any) -> None:
    s = sub.add_parser("serve", help="run workflows: a local runtime behind the HTTP gateway (and its dashboard)")
    _serve_args(s, workflows="all")
    s.set_defaults(func=cmd_serve)
    d = sub.add_parser("dashboard", help="the web dashboard: a local runtime and gateway, on loopback, with "
                                         "no workflow deployed yet (deploy from the page or with gfaas deploy)")
    _serve_args(d, workflows="none")
    d.set_defaults(func=cmd_serve)

    from .cli_gateway import add_gateway_args

    w = sub.add_parser("workflows", help="a gateway's workflows: list, show NAME, status NAME (workers and scaling), "
                                         "versions NAME, rollback NAME VERSION; --reference: the six bundled ones",
                       description="Commands about the workflows a running gateway serves (the gateway and its token: "
                                   "--url/$GFAAS_URL and --token-file, as for every gateway command). With --reference, "
                                   "list and show read the reference workflows that ship with gfaas instead.")
    w.add_argument("action", choices=["list", "show", "status", "versions", "rollback"])
    w.add_argument("name", nargs="?", help="show, status, versions, rollback: the workflow")
    w.add_argument("version", nargs="?", type=int, help="rollback: the version to make current again")
    w.add_argument("--reference", action="store_true",
                   help="list, show: the reference workflows bundled with gfaas (no gateway needed)")
    w.add_argument("--json", action="store_true")
    add_gateway_args(w)
    w.set_defaults(func=cmd_workflows)


def cmd_workflows(a: argparse.Namespace) -> int:
    if a.action == "status":
        from .cli_deploy import cmd_status

        if not a.name:
            print("gfaas workflows status: give the workflow's name", file=sys.stderr)
            return 2
        return cmd_status(a)
    if a.action in ("versions", "rollback"):
        from .cli_deploy import cmd_rollback, cmd_versions

        if not a.name or (a.action == "rollback" and a.version is None):
            print(f"gfaas workflows {a.action}: give the workflow's name"
                  + (" and the version to make current again" if a.action == "rollback" else ""), file=sys.stderr)
            return 2
        return cmd_versions(a) if a.action == "versions" else cmd_rollback(a)
    if a.action == "show" and not a.name:
        print("gfaas workflows show: name a workflow (see `gfaas workflows list`)", file=sys.stderr)
        return 2
    if a.reference:
        return _reference(a)
    from .cli_gateway import client

    with client(a, timeout=30.0) as gw:
        if a.action == "show":
            doc = gw.describe(a.name)
            print(json.dumps(doc, indent=2))
            return 0
        rows = []
        for name in gw.workflows():
            d = gw.describe(name)
            current = [v["version"] for v in gw.versions(name) if v["current"]]
            rows.append({"name": name, "version": current[0] if current else None,
                         "functions": [f["name"] for f in d["functions"]], "inputs": sorted(d["inputs"]),
                         "description": d.get("description", "")})
    if a.json:
        print(json.dumps(rows, indent=2))
    elif not rows:
        print("the gateway serves no workflow yet: deploy one with `gfaas deploy SPEC [--code DIR]` "
              "(gfaas workflows list --reference shows the bundled ones)")
    else:
        for r in rows:
            print(f"{r['name']:12s} v{r['version']:<3} {len(r['functions'])} functions, inputs "
                  f"{','.join(r['inputs']) or '-'}  {r['description']}".rstrip())
    return 0


def _reference(a: argparse.Namespace) -> int:
    """``list --reference`` / ``show NAME --reference``: the reference workflows bundled with gfaas."""
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
    text = workflows.spec_text(a.name)
    print(json.dumps(loads(text).describe(), indent=2) if a.json else text, end="" if not a.json else "\n")
    return 0


def _token(a: argparse.Namespace) -> tuple[str | None, str]:
    """The gateway's token and where it is kept (the operator's file, or the state dir's, made on first use)."""
    import os

    from .config import default_run_dir
    from .runtime.gateway import load_or_create_token, read_token_file

    if a.no_auth:
        return None, ""
    if a.token_file:
        return read_token_file(a.token_file), a.token_file
    token, path = load_or_create_token(a.state_dir or os.path.join(default_run_dir(), "gateway"))
    return token, str(path)


def _serve_args(s: Any, workflows: str) -> None:
    s.add_argument("--workflows", default=workflows,
                   help=f"reference workflows to deploy at start: all, none, or a comma-separated list (default {workflows})")
    s.add_argument("--spec", action="append", default=[], metavar="FILE", help="also deploy this spec (repeatable)")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    s.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 picks a free one)")
    s.add_argument("--scale", choices=["small", "full"], default="small", help="model sizes (default small)")
    s.add_argument("--transport", choices=["gfaas", "redis"], default="gfaas",
                   help="default transport of invocations (default gfaas)")
    s.add_argument("--executor", choices=["process", "ray"], default="process", help="where functions run")
    s.add_argument("--workers", type=int, default=1, help="warm workers per function (default 1)")
    s.add_argument("--state-dir", default="", metavar="DIR",
                   help="where the gateway keeps its token file (default: $GFAAS_RUN_DIR/gateway, made 0700)")
    s.add_argument("--token-file", default="", metavar="FILE",
                   help="use the bearer token in this file (yours, mode 0600) instead of the state dir's")
    s.add_argument("--no-auth", action="store_true",
                   help="serve without a token (refused unless --host is a loopback address)")
    s.add_argument("--allow-handlers", action="append", default=[], metavar="PACKAGE",
                   help="a package deployed specs may take handlers from (repeatable; default gfaas.workflows)")
    s.add_argument("--max-workflows", type=int, default=64, help="workflows deployed at once (default 64)")
    s.add_argument("--max-functions", type=int, default=64, help="functions per spec (default 64)")
    c = s.add_argument_group("multi-machine cluster (docs/deploy.md)")
    c.add_argument("--ray-address", default="", metavar="HEAD:PORT", help="the Ray cluster to run functions on "
                   "(with --executor ray; default: start a local Ray)")
    c.add_argument("--join", default="", metavar="REDIS_URL", help="the global directory: the gateway's node joins "
                   "it and uses every node registered there (gfaas node start --join)")
    c.add_argument("--cluster-key-file", default="", metavar="FILE", help="the key every node holds (0600)")
    c.add_argument("--redis-password-file", default="", metavar="FILE", help="the directory's password (0600)")
    c.add_argument("--transfer-host", default="", metavar="ADDR",
                   help="the address other machines reach the gateway's node at (with --join)")


def cmd_serve(a: argparse.Namespace) -> int:
    from . import workflows
    from .gcpause import QuietCollector, freeze_startup
    from .runtime.gateway import DEFAULT_HANDLER_PACKAGES, GatewayLimits, serve
    from .runtime.local import LocalRuntime, RuntimeConfig

    names = [] if a.workflows == "none" else workflows.names() if a.workflows == "all" else \
        [n.strip() for n in a.workflows.split(",") if n.strip()]
    texts = [workflows.spec_text(n) for n in names]
    for path in a.spec:
        with open(path) as f:
            texts.append(f.read())
    allowed = tuple(a.allow_handlers) or DEFAULT_HANDLER_PACKAGES
    limits = GatewayLimits(handler_packages=allowed,
                           max_workflows=a.max_workflows, max_functions=a.max_functions)
    token, token_path = _token(a)  # before anything starts: a bad token file fails fast
    cfg = RuntimeConfig(transport=a.transport, executor=a.executor, scale=a.scale, workers_per_function=a.workers,
                        ray_address=getattr(a, "ray_address", ""), join=getattr(a, "join", ""),
                        cluster_key_file=getattr(a, "cluster_key_file", ""),
                        redis_password_file=getattr(a, "redis_password_file", ""),
                        transfer_host=getattr(a, "transfer_host", ""))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    from .workflows.measured import edges

    with LocalRuntime(cfg, input_generator=workflows.make_inputs, edge_sizes=edges) as rt:
        for text in texts:  # the operator's own specs: trusted, not screened like a client's
            name = rt.deploy(text)
            print(f"deployed {name}", file=sys.stderr, flush=True)
        with serve(rt, host=a.host, port=a.port, token=token, authenticate=token is not None, limits=limits) as gw:
            where = "" if gw.url.endswith("//" + gw.bind) else f" (from this machine: {gw.url})"
            auth = f"bearer token in {token_path}" if token else "NO authentication"
            print(f"gfaas gateway listening on {gw.bind}{where}; {auth}; OpenAPI: {gw.url}/docs; Ctrl-C stops",
                  file=sys.stderr, flush=True)
            print(f"dashboard: {gw.url}/dashboard", file=sys.stderr, flush=True)
            freeze_startup()  # the app, the runtime and their imports: out of the collector's full walks
            collector = QuietCollector(gw.app.state.gateway.admissions.idle).start()
            try:
                while not stop.wait(1.0):
                    collector.tick()  # full collections when nothing is in flight (gcpause)
            finally:
                collector.stop()
    print("stopped", file=sys.stderr)
    return 0
