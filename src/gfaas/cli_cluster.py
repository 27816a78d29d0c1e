"""``gfaas node start --join ... --ray-address ...``: one command per machine of a multi-machine cluster
(docs/deploy.md). The node daemon runs as a child process, the Ray node beside it as another
(``ray start --block``, :mod:`gfaas.deploy.ray_node`); this command supervises both in the foreground
(systemd, a container), stops both on SIGTERM or Ctrl-C, and exits when either one dies.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
from typing import Any

from .config import NodeConfig
from .errors import ConfigError


def add_node_cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--join", metavar="REDIS_URL",
                   help="start: join the cluster whose global directory is this Redis URL (same as --redis-url); "
                        "needs --cluster-key-file and --transfer-host")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--ray-address", metavar="HEAD:PORT",
                   help="start: also run a Ray node joined to this Ray head, so the runtime places functions here")
    g.add_argument("--ray-head", type=int, metavar="PORT", help="start: also run the Ray head on this port (no CPUs "
                   "by default: the head runs the gateway)")
    p.add_argument("--ray-cpus", type=float, help="start: CPUs this machine offers to functions (default: Ray's count)")
    p.add_argument("--ray-gpus", type=int, help="start: GPUs this machine offers to functions (default: Ray's count)")


def wants_ray(a: argparse.Namespace) -> bool:
    return bool(getattr(a, "ray_address", None) or getattr(a, "ray_head", None))


def run_node_with_ray(cfg: NodeConfig, a: argparse.Namespace) -> int:
    """Start the daemon, then the Ray node beside it; wait until a signal or either one exits."""
    from .dataplane import local
    from .dataplane.peer_auth import PeerKey
    from .deploy.ray_node import ray_env, start_argv

    if not cfg.cluster_key_file:
        raise ConfigError("--ray-address/--ray-head need --cluster-key-file: Ray's token is derived from it")
    node_ip = cfg.advertise_host or cfg.transfer_host or ""
    head = a.ray_head or 0
    argv = start_argv(cfg.node_id, address=a.ray_address or "", head_port=head, node_ip=node_ip,
                      num_cpus=a.ray_cpus if a.ray_cpus is not None else (0 if head else None), num_gpus=a.ray_gpus)
    daemon = local.start_daemon(cfg, lifeline=True)  # it ends with this command, even if this is killed
    print(f"gfaas node {cfg.node_id}: daemon pid {daemon.pid} on {cfg.socket_path}", file=sys.stderr, flush=True)
    from .runtime.ray_executor import NODE_SOCKET_ENV, NODE_STATE_ENV

    # Its actors find this machine's daemon here (a code package's functions run sandboxed beside it).
    env = {**ray_env(PeerKey.from_file(cfg.cluster_key_file)), NODE_SOCKET_ENV: cfg.socket_path,
           NODE_STATE_ENV: cfg.state_dir}
    ray = subprocess.Popen(argv, env=env, start_new_session=True)
    print(f"gfaas node {cfg.node_id}: Ray node pid {ray.pid} ({'head on port ' + str(head) if head else 'joined ' + a.ray_address}"
          f", resource gfaas_node_{cfg.node_id}); Ctrl-C or SIGTERM stops both", file=sys.stderr, flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(0.5):
        if daemon.poll() is not None or ray.poll() is not None:
            which = "daemon" if daemon.poll() is not None else "Ray node"
            print(f"gfaas node {cfg.node_id}: the {which} exited; stopping", file=sys.stderr, flush=True)
            break
    _stop(ray, signal.SIGTERM)
    local.stop_daemon(cfg)
    return 0 if stop.is_set() else 1


def _stop(proc: subprocess.Popen[Any], sig: int) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def ray_token(key_file: str) -> str:
    """``gfaas cluster ray-token``: the Ray cluster's token, for a Ray started by other means (KubeRay)."""
    from .dataplane.peer_auth import PeerKey

    return PeerKey.from_file(key_file).ray_token()
