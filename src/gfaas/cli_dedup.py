"""CLI commands for page merging: ``gfaas dedup status`` reports what a node merged, ``gfaas dedup clear``
empties a shared-loading store (docs/dedup.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .units import format_bytes


def _render(st: dict[str, Any]) -> str:
    ksm = st.get("ksm", {})
    counters = ksm.get("counters", {})
    # KSM updates its counters as ksmd scans: pages of processes that exited since the last scan still count.
    lines = [f"node {st.get('node_id', '?')}: KSM saves {format_bytes(int(st.get('saved_bytes', 0)))} machine-wide "
             f"(pages_sharing {counters.get('pages_sharing', 0)}, as of ksmd's last scan); "
             f"sharing domain: {st.get('active_domain') or '-'}"]
    if not ksm.get("controllable", False):
        lines.append(f"  KSM is not controlled here: {ksm.get('reason') or st.get('note') or 'unknown reason'}")
    burst = st.get("burst")
    last = st.get("last_burst") or {}
    lines.append(f"  burst: {'running for ' + format(burst.get('elapsed_s', 0), '.2f') + ' s' if burst else 'idle'}"
                 + (f" (last: {last.get('seconds', 0):.2f} s, ended: {last.get('reason')})" if last and not burst else "")
                 + f"; KSM run={ksm.get('settings', {}).get('run', '?')}")
    procs = st.get("processes", [])
    if procs:
        lines.append(f"  {'pid':>7}  {'workflow/function':<32} {'domain':<16} {'hinted':>10} {'merged':>10} "
                     f"{'PSS':>10} {'merge s':>8}")
        for p in procs:
            ms = p.get("merge_seconds")
            lines.append(f"  {p['pid']:>7}  {p['workflow'] + '/' + p['function']:<32} {p['domain']:<16} "
                         f"{format_bytes(int(p.get('hinted_bytes', 0))):>10} "
                         f"{format_bytes(int(p.get('merged_bytes', 0))):>10} "
                         f"{format_bytes(int(p.get('pss_bytes', 0))):>10} "
                         f"{'-' if ms is None else format(ms, '.2f'):>8}")
    else:
        lines.append("  no process has hinted")
    for fn, merged in sorted(st.get("merged_by_function", {}).items()):
        lines.append(f"  merged in {fn}: {format_bytes(int(merged))}")
    return "\n".join(lines)


def cmd_dedup_status(a: argparse.Namespace) -> int:
    from .config import NodeConfig
    from .dataplane.client import Admin

    cfg = NodeConfig(node_id=a.node_id, socket_path=a.socket or "", state_dir=a.state_dir or "")
    with Admin(cfg.socket_path, state_dir=cfg.state_dir) as adm:
        st = adm.dedup_status()
        st["node_id"] = adm.node_id
    if a.json:
        sys.stdout.write(json.dumps(st, indent=2) + "\n")
    else:
        print(_render(st))
    return 0


def cmd_dedup_clear(a: argparse.Namespace) -> int:
    from .dedup.shared import clear_store, default_store_dir

    d = Path(a.store_dir) if a.store_dir else default_store_dir()
    removed = clear_store(d, a.domain)
    out = {"store_dir": str(d), "domain": a.domain, "bytes_removed": removed}
    if a.json:
        sys.stdout.write(json.dumps(out) + "\n")
    else:
        print(f"removed {format_bytes(removed)} from {d}" + (f" (domain {a.domain})" if a.domain else ""))
    return 0


def add_parsers(sub: Any) -> None:
    d = sub.add_parser("dedup", help="page merging of warm functions' memory (UPM on KSM)")
    dsub = d.add_subparsers(dest="dedup_command", required=True)
    s = dsub.add_parser("status", help="merged pages and bytes saved per function and per node, time to merge")
    s.add_argument("--node-id", default="node0", help="the node daemon to ask (default node0)")
    s.add_argument("--socket", help="its Unix socket (default $GFAAS_RUN_DIR/<node>.sock)")
    s.add_argument("--state-dir", help="its state directory, where the admin token is (default $GFAAS_RUN_DIR/<node>.state)")
    s.add_argument("--json", action="store_true", help="print the node's report as one JSON document")
    s.set_defaults(func=cmd_dedup_status)
    c = dsub.add_parser("clear", help="remove the files of a shared-loading store (gfaas.dedup.load_shared)")
    c.add_argument("--store-dir", help="the store (default $GFAAS_SHARED_DIR or /dev/shm/gfaas-shared-<uid>)")
    c.add_argument("--domain", help="only this sharing domain")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_dedup_clear)
