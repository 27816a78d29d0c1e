"""The gfaas command line. The CLI owns output: logging setup, colours, tables and progress.

Every command that reports results accepts ``--json`` and then prints one JSON document on stdout
and nothing else there (logs go to stderr).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from typing import Any

from .config import NodeConfig
from .errors import GfaasError
from .units import parse_size


def _node_config(a: argparse.Namespace) -> NodeConfig:
    return NodeConfig(
        node_id=a.node_id,
        socket_path=a.socket or "",
        state_dir=a.state_dir or "",
        backend=a.backend,
        devices=a.devices,
        capacity_bytes=parse_size(a.capacity),
        slab_bytes=parse_size(a.slab),
        transfer_host=a.transfer_host,
        transfer_port=a.transfer_port,
        advertise_host=a.advertise_host,
        redis_url=a.redis_url or getattr(a, "join", None),
        storage_policy=a.storage_policy,
        spill_dir=a.spill_dir or "",
        spill_capacity_bytes=None if a.spill_capacity is None else parse_size(a.spill_capacity),
        cluster_key_file=a.cluster_key_file or "",
        redis_password_file=a.redis_password_file or "",
        redis_ca_file=a.redis_ca_file or "",
        dedup=not a.no_dedup,
        socket_group=a.socket_group,
    )


def _add_node_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node-id", default="node0", help="name of this node (default node0)")
    p.add_argument("--socket", help="Unix socket path (default $GFAAS_RUN_DIR/<node>.sock)")
    p.add_argument("--state-dir", help="state directory (default $GFAAS_RUN_DIR/<node>.state)")
    p.add_argument("--socket-group", type=int, metavar="GID",
                   help="members of this group may connect to the socket (0660; its directory 0710): Ray actors "
                        "running as another user, each still presenting its task's token. Default: the daemon's "
                        "user only")
    p.add_argument("--backend", default="host", choices=["host", "null"])
    p.add_argument("--devices", default="", help="GPU memory pools the daemon owns: cuda (every CUDA GPU), "
                   "cuda:0,1, or null:0,1 (modelled GPUs); default none")
    p.add_argument("--capacity", default="2GiB", help="pool capacity (default 2GiB)")
    p.add_argument("--slab", default="8MiB", help="slab size (default 8MiB)")
    p.add_argument("--transfer-host", help="listen for cross-node pulls on this address")
    p.add_argument("--transfer-port", type=int, default=0)
    p.add_argument("--advertise-host", help="address other nodes use to reach this one")
    p.add_argument("--redis-url", help="global directory, e.g. redis://127.0.0.1:6379/0")
    p.add_argument("--storage-policy", default="gfaas",
                   help="elastic-storage policy of every tier: gfaas (default), lru, no-pool, ...")
    p.add_argument("--spill-dir", help="disk tier under host memory (default <state-dir>/spill)")
    p.add_argument("--spill-capacity", help="most bytes on disk, e.g. 20GiB (default: no limit; 0: no disk tier)")
    p.add_argument("--cluster-key-file", help="key shared by every node (0600; `gfaas cluster keygen PATH`);"
                   " needed with --transfer-host or --redis-url")
    p.add_argument("--redis-password-file", help="file (0600) with the global directory's password")
    p.add_argument("--redis-ca-file", help="CA bundle of a TLS directory (rediss://)")
    p.add_argument("--no-dedup", action="store_true",
                   help="no page-merging controller (gfaas.dedup): hints are refused, KSM is never touched")


def _print(data: Any, as_json: bool, render: Any = None) -> None:
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    elif render is not None:
        render(data)
    else:
        for k, v in data.items():
            print(f"{k:>16}: {v}")


def cmd_node(a: argparse.Namespace) -> int:
    from .dataplane import local

    cfg = _node_config(a)
    if a.action == "start":
        from .cli_cluster import run_node_with_ray, wants_ray

        if wants_ray(a):
            return run_node_with_ray(cfg, a)
        if a.foreground:
            from .dataplane.node_main import main as node_main

            node_main(cfg)
            return 0
        proc = local.start_daemon(cfg)
        _print({"node_id": cfg.node_id, "pid": proc.pid, "socket": cfg.socket_path,
                "state_dir": cfg.state_dir}, a.json)
        return 0
    if a.action == "stop":
        stopped = local.stop_daemon(cfg)
        _print({"node_id": cfg.node_id, "stopped": stopped}, a.json)
        return 0 if stopped else 1
    from .dataplane.client import Admin

    with Admin(cfg.socket_path, state_dir=cfg.state_dir) as adm:
        st = adm.stats()
    st["pid"] = local.read_pid(cfg)
    _print(st, a.json)
    return 0


def cmd_cluster(a: argparse.Namespace) -> int:
    from .dataplane import cluster

    if a.action == "ray-token":
        if not a.path:
            raise GfaasError("gfaas cluster ray-token needs the cluster key file: gfaas cluster ray-token PATH")
        from .cli_cluster import ray_token

        print(ray_token(a.path))
        return 0
    if a.action == "keygen":
        if not a.path:
            raise GfaasError("gfaas cluster keygen needs the path of the key file to create")
        from .dataplane.peer_auth import generate_key_file

        try:
            generate_key_file(a.path)
        except FileExistsError:
            raise GfaasError(f"{a.path} exists; a cluster key is never overwritten (remove it first)") from None
        _print({"cluster_key_file": a.path}, a.json)
        return 0
    if a.action == "start":
        info = cluster.start_cluster(a.nodes, parse_size(a.capacity), a.redis_url,
                                     redis_password_file=a.redis_password_file, cluster_key_file=a.cluster_key_file)
        nodes = [{"node_id": n["config"]["node_id"], "socket": n["config"]["socket_path"], "pid": n["pid"]}
                 for n in info["nodes"]]
        data: dict[str, Any] = {"redis_url": info["redis_url"], "nodes": nodes}
    elif a.action == "stop":
        data = {"stopped": cluster.stop_cluster()}
    else:
        data = cluster.cluster_status()

    def render(d: dict[str, Any]) -> None:
        if "stopped" in d:
            print("stopped: " + (", ".join(d["stopped"]) or "nothing was running"))
            return
        print(f"global directory: {d['redis_url']}")
        for n in d["nodes"]:
            extra = f"  objects={n['objects']} reserved={n['bytes_reserved']}" if "objects" in n else ""
            print(f"  {n['node_id']:<8} {n['socket']}{extra}")

    _print(data, a.json, render)
    return 0


def cmd_demo(a: argparse.Namespace) -> int:
    if a.requests is None:
        a.requests = 5 if a.gpu else 3
    if a.requests < 1:
        print(f"gfaas: error: --requests {a.requests}: give at least 1", file=sys.stderr)
        return 2
    if a.gpu:
        from . import demo_gpu

        ns = argparse.Namespace(scale=a.scale, requests=a.requests,
                                workflows=a.workflows, gpus="auto", json=a.json, results=a.results,
                                out="out/demo-gpu" if a.out == "out/demo" else a.out)
        return demo_gpu.run(ns)
    from .demo import run_demo

    return run_demo(a)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    p = argparse.ArgumentParser(prog="gfaas", description="Serverless inference platform for GPU clusters")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more log output on stderr")
    p.add_argument("--version", action="version", version=f"gfaas {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    n = sub.add_parser("node", help="the per-node data-plane daemon")
    n.add_argument("action", choices=["start", "stop", "status"])
    n.add_argument("--foreground", action="store_true", help="start: run in this process")
    n.add_argument("--json", action="store_true")
    _add_node_args(n)
    from .cli_cluster import add_node_cluster_args

    add_node_cluster_args(n)
    n.set_defaults(func=cmd_node)

    c = sub.add_parser("cluster", help="a local cluster: a directory server and N node daemons on loopback")
    c.add_argument("action", choices=["start", "stop", "status", "keygen", "ray-token"])
    c.add_argument("path", nargs="?", help="keygen: where to create a cluster key file (0600); ray-token: the key"
                   " file to derive the Ray cluster's token from (printed, for RAY_AUTH_TOKEN)")
    c.add_argument("--nodes", type=int, default=2, help="start: number of node daemons (default 2)")
    c.add_argument("--capacity", default="1GiB", help="start: pool capacity per node (default 1GiB)")
    c.add_argument("--redis-url", help="start: use this directory server instead of starting one")
    c.add_argument("--redis-password-file", help="start: file (0600) with the password of --redis-url")
    c.add_argument("--cluster-key-file", help="start: the nodes' shared key (default: <run dir>/cluster.key,"
                   " created if missing)")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_cluster)

    d = sub.add_parser("demo", help="the main job: the six reference workflows through the gateway, gfaas vs Redis")
    d.add_argument("--json", action="store_true", help="print the results as one JSON document")
    d.add_argument("--scale", choices=["small", "full"], default="full",
                   help="model sizes: full = the real architectures (default), small = shrunk, for a quick look")
    d.add_argument("--requests", type=int, default=None,
                   help="bursty requests per workflow and transport (default 3; with --gpu, 5 one at a time)")
    d.add_argument("--load", type=float, default=0.3,
                   help="mean offered load as a fraction of this machine's CPU capacity, estimated from the "
                        "warm-up's compute times (default 0.3; bursts run at twice the mean)")
    d.add_argument("--workflows", help="comma-separated subset (default: all six)")
    d.add_argument("--out", default="out/demo", help="directory for report.md, report.png, results.json")
    d.add_argument("--dedup", choices=["off", "shared", "merge", "on"], default="on",
                   help="page merging of the warm workers (docs/dedup.md): shared weights and/or KSM merging "
                        "(default on: both; merging needs root)")
    d.add_argument("--gpu", action="store_true",
                   help="the GPU demo instead (docs/gpu.md): GPU functions on this machine's CUDA GPUs, gfaas device "
                        "passing vs Redis vs gfaas host-only passing, requests one at a time (--requests, default 5)")
    d.add_argument("--results", default="", help="--gpu: also write the results here "
                   "(benchmarks/results/demo-gpu.json is what make demo-gpu writes)")
    d.add_argument("--serve", action="store_true",
                   help="keep the demo's gateway and its dashboard up after the report, until Ctrl-C (default off)")
    d.set_defaults(func=cmd_demo)

    from .cli_accel import add_parsers as add_accel
    from .cli_bench import add_parsers as add_bench
    from .cli_dedup import add_parsers as add_dedup
    from .cli_deploy import add_parsers as add_deploy
    from .cli_invoke import add_parsers as add_invoke
    from .cli_logs import add_parsers as add_logs
    from .cli_runtime import add_parsers as add_runtime
    from .cli_scale import add_parsers as add_scale
    from .cli_sim import add_parsers

    add_bench(sub)
    add_parsers(sub)
    add_runtime(sub)
    add_scale(sub)
    add_accel(sub)
    add_dedup(sub)
    add_deploy(sub)
    add_invoke(sub)
    add_logs(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    from .cli_bench import settings_of
    from .provenance import record_settings

    record_settings(settings_of(a))  # every result file this command writes records what it ran with
    level = logging.WARNING - 10 * a.verbose
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    previous = _exit_on_sigterm()
    try:
        return int(a.func(a) or 0)
    except GfaasError as exc:
        print(f"gfaas: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        httpx = sys.modules.get("httpx")
        if httpx is not None and isinstance(exc, httpx.TransportError):  # a gateway that stopped answering
            print(f"gfaas: error: the gateway connection failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm() -> Any:
    """SIGTERM (a service manager, a container's stop, ``kill``) ends a command as Ctrl-C does: the
    main thread unwinds, so a runtime the command made stops its workers and node daemon and removes
    its weight store from /dev/shm (killed outright, ``gfaas demo`` left 1.1 GB there). A second
    SIGTERM kills at once. Commands that serve until told to stop install their own handler. Returns
    the handler it replaced (None off the main thread, where signals cannot be handled)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def on_term(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, on_term)


if __name__ == "__main__":
    sys.exit(main())
