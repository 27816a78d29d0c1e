"""The runtime's view of the nodes of a multi-machine cluster (issue 20): how it reaches each node's
daemon, which nodes are up, where a call's inputs are, and which nodes Ray can place workers on.

* **Reaching a daemon.** A node with a ``state_dir`` the runtime can read is reached through its Unix
  socket (:class:`~gfaas.dataplane.client.Admin`); a node on another machine through its transfer
  port (:class:`~gfaas.dataplane.peer_control.PeerAdmin`, proved with the cluster key).
* **Joining.** With ``RuntimeConfig.join`` (the global directory's Redis URL) the runtime finds the
  nodes that registered there (``gfaas node start --join``), each entry checked against the key, at
  start and then every ``MEMBERSHIP_S`` while it runs (:func:`membership_changes`): a node that joins
  is used without a restart, one whose entry is gone (it stopped) is left out for good.
* **Locality.** :meth:`Cluster.input_bytes` asks the global directory which node holds each input
  of a call and how many bytes, and :func:`gfaas.policy.locality.choose_node` decides.
* **Liveness.** A node whose daemon does not answer is marked down for ``DOWN_S`` seconds: no worker
  starts there and no new invocation is opened there meanwhile.
* **Ray.** A worker pinned to node ``n`` asks Ray for a sliver of the custom resource ``gfaas_node_<n>``,
  which only the Ray node started next to that daemon advertises (:func:`ray_resource`).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from ..dataplane.ids import DataRef
from ..dataplane.peer_auth import PeerKey
from ..errors import AuthenticationError, ConfigError

log = logging.getLogger("gfaas.runtime")

DOWN_S = 5.0  # how long a node that failed to answer is left out before it is tried again
RAY_CACHE_S = 2.0  # how long Ray's view of the cluster's resources is reused
MEMBERSHIP_S = 2.0  # how often a runtime that joined a directory looks for nodes that joined or left
RETRY_JOIN_S = 10.0  # a listed node whose daemon did not answer is tried again after this long
RAY_SLIVER = 0.001  # of a node's gfaas_node_<n> resource (1000 units): any number of workers fit


def ray_resource(node: str) -> str:
    """The Ray custom resource that marks the Ray node running beside gfaas node ``node``."""
    return f"gfaas_node_{node}"


def node_info_key(node: str) -> str:
    return f"gfaas:nodeinfo:{node}"


def discover(redis: Any, key: PeerKey, *, skip_bad: bool = False) -> list[dict[str, str]]:
    """The nodes registered in the global directory: ``[{"node", "address", "socket"}]``, each entry's
    MAC checked: one written without the key is refused with the reason (``AuthenticationError``), or
    with ``skip_bad`` logged as a warning and left out (a running gateway keeps serving)."""
    out = []
    for k in sorted(redis.scan_iter(match="gfaas:nodeinfo:*", count=256)):
        name = str(k).removeprefix("gfaas:nodeinfo:")
        raw = redis.get(k)
        if raw is None:
            continue
        try:
            try:
                fields = {str(a): str(b) for a, b in json.loads(raw).items()}
            except (ValueError, AttributeError):
                raise AuthenticationError(f"the global directory's entry {k} is not a node description") from None
            if not key.entry_ok("nodeinfo", name, fields):
                raise AuthenticationError(f"the global directory's description of node {name} failed its MAC "
                                          "check (written by someone without the cluster key); not using it")
        except AuthenticationError as exc:
            if not skip_bad:
                raise
            log.warning("%s", exc)
            continue
        out.append({"node": name, "address": fields.get("address", ""), "socket": fields.get("socket", "")})
    return out


def membership_changes(members: set[str], joined: set[str], listed: set[str], failed: dict[str, float],
                       now: float, retry_s: float = RETRY_JOIN_S) -> tuple[list[str], list[str]]:
    """What a look at the directory changes: the listed nodes to try to add (not members, and not
    failed within ``retry_s`` of ``now``), and the members that joined through the directory whose
    entry is gone (a node removes its entry when it stops). Nodes the runtime was given, or started,
    are never removed. Pure: the caller passes the clock."""
    add = sorted(n for n in listed - members if now >= failed.get(n, -math.inf) + retry_s)
    remove = sorted((members & joined) - listed)
    return add, remove


class Cluster:
    """Liveness, input locations and Ray placement for the runtime's nodes (names are the runtime's)."""

    def __init__(self, key: PeerKey | None, redis: Any = None, node_ids: dict[str, str] | None = None,
                 probe: Callable[[str], None] | None = None) -> None:
        self.key, self.redis = key, redis
        self.probe = probe  # raises when the node's daemon does not answer (set by the runtime)
        self.node_ids = dict(node_ids or {})  # daemon node_id -> the runtime's name for it
        self._down: dict[str, float] = {}
        self.left: set[str] = set()  # nodes whose directory entry went away: never up again unless they rejoin
        self._lock = threading.Lock()
        self._ray_at = -RAY_CACHE_S
        self._ray_nodes: set[str] = set()

    # -- liveness
    def mark_down(self, node: str, why: str) -> None:
        with self._lock:
            if node not in self._down:
                log.warning("node %s is left out for %.0f s: %s", node, DOWN_S, why)
            self._down[node] = time.monotonic() + DOWN_S

    def up(self, node: str) -> bool:
        if node in self.left:
            return False
        with self._lock:
            until = self._down.get(node)
            if until is None:
                return True
            if time.monotonic() < until:
                return False
            self._down[node] = time.monotonic() + DOWN_S  # one probe per period, whoever asks
        try:  # back only once its daemon answers again
            if self.probe is not None:
                self.probe(node)
        except Exception as exc:  # noqa: BLE001 - any failure keeps it out
            log.debug("node %s is still down: %s", node, exc)
            return False
        with self._lock:
            self._down.pop(node, None)
        log.warning("node %s answers again", node)
        return True

    # -- Ray
    def ray_nodes(self, ray: Any, nodes: Iterable[str]) -> set[str]:
        """Which of ``nodes`` a live Ray node advertises (cached for ``RAY_CACHE_S``)."""
        now = time.monotonic()
        if now - self._ray_at >= RAY_CACHE_S:
            have: set[str] = set()
            for n in ray.nodes():
                res = n.get("Resources", {})
                if n.get("Alive") and res.get("CPU", 0) > 0:  # a head started with no CPUs runs no function
                    have.update(str(r) for r in res)
            self._ray_nodes = {n for n in nodes if ray_resource(n) in have}
            self._ray_at = now
        return set(self._ray_nodes)

    # -- locality
    def input_bytes(self, refs: Iterable[str]) -> dict[str, int]:
        """Bytes of these inputs each node holds, from the global directory (entries MAC-checked);
        a reference the directory does not know (yet) counts one byte on the node it names."""
        refs = [r for r in refs if isinstance(r, str) and r.startswith("gfaas://")]
        out: dict[str, int] = {}
        if not refs:
            return out
        parsed = [DataRef.parse(r) for r in refs]
        entries: list[Any] = [None] * len(parsed)
        if self.redis is not None and self.key is not None:
            try:
                pipe = self.redis.pipeline(transaction=False)
                for ref in parsed:
                    pipe.hgetall(f"gfaas:obj:{ref.id.hex()}")
                entries = pipe.execute()
            except Exception as exc:  # noqa: BLE001 - locality is a preference: fall back to the references
                log.warning("global directory unreachable for input locations: %s", exc)
                entries = [None] * len(parsed)
        for ref, entry in zip(parsed, entries, strict=True):
            node, n = ref.node, 1
            if entry and "node" in entry and self.key is not None and self.key.entry_ok("obj", ref.id.hex(), entry):
                node, n = str(entry["node"]), int(entry.get("nbytes", 1))
            name = self.node_ids.get(node, node)
            out[name] = out.get(name, 0) + n
        return out


def check_join(join: str, key_file: str) -> None:
    if join and not key_file:
        raise ConfigError(f"join={join!r} needs cluster_key_file: the nodes of a cluster prove one key to each other "
                          "(`gfaas cluster keygen PATH`, copied to every machine)")
