"""The Ray node that runs beside a gfaas node daemon on one machine (``gfaas node start --ray-address``).

It advertises the custom resource ``gfaas_node_<node id>`` (:func:`gfaas.runtime.cluster.ray_resource`),
so the runtime can pin a function's actor to this machine, where the actor talks to this node's
daemon. Ray's token authentication is on, with a token derived from the cluster key
(:meth:`~gfaas.dataplane.peer_auth.PeerKey.ray_token`): whoever holds the key file may join.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

from ..dataplane.peer_auth import PeerKey
from ..errors import ConfigError
from ..runtime.cluster import ray_resource

NODE_UNITS = 1000  # of gfaas_node_<id>: workers ask for a sliver, so any number fit


def ray_env(key: PeerKey, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of ``ray start`` and of a driver that joins: token auth with the key's token."""
    env = dict(os.environ if base is None else base)
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=key.ray_token(), RAY_USAGE_STATS_ENABLED="0")
    return env


def ray_binary() -> str:
    """The ``ray`` launcher of this Python environment (the ``ray`` extra)."""
    cand = os.path.join(os.path.dirname(sys.executable), "ray")
    path = cand if os.path.exists(cand) else shutil.which("ray")
    if path is None:
        raise ConfigError("the `ray` command is missing; install the extra: pip install 'gfaas[ray]'")
    return path


def start_argv(node_id: str, *, address: str = "", head_port: int = 0, node_ip: str = "",
               num_cpus: float | None = None, num_gpus: int | None = None, temp_dir: str = "",
               object_store_bytes: int = 0) -> list[str]:
    """``ray start --block ...`` for the Ray node beside gfaas node ``node_id``: a head (``head_port``)
    or a node joining ``address`` (``host:port`` of the head). ``--block`` keeps it in the
    foreground, so stopping this process stops that Ray node and nothing else on the machine."""
    if bool(address) == bool(head_port):
        raise ConfigError("give the Ray head's address (join) or a head port (start the head), not both")
    argv = [ray_binary(), "start", "--block", "--disable-usage-stats",
            "--resources", json.dumps({ray_resource(node_id): NODE_UNITS})]
    argv += ["--head", "--port", str(head_port), "--include-dashboard", "false"] if head_port else ["--address", address]
    if node_ip:
        argv += ["--node-ip-address", node_ip]
    if num_cpus is not None:
        argv += ["--num-cpus", f"{num_cpus:g}"]
    if num_gpus is not None:
        argv += ["--num-gpus", str(num_gpus)]
    if temp_dir:
        argv += ["--temp-dir", temp_dir]
    if object_store_bytes:
        argv += ["--object-store-memory", str(object_store_bytes)]
    return argv
