"""How a function's inputs and outputs travel: the gfaas data plane, or the host-centric baseline.

A :class:`Transport` is opened for one (invocation, function) and closed when that function's task is
done. References are strings, so they cross process boundaries in the control messages unchanged.

* ``gfaas``: ``put`` stores the array in the node daemon's shared memory (consumers declared, so the
  object is freed once they have read it); ``get`` is a zero-copy, read-only view.
* ``redis``: the host-centric baseline of the papers (INFless-style): each output is serialised into
  a Redis value and every reader fetches and deserialises its own copy over TCP.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from ..errors import ConfigError, GfaasError

log = logging.getLogger("gfaas.runtime")

TransportKind = Literal["gfaas", "redis"]


@dataclass(frozen=True)
class TransportConfig:
    """Where the data goes. ``socket_path`` for gfaas, ``redis_url`` for the baseline."""

    kind: TransportKind = "gfaas"
    socket_path: str = ""
    redis_url: str = field(default="", repr=False)  # may carry a password

    def __post_init__(self) -> None:
        if self.kind not in ("gfaas", "redis"):
            raise ConfigError(f"transport {self.kind!r} is not 'gfaas' or 'redis'")
        if self.kind == "redis" and not self.redis_url:
            raise ConfigError("the redis transport needs redis_url (e.g. redis://127.0.0.1:6379/0)")


class Transport(Protocol):
    def get(self, ref: str, deadline_s: float | None = None, device: int | None = None) -> Any: ...
    def put(self, value: np.ndarray, consumers: Sequence[str] | None) -> str: ...
    def close(self) -> None: ...


class GfaasTransport:
    def __init__(self, cfg: TransportConfig, token: str, sock: socket.socket | None = None) -> None:
        from ..dataplane.client import connect

        self._c = connect(socket_path=cfg.socket_path, token=token, sock=sock)

    def get(self, ref: str, deadline_s: float | None = None, device: int | None = None) -> Any:
        """A host array (``device=None``; one on a GPU is copied out by the node), or with
        ``device=k`` a read-only ``DeviceView`` on GPU ``k`` (a host object is copied there by the
        node's staging engine, within ``deadline_s``)."""
        if device is None:
            # Only a node with GPU pools can hold an object off the host: ask for host memory there.
            return np.asarray(self._c.get(ref, deadline_s=deadline_s, device="host" if self._c.devices else None))
        return self._c.get(ref, deadline_s=deadline_s, device=device)

    @property
    def devices(self) -> frozenset[int]:
        """The GPUs with a memory pool on this transport's node."""
        return frozenset(self._c.devices)

    def put(self, value: Any, consumers: Sequence[str] | None) -> str:
        """Store ``value``: a host array, or a device tensor (into its GPU's pool with one
        device-to-device copy when the node has one, else through host memory)."""
        obj = value if hasattr(value, "__dlpack_device__") else np.asarray(value)
        return str(self._c.put(obj, consumers=list(consumers) if consumers else None))

    @property
    def slab_used(self) -> bool:
        """Whether a put of this task packed an object into a slab (the runtime leases one with the
        next task's credentials only for functions that do)."""
        return bool(self._c.slab_used)

    def close(self) -> None:
        self._c.close()


class BoundTransport(GfaasTransport):
    """The gfaas transport over a long-lived *attached* connection (``Admin.attach``), for one task:
    no connect, ``Hello`` or ``Sync`` per task. ``token``: the credentials to bind it to at its first
    use (the platform's own puts and gets); empty when the platform bound it already (a worker's,
    ``Client.expect_binding``). ``release(client, healthy)`` takes the connection back at close."""

    def __init__(self, client: Any, token: str = "", release: Callable[[Any, bool], None] | None = None,
                 lease_hint: bool = False) -> None:
        self._c = client
        self._token = token
        self._release = release
        self._lease_hint = lease_hint

    def _bind(self, lease: bool) -> None:
        token, self._token = self._token, ""
        # A slab with the credentials when the first use is a small put: its lease costs no round trip.
        self._c.bind(token, 0 if lease else -1, 8 if lease else 0)

    def get(self, ref: str, deadline_s: float | None = None, device: int | None = None) -> Any:
        if self._token:
            # Bound by a get: a slab comes with the credentials when the caller says the function's last
            # task packed a small put (``lease_hint``), as the runtime does for its process workers;
            # without it that put leased one in a round trip of its own (0.5-0.9 ms per task on the lab).
            self._bind(self._lease_hint)
        return super().get(ref, deadline_s, device)

    def put(self, value: Any, consumers: Sequence[str] | None) -> str:
        if self._token:
            self._bind(getattr(value, "nbytes", self._c.small_object_max + 1) <= self._c.small_object_max)
        return super().put(value, consumers)

    def close(self) -> None:
        healthy = True
        try:
            # A lent connection ends its credentials at once (one-way): the pins of its views and its
            # slab go back now, not when it is next lent. A worker's is unbound by the runtime.
            self._c.end_task(unbind=self._release is not None)
            healthy = not self._c.closed
        except GfaasError as exc:
            healthy = False
            log.warning("dropping a daemon connection after its task: %s", exc)
        finally:
            if self._release is not None:
                self._release(self._c, healthy)


class AttachedPool:
    """Long-lived attached connections to one node daemon, lent one per task (the platform's own
    puts of request inputs and gets of results): a task borrows one and binds it to its credentials,
    so no invocation opens a connection. ``attach()`` makes a new one; up to ``keep`` idle stay."""

    def __init__(self, attach: Callable[[], Any], keep: int = 32) -> None:
        self._attach = attach
        self._keep = keep
        self._idle: list[Any] = []
        self._lock = threading.Lock()
        self._closed = False

    def transport(self, token: str) -> BoundTransport:
        with self._lock:
            client = self._idle.pop() if self._idle else None
        if client is None:
            client = self._attach()
        return BoundTransport(client, token, self._give_back)

    def _give_back(self, client: Any, healthy: bool) -> None:
        with self._lock:
            if healthy and not self._closed and len(self._idle) < self._keep:
                self._idle.append(client)
                return
        client.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for c in idle:
            try:
                c.close()
            except GfaasError as exc:  # the daemon went first: nothing left to tell it
                log.debug("closing an idle daemon connection: %s", exc)


class RedisTransport:
    """Keys are ``gfaas:<invocation>:<function>:<n>``; the reference also carries dtype and shape."""

    _pools: dict[str, Any] = {}

    def __init__(self, cfg: TransportConfig, invocation: str, function: str) -> None:
        import redis

        pool = self._pools.get(cfg.redis_url)
        if pool is None:  # one connection pool per process: a TCP connect per task would dominate
            pool = self._pools[cfg.redis_url] = redis.ConnectionPool.from_url(cfg.redis_url)
        self._r = redis.Redis(connection_pool=pool)
        self._prefix = f"gfaas:{invocation}:{function}:"
        self._n = 0

    devices: frozenset[int] = frozenset()  # the baseline keeps everything in host memory

    def get(self, ref: str, deadline_s: float | None = None, device: int | None = None) -> np.ndarray:
        del deadline_s, device  # Redis has no notion of either: the host-centric baseline
        key, dtype, shape = parse_redis_ref(ref)
        data = self._r.get(key)
        if not isinstance(data, bytes):
            raise ConfigError(f"no object under {key!r} in Redis (deleted, or a forged reference)")
        return np.frombuffer(data, dtype=dtype).reshape(shape)

    def put(self, value: np.ndarray, consumers: Sequence[str] | None) -> str:
        arr = np.asarray(np.asarray(value), order="C")  # (a device tensor is copied to the host here)
        self._n += 1
        key = f"{self._prefix}{self._n}"
        self._r.set(key, arr.tobytes())
        return redis_ref(key, arr)

    def close(self) -> None:
        pass


def redis_ref(key: str, arr: np.ndarray) -> str:
    """The reference a function passes on for an array stored under ``key``."""
    return f"redis:{key}|{arr.dtype.str}|{','.join(map(str, arr.shape))}"


def parse_redis_ref(ref: str) -> tuple[str, str, tuple[int, ...]]:
    try:
        body = ref.removeprefix("redis:")
        key, _, rest = body.partition("|")
        dtype, shape = rest.rsplit("|", 1)  # a dtype string may itself start with '|' ('|u1')
        dims = tuple(int(x) for x in shape.split(",") if x != "")
        np.dtype(dtype)
    except (ValueError, TypeError):
        raise ConfigError(f"{ref!r} is not a redis transport reference (redis:KEY|DTYPE|SHAPE)") from None
    return key, dtype, dims


def open_transport(cfg: TransportConfig, invocation: str, function: str, token: str,
                   sock: socket.socket | None = None) -> Transport:
    """A transport for one function of one invocation (``sock``: a daemon connection to use)."""
    if cfg.kind == "gfaas":
        return GfaasTransport(cfg, token, sock)
    if sock is not None:
        sock.close()
    return RedisTransport(cfg, invocation, function)
