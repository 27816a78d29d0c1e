"""CLI commands that change or inspect a running gateway's workflows: ``gfaas deploy SPEC [--code DIR]``,
``gfaas workflows status NAME``, ``versions NAME`` and ``rollback NAME VERSION`` (the gateway and its
token as :mod:`gfaas.cli_gateway` says).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .cli_gateway import add_gateway_args, client


def add_parsers(sub: Any) -> None:
    d = sub.add_parser("deploy", help="deploy a workflow to a running gateway, optionally with its code")
    d.add_argument("spec", help="the workflow spec (YAML or JSON file)")
    d.add_argument("--code", default="", metavar="DIR",
                   help="a directory of the handlers' modules (and model files), shipped with the spec; "
                        "a deployed name gets a new version (docs/deploying-code.md)")
    add_gateway_args(d)
    d.set_defaults(func=cmd_deploy)


def cmd_deploy(a: argparse.Namespace) -> int:
    try:
        text = Path(a.spec).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        print(f"gfaas deploy: cannot read the spec {a.spec}: {exc}", file=sys.stderr)
        return 2
    with client(a) as c:
        name = c.deploy(text, code=a.code or None)
        current = [v for v in c.versions(name) if v["current"]]
    v: dict[str, Any] = current[0] if current else {"version": "?", "code": None}
    code = f", code {v['code']['digest'][:12]} ({v['code']['files']} files)" if v.get("code") else ""
    print(f"deployed {name} version {v['version']}{code}")
    return 0


def cmd_versions(a: argparse.Namespace) -> int:
    with client(a) as c:
        rows = c.versions(a.name)
    if a.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        when = datetime.fromtimestamp(r["created"], tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
        code = r["code"]["digest"][:12] if r.get("code") else "-"
        print(f"{'*' if r['current'] else ' '} {r['version']:>4}  {when}  code {code}  {r.get('note', '')}".rstrip())
    return 0


def cmd_status(a: argparse.Namespace) -> int:
    """``gfaas workflows status NAME``: workers per function by state, targets and cold starts."""
    with client(a) as c:
        doc = c.scaling_status(a.name)
    if a.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"{doc['workflow']} version {doc['version']}")
    print(f"  {'function':16s} {'warm':>4} {'busy':>4} {'start':>5} {'queue':>5} {'target':>6} {'min-max':>7} "
          f"{'cold':>5} {'worker-s':>9}  keep-alive")
    for fn, c in doc["functions"].items():
        print(f"  {fn:16s} {c['warm']:>4} {c['busy']:>4} {c['starting']:>5} {c['queued']:>5} {c['target']:>6} "
              f"{str(c['min']) + '-' + str(c['max']):>7} {c['cold_starts']:>5} {c['worker_seconds']:>9.1f}  "
              f"{c['keep_alive']}")
    starts = {fn: c["start_ms_p50"] for fn, c in doc["functions"].items() if c.get("start_ms_p50")}
    if starts:
        print("  worker start, median ms per phase (recent starts):")
        for fn, ph in starts.items():
            print(f"  {fn:16s} " + "  ".join(f"{k} {v:g}" for k, v in ph.items()))
    return 0


def cmd_rollback(a: argparse.Namespace) -> int:
    with client(a) as c:
        number = c.rollback(a.name, a.version)
    print(f"{a.name}: version {number} is current (the content of version {a.version})")
    return 0
