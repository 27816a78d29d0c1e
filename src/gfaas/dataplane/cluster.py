"""A local cluster on one machine: a Redis-protocol server for the global directory and N node
daemons on loopback that pull objects from each other over TCP (``gfaas cluster start|stop|status``).

The directory server it starts has a generated password (``<run_dir>/redis/redis.password``, 0600);
the nodes share ``<run_dir>/cluster.key`` (0600, created if missing).

The cluster's layout is recorded in ``<run_dir>/cluster.json`` so that ``stop`` and ``status`` find
it again from another shell.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import asdict
from typing import Any

from ..config import NodeConfig, default_run_dir
from ..errors import ConfigError, DaemonUnavailable
from .local import is_serving, start_daemon, stop_daemon
from .peer_auth import PeerKey, generate_key_file


def cluster_file(run_dir: str | None = None) -> str:
    return os.path.join(run_dir or default_run_dir(), "cluster.json")


def start_cluster(nodes: int, capacity_bytes: int, redis_url: str | None = None,
                  run_dir: str | None = None, redis_password_file: str | None = None,
                  cluster_key_file: str | None = None) -> dict[str, Any]:
    """Start a directory server (unless ``redis_url`` is given) and ``nodes`` daemons."""
    if not 1 <= nodes <= 64:
        raise ConfigError(f"--nodes {nodes} is out of range; a local cluster has 1-64 nodes")
    run_dir = run_dir or default_run_dir()
    path = cluster_file(run_dir)
    if os.path.exists(path):
        raise DaemonUnavailable(f"a local cluster is already recorded in {path}; run 'gfaas cluster stop' first")
    os.makedirs(run_dir, mode=0o700, exist_ok=True)
    if cluster_key_file is None:
        cluster_key_file = os.path.join(run_dir, "cluster.key")
        if not os.path.lexists(cluster_key_file):
            generate_key_file(cluster_key_file)
    PeerKey.from_file(cluster_key_file)  # refused here, before anything starts, if unsafe or short
    info: dict[str, Any] = {"redis_url": redis_url, "redis_pid": None, "nodes": []}
    if redis_url is None:
        from .redis_server import RedisServer

        srv = RedisServer(dir=os.path.join(run_dir, "redis"), password=True)
        srv.start()  # runs in its own session: it outlives this process until 'cluster stop'
        assert srv.proc is not None
        info["redis_url"], info["redis_pid"] = srv.url, srv.proc.pid
        redis_password_file = srv.password_file
    try:
        for i in range(nodes):
            cfg = NodeConfig(node_id=f"node{i}", socket_path=os.path.join(run_dir, f"node{i}.sock"),
                             state_dir=os.path.join(run_dir, f"node{i}.state"), capacity_bytes=capacity_bytes,
                             transfer_host="127.0.0.1", redis_url=info["redis_url"],
                             cluster_key_file=cluster_key_file, redis_password_file=redis_password_file or "")
            proc = start_daemon(cfg)
            info["nodes"].append({"config": {k: v for k, v in asdict(cfg).items() if k != "extra"},
                                  "pid": proc.pid})
    except Exception:
        _stop(info)
        raise
    with open(path, "w") as f:
        json.dump(info, f, indent=2)
    return info


def _stop(info: dict[str, Any]) -> list[str]:
    stopped = []
    for n in info.get("nodes", []):
        cfg = NodeConfig(**n["config"])
        if stop_daemon(cfg):
            stopped.append(cfg.node_id)
    pid = info.get("redis_pid")
    if pid:
        try:
            os.killpg(pid, signal.SIGKILL)
            stopped.append("redis")
        except ProcessLookupError:
            pass
    return stopped


def load_cluster(run_dir: str | None = None) -> dict[str, Any]:
    path = cluster_file(run_dir)
    try:
        with open(path) as f:
            data: dict[str, Any] = json.load(f)
            return data
    except FileNotFoundError:
        raise DaemonUnavailable(f"no local cluster recorded in {path}; start one with 'gfaas cluster start'") from None


def stop_cluster(run_dir: str | None = None) -> list[str]:
    info = load_cluster(run_dir)
    stopped = _stop(info)
    os.unlink(cluster_file(run_dir))
    return stopped


def cluster_status(run_dir: str | None = None) -> dict[str, Any]:
    from .client import Admin

    info = load_cluster(run_dir)
    out: dict[str, Any] = {"redis_url": info["redis_url"], "nodes": []}
    for n in info["nodes"]:
        cfg = NodeConfig(**n["config"])
        row: dict[str, Any] = {"node_id": cfg.node_id, "socket": cfg.socket_path, "serving": False}
        if is_serving(cfg.socket_path):
            with Admin(cfg.socket_path, state_dir=cfg.state_dir) as adm:
                row.update(adm.stats(), serving=True)
        out["nodes"].append(row)
    return out
