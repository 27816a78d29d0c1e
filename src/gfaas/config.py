"""Configuration as small frozen dataclasses, validated on construction.

Files and command-line flags are turned into these at the edge (the CLI); library code only ever
sees validated values.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .errors import ConfigError

if TYPE_CHECKING:
    from .policy.storage import StorageOptions

from .units import GiB as GiB
from .units import KiB as KiB
from .units import MiB as MiB

_NODE_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def default_run_dir() -> str:
    """Where node sockets and state live unless configured: ``$GFAAS_RUN_DIR``, else a per-user
    directory under ``$XDG_RUNTIME_DIR``, else ``/run/gfaas`` for root, else ``/tmp/gfaas-<uid>``.

    The last has a name other local users can predict; the daemon refuses it (and any run or state
    directory) unless it is this user's, not a symlink and not writable by others
    (:mod:`gfaas.secfiles`)."""
    env = os.environ.get("GFAAS_RUN_DIR")
    if env:
        return env
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return os.path.join(xdg, f"gfaas-{os.getuid()}")
    if os.geteuid() == 0 and os.path.isdir("/run"):
        return "/run/gfaas"
    return os.path.join("/tmp", f"gfaas-{os.getuid()}")


def redact_url(url: str | None) -> str | None:
    """``url`` with its password replaced by ``***`` (``redis://:***@host:6379/0``), for logs and reprs."""
    if not url:
        return url
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://[^:/@]*:).*@(?=[^@]*$)", r"\1***@", url)


def default_socket_path(node_id: str = "node0") -> str:
    return os.environ.get("GFAAS_SOCKET") or os.path.join(default_run_dir(), f"{node_id}.sock")


def _positive(name: str, value: int, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{name}={value!r} is invalid: give an integer >= {minimum}")


@dataclass(frozen=True)
class NodeConfig:
    """Settings of one node daemon.

    Attributes:
        node_id: name of this node in the cluster (letters, digits, ``_.-``; at most 64).
        socket_path: Unix socket the function processes and the admin connect to (mode 0600).
        state_dir: directory for the invocation registry and the object journal (survive restarts).
        backend: ``host`` (shared-memory slabs) or ``null`` (moves no bytes; tests and simulator).
        capacity_bytes: the most bytes the node's pool reserves at once.
        slab_bytes: size of one slab; objects up to ``slab_bytes // 4`` are packed into slabs,
            larger ones get a segment of their own.
        ids_per_lease: how many object IDs a client receives at a time for its slab.
        transfer_host: address the TCP transfer server listens on (``None``: no cross-node serving).
        transfer_port: its port (0 picks a free one).
        advertise_host: address other nodes use to reach this one (defaults to ``transfer_host``).
        redis_url: the global directory (``redis://host:port/db``); ``None`` runs single-node.
        chunk_bytes: chunk size of cross-node pulls (pipelined).
        remote_timeout_s: how long a cross-node lookup or pull may take before it fails.
        slab_object_bytes: objects up to this size (and a quarter slab) are packed into slabs.
        warm_pool_bytes: the most bytes of freed large-object segments kept for reuse by later
            objects of invocations of the same workflow (their pages stay allocated; 0 turns
            reuse off, and with it the chance of a producer seeing its workflow's earlier bytes).
        tombstones_per_invocation: how many freed IDs per invocation are remembered to answer
            ``DataDeleted`` instead of ``AccessDenied``.
        devices: GPU memory pools the daemon owns: ``""`` none; ``"cuda"`` every CUDA GPU;
            ``"cuda:0,1"`` those GPUs; ``"null:0,1"`` modelled GPUs that hold no bytes (tests and
            the simulator).
        device_capacity_bytes: cap of each GPU pool (0: half the GPU's free memory at start for
            ``cuda``, 16 GiB for ``null``).
        device_pool_floor_bytes: bytes of empty arenas each GPU pool keeps rather than return to
            the driver (300 MB, the papers' floor; the elastic-storage policy moves the target).
        storage_policy: the elastic-storage policy of every tier, a name of
            :data:`gfaas.policy.storage.STORAGE_POLICIES` (``gfaas``: queue-aware eviction, restore,
            peer migration, demand-sized pools; ``lru``, ``no-pool``, ... are the papers' baselines).
        spill_dir: directory of the disk tier under host memory (default ``<state_dir>/spill``);
            its files are removed as their objects are freed and when the daemon starts or stops.
        spill_capacity_bytes: the most bytes the disk tier holds (``None``: the lesser of
            ``capacity_bytes`` and a quarter of the spill filesystem's free space when the daemon
            starts; ``0``: no disk tier, so a full pool raises ``CapacityError`` as before).
            ``spill_dir`` must be owned by the daemon's user and not writable by group or others.
        quota_reserved_bytes: per invocation, the most bytes held for writing at once (segments
            of allocated, unsealed objects and open slabs; ``None``: half of ``capacity_bytes``).
        quota_unsealed_objects: per invocation, the most objects allocated and not yet sealed.
        quota_issued_ids: per invocation, the most IDs for small puts handed out and not used yet.
        socket_group: a group whose members may connect to the socket (mode 0660, its directory
            0710, both given that group): clients running as another user, such as non-root Ray
            actors (deploy/k8s). Connecting grants nothing by itself: every request needs a token.
            ``None``: the daemon's user only (0600).
        quota_segments: per invocation, the most host shared-memory segments held at once (each
            is one of the daemon's file descriptors; default a quarter of its descriptor limit).
        quota_spill_bytes: per invocation, bytes on disk above which it may not allocate more
            (``None``: half the disk tier's capacity). Each quota raises ``QuotaExceeded`` naming it.
        seal_writes: also seal the writes of each large object's segment when it is sealed
            (``F_SEAL_FUTURE_WRITE``). Slabs always are, and no reader can reopen a segment for
            writing when functions run sandboxed (the memfd is the daemon's, mode 0400). Sealed
            segments can be reused only by the connection that wrote them, so runtime workers (a
            connection per task) lose warm reuse: 256 MiB puts 2-6x slower (docs/security/memory.md).
        max_connections: the most client connections the daemon keeps open at once (lowered to a
            quarter of its file-descriptor limit); more are refused with ``CapacityError``.
        max_connections_per_uid: the most of those from one local user (``SO_PEERCRED``).
        hello_timeout_s: a connection that has not presented credentials (``Hello`` or
            ``AdminHello``) this many seconds after connecting is closed.
        dedup: run the page-merging controller (:mod:`gfaas.dedup`, docs/dedup.md). It does
            nothing until the runtime relays a worker's merge hint; as root it then switches KSM to
            a burst setting until the hinted pages are merged and restores the previous settings.
        ksm_lock_dir: the machine-wide directory (root only) whose lock says which node daemon owns
            KSM's global settings and where it saves them for a restore after a crash.

    Peers (docs/security/peers.md):
        cluster_key_file: the key every node of the cluster shares (>= 32 bytes, mode 0600;
            ``gfaas cluster keygen PATH`` makes one); required with ``transfer_host`` or
            ``redis_url``. Nodes prove it to each other before a pull, and sign directory entries.
        redis_password_file: file (mode 0600) with the global directory's password; the user name
            of an ACL user goes in ``redis_url`` (``redis://user@host:port/0``).
        redis_ca_file: CA bundle that verifies a ``rediss://`` (TLS) directory.
        peer_handshake_timeout_s: how long a new transfer connection may take to prove the key.
        peer_max_pending: connections still proving the key, in all; the oldest is dropped beyond.
        peer_max_pending_per_ip: the same, per source address.
        peer_max_connections: authenticated transfer connections served at once.
    """

    node_id: str = "node0"
    socket_path: str = ""
    state_dir: str = ""
    backend: str = "host"
    capacity_bytes: int = 2 * GiB
    slab_bytes: int = 8 * MiB
    ids_per_lease: int = 64
    transfer_host: str | None = None
    transfer_port: int = 0
    advertise_host: str | None = None
    redis_url: str | None = None
    chunk_bytes: int = 2 * MiB
    remote_timeout_s: float = 5.0
    tombstones_per_invocation: int = 65536
    warm_pool_bytes: int = 512 * MiB
    slab_object_bytes: int = 128 * KiB
    devices: str = ""
    device_capacity_bytes: int = 0
    device_pool_floor_bytes: int = 300 * 1000 * 1000
    storage_policy: str = "gfaas"
    spill_dir: str = ""
    spill_capacity_bytes: int | None = None
    # ---- per-invocation quotas (issue 14; gfaas.dataplane.quota) ----
    quota_reserved_bytes: int | None = None
    quota_unsealed_objects: int = 1024
    quota_issued_ids: int = 65536
    quota_spill_bytes: int | None = None
    quota_segments: int | None = None
    socket_group: int | None = None
    seal_writes: bool = False
    # ---- peers (issue 14, docs/security/peers.md) ----
    cluster_key_file: str = ""
    redis_password_file: str = ""
    redis_ca_file: str = ""
    peer_handshake_timeout_s: float = 3.0
    peer_max_pending: int = 256
    peer_max_pending_per_ip: int = 32
    peer_max_connections: int = 128
    # Connection limits (issue 14: idle connections must not exhaust the daemon's descriptors).
    max_connections: int = 4096
    max_connections_per_uid: int = 1024
    hello_timeout_s: float = 5.0
    # ---- page merging (issue 17; gfaas.dedup) ----
    dedup: bool = True
    ksm_lock_dir: str = "/run/gfaas-ksm"
    extra: dict[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.node_id, str) or not _NODE_ID.fullmatch(self.node_id):
            raise ConfigError(
                f"node_id={self.node_id!r} is invalid: use 1-64 letters, digits, '_', '.' or '-'"
            )
        if not self.socket_path:
            object.__setattr__(self, "socket_path", default_socket_path(self.node_id))
        if not self.state_dir:
            object.__setattr__(self, "state_dir", os.path.join(default_run_dir(), f"{self.node_id}.state"))
        if len(os.fsencode(self.socket_path)) > 107:
            raise ConfigError(
                f"socket_path={self.socket_path!r} is longer than the 107 bytes a Unix socket allows;"
                " choose a shorter path"
            )
        if self.backend not in ("host", "null"):
            raise ConfigError(f"backend={self.backend!r} is unknown: choose 'host' or 'null'")
        _positive("capacity_bytes", self.capacity_bytes, 4 * KiB)
        _positive("slab_bytes", self.slab_bytes, 64 * KiB)
        if self.slab_bytes > self.capacity_bytes:
            raise ConfigError(
                f"slab_bytes={self.slab_bytes} exceeds capacity_bytes={self.capacity_bytes};"
                " make the slab smaller or the pool larger"
            )
        _positive("ids_per_lease", self.ids_per_lease)
        _positive("chunk_bytes", self.chunk_bytes, 4 * KiB)
        _positive("tombstones_per_invocation", self.tombstones_per_invocation)
        _positive("warm_pool_bytes", self.warm_pool_bytes, 0)
        _positive("slab_object_bytes", self.slab_object_bytes, 0)
        _positive("device_capacity_bytes", self.device_capacity_bytes, 0)
        _positive("device_pool_floor_bytes", self.device_pool_floor_bytes, 0)
        self.device_spec()  # validates
        if not isinstance(self.spill_dir, str):
            raise ConfigError(f"spill_dir={self.spill_dir!r} must be a path (a string)")
        if not self.spill_dir:
            object.__setattr__(self, "spill_dir", os.path.join(self.state_dir, "spill"))
        if self.spill_capacity_bytes is not None:
            _positive("spill_capacity_bytes", self.spill_capacity_bytes, 0)
        self.storage_options()  # validates
        self._check_quotas()
        if not isinstance(self.transfer_port, int) or not (0 <= self.transfer_port <= 65535):
            raise ConfigError(f"transfer_port={self.transfer_port!r} is not a TCP port (0-65535)")
        if not isinstance(self.remote_timeout_s, int | float) or not self.remote_timeout_s > 0:
            raise ConfigError(f"remote_timeout_s={self.remote_timeout_s!r} must be a number > 0")
        _positive("max_connections", self.max_connections)
        _positive("max_connections_per_uid", self.max_connections_per_uid)
        if (not isinstance(self.hello_timeout_s, int | float) or isinstance(self.hello_timeout_s, bool)
                or not 0 < self.hello_timeout_s < float("inf")):
            raise ConfigError(f"hello_timeout_s={self.hello_timeout_s!r} must be a number of seconds > 0")
        self._check_peers()

    def _check_peers(self) -> None:
        for name in ("cluster_key_file", "redis_password_file", "redis_ca_file"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"{name}={getattr(self, name)!r} must be a path (a string)")
        if (self.transfer_host is not None or self.redis_url is not None) and not self.cluster_key_file:
            raise ConfigError(
                "cross-node pulls (transfer_host or redis_url) need cluster_key_file: the key every node"
                " shares; create one with `gfaas cluster keygen PATH` and give it to every node"
            )
        t = self.peer_handshake_timeout_s
        if not isinstance(t, int | float) or isinstance(t, bool) or not t > 0:
            raise ConfigError(f"peer_handshake_timeout_s={t!r} must be a number > 0")
        _positive("peer_max_pending", self.peer_max_pending)
        _positive("peer_max_pending_per_ip", self.peer_max_pending_per_ip)
        _positive("peer_max_connections", self.peer_max_connections)

    def __repr__(self) -> str:
        # Never print a password: reprs end up in logs and error messages.
        fields = ", ".join(f"{k}={redact_url(v) if k == 'redis_url' else v!r}" for k, v in self.__dict__.items())
        return f"NodeConfig({fields})"

    def _check_quotas(self) -> None:
        if not isinstance(self.seal_writes, bool):
            raise ConfigError(f"seal_writes={self.seal_writes!r} must be true or false")
        if self.quota_reserved_bytes is None:
            object.__setattr__(self, "quota_reserved_bytes", max(self.capacity_bytes // 2, self.slab_bytes))
        _positive("quota_reserved_bytes", self.quota_reserved_bytes, self.slab_bytes)  # type: ignore[arg-type]
        _positive("quota_unsealed_objects", self.quota_unsealed_objects)
        _positive("quota_issued_ids", self.quota_issued_ids, self.ids_per_lease)
        if self.quota_spill_bytes is not None:
            _positive("quota_spill_bytes", self.quota_spill_bytes, 0)
        if self.quota_segments is not None:
            _positive("quota_segments", self.quota_segments)
        if self.socket_group is not None:
            _positive("socket_group", self.socket_group, 0)

    def storage_options(self) -> StorageOptions:
        """The :class:`~gfaas.policy.storage.StorageOptions` named by :attr:`storage_policy`."""
        from .policy.storage import STORAGE_POLICIES, storage_policy

        if not isinstance(self.storage_policy, str) or self.storage_policy not in STORAGE_POLICIES:
            raise ConfigError(
                f"storage_policy={self.storage_policy!r} is unknown; choose one of {', '.join(STORAGE_POLICIES)}"
            )
        return storage_policy(self.storage_policy)

    def device_spec(self) -> tuple[str, tuple[int, ...] | None]:
        """``(kind, GPU ordinals)`` of :attr:`devices` (:func:`parse_devices`)."""
        return parse_devices(self.devices)

    @property
    def small_object_max(self) -> int:
        """Objects up to this many bytes share slabs; larger ones get their own segment.

        The lesser of ``slab_bytes // 4`` and ``slab_object_bytes``. Slab space is never reused, so
        every object packed there is written into fresh pages; objects above ~128 KiB are faster in
        a segment of their own, which is kept warm and reused (docs/benchmarks.md).
        """
        return min(self.slab_bytes // 4, self.slab_object_bytes)


def parse_devices(devices: object) -> tuple[str, tuple[int, ...] | None]:
    """``(kind, GPU ordinals)`` of a devices string: kind ``""``, ``"cuda"`` or ``"null"``;
    ordinals ``None`` means every GPU the runtime sees."""
    spec = devices.strip() if isinstance(devices, str) else None
    if spec is None:
        raise ConfigError(f"devices={devices!r} must be a string such as 'cuda', 'cuda:0,1' or 'null:0'")
    if not spec:
        return "", ()
    kind, _, ids = spec.partition(":")
    if kind not in ("cuda", "null"):
        raise ConfigError(f"devices={spec!r}: unknown kind {kind!r}; use 'cuda', 'cuda:0,1' or 'null:0'")
    if not ids:
        return kind, (None if kind == "cuda" else (0,))
    try:
        ordinals = tuple(int(x) for x in ids.split(","))
    except ValueError:
        raise ConfigError(f"devices={spec!r}: GPU ordinals must be integers, e.g. 'cuda:0,1'") from None
    if any(i < 0 for i in ordinals) or len(set(ordinals)) != len(ordinals):
        raise ConfigError(f"devices={spec!r}: GPU ordinals must be distinct and >= 0")
    return kind, ordinals
