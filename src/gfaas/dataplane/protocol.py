"""The typed request protocol between function processes, the admin and a node daemon.

Messages are msgspec structs encoded as MessagePack, one message per ``SOCK_SEQPACKET`` datagram
(so no length prefix is needed on the Unix socket). Anything that does not decode into exactly one
of these types is rejected with :class:`~gfaas.errors.ProtocolError`; nothing is ever unpickled.
File descriptors of shared-memory segments travel as ``SCM_RIGHTS`` ancillary data beside the
reply that first names the segment.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from ..errors import ProtocolError

MAX_FRAME = 64 * 1024
PROTOCOL_VERSION = 3


class _Msg(msgspec.Struct, tag=True, array_like=True):
    pass


#: ``device`` values: an object in host memory, and (for :class:`Get`) "wherever it lives".
HOST = -1
ANY_DEVICE = -2


class DeviceRef(msgspec.Struct, array_like=True):
    """Where a device segment lives, for a process on the same node to map it: the arena's CUDA IPC
    handle (opened once per process and cached by ``arena``, a serial never reused) and the
    segment's offset inside it."""

    device: int
    arena: int
    handle: bytes
    offset: int
    size: int


# ---- requests -------------------------------------------------------------------------------
class Hello(_Msg):
    """Bind this connection to the credentials of one (invocation, function)."""

    token: str
    version: int = PROTOCOL_VERSION


class AdminHello(_Msg):
    """Bind this connection to the node's admin token."""

    admin_token: str
    version: int = PROTOCOL_VERSION


class Attach(_Msg):
    """Platform: open a function connection that is bound to no credentials yet, proved with the admin
    token. It stays open across tasks; :class:`Bind` gives it one (invocation, function) at a time.
    It gets no admin rights: the platform hands it to a function process, which cannot read what the
    platform sent on it."""

    admin_token: str
    version: int = PROTOCOL_VERSION


class Bind(_Msg):
    """On an attached connection: end the credentials it holds (as a disconnect would: objects still
    being written are freed, its slab closes, its pins are released) and take those of ``token``.
    The platform sends it on a worker's connection before the task; the reply (:class:`Bound`) is
    read by the worker. ``lease`` >= 0: also lease a slab for small objects of up to ``lease`` bytes
    with ``ids`` IDs (0: the node's ``ids_per_lease``), saving the first put its round trip."""

    token: str
    lease: int = -1
    ids: int = 0
    # Objects the task will read (its stored inputs, at most MAX_PREFETCH): each one this function may
    # read that lives on a GPU of the node comes back located in the Bound reply, so the task's get of
    # it needs no round trip of its own (a same-GPU get is then a view of an arena already open).
    prefetch: list[bytes] = []


MAX_PREFETCH = 64


class Unbind(_Msg):
    """On an attached connection: end the credentials it holds, as :class:`Bind` does, and take none.
    The platform sends it when the task ends. Sent without waiting for a reply."""


class OpenInvocation(_Msg):
    workflow: str
    functions: list[str]
    invocation_id: str | None = None
    tokens: dict[str, str] | None = None


class EndInvocation(_Msg):
    invocation_id: str


class EndInvocations(_Msg):
    """Admin: end several invocations in one round trip, each as :class:`EndInvocation` would. An ID
    not open on the node is skipped (the reply leaves it out): the runtime's ender sends what ended
    since its last batch, and one invocation ended twice must not keep the others open."""

    invocation_ids: list[str]


class Stats(_Msg):
    pass


class Snapshot(_Msg):
    """Admin: the node's live figures (:class:`SnapshotReply`), from counters the daemon keeps: unlike
    :class:`Stats` it waits for no spill, drains no connection and scans nothing, so it is cheap
    enough to poll every second (O(tiers + GPUs + links), not O(objects))."""


class ObjectInfo(_Msg):
    """Admin: where one object is and who made and reads it (:class:`ObjectInfoReply`)."""

    id: bytes


class QueueHint(_Msg):
    """Admin: where an invocation's functions wait in their request queues (``positions[f]``
    requests ahead of ``f``; 0 for one running now), and which will not run again (``done``).
    Queue-aware eviction reads it; it replaces the invocation's previous hint."""

    invocation_id: str
    positions: dict[str, int]
    done: list[str] = []


class QueueEntry(msgspec.Struct, array_like=True):
    """One invocation in a :class:`QueueState`: ``queued[f] = (q, t)``: ``f`` is request number ``t``
    of queue ``q``; ``running`` functions are at position 0; ``done`` ones will not run again."""

    invocation_id: str
    queued: dict[str, tuple[str, int]] = {}
    running: list[str] = []
    done: list[str] = []


class QueueState(_Msg):
    """Admin: where many invocations' functions wait, in one message (the runtime's queue hinter
    sends what changed since its last one). ``heads[q]`` requests have left queue ``q`` so far, so
    ``t - heads[q]`` are ahead of ticket ``t``: a dispatch moves one head, not every waiter's
    position (``policy.storage.QueueBook``). Each entry replaces its invocation's hint, as a
    :class:`QueueHint` does; entries of invocations not open on the node are skipped."""

    entries: list[QueueEntry]
    heads: dict[str, int] = {}


class DedupHint(_Msg):
    """Admin: the worker process ``pid`` of ``workflow``/``function`` marked ``nbytes`` of its memory
    mergeable (:mod:`gfaas.dedup`); merge it with the other processes of sharing ``domain``. The
    runtime sends it, never function code: a function cannot pick its own domain."""

    pid: int
    workflow: str
    function: str
    domain: str
    nbytes: int


class DedupForget(_Msg):
    """Admin: the worker process ``pid`` stopped; its hints no longer hold the domain."""

    pid: int


class DedupStatus(_Msg):
    """Admin: the page-merging report (``gfaas dedup status``)."""


class Lease(_Msg):
    """Ask for a fresh slab to pack small objects into, plus a batch of IDs."""

    min_bytes: int


class MoreIds(_Msg):
    n: int


class Seal(_Msg):
    """Publish a small object written into the caller's slab. Sent without waiting for a reply."""

    id: bytes
    offset: int
    nbytes: int
    dtype: str
    shape: list[int]
    consumers: list[str] | None


class Allocate(_Msg):
    """Reserve space for an object the caller writes in place (state ``writing``)."""

    nbytes: int
    dtype: str
    shape: list[int]
    consumers: list[str] | None
    device: int = HOST  # >= 0: in the memory pool of that GPU


class SealAllocated(_Msg):
    id: bytes
    event: bytes = b""  # CUDA IPC event recorded after the producer's writes (device objects)


class SealWritten(_Msg):
    """Seal a host object the caller wrote in place after :class:`Allocate`. Sent without waiting for
    a reply, as :class:`Seal` is (an error comes back with the connection's next synchronous request)."""

    id: bytes


class Derive(_Msg):
    """Publish part of an object this connection read (a slice of an input) as a new object of its
    own, without copying: ``offset`` is relative to the start of ``segment``."""

    segment: int
    offset: int
    nbytes: int
    dtype: str
    shape: list[int]
    consumers: list[str] | None


class Get(_Msg):
    id: bytes
    expect_nbytes: int = -1  # >= 0: refuse (and do not count the read) unless the size matches
    device: int = ANY_DEVICE  # HOST or a GPU: deliver a copy there if the object lives elsewhere
    # Seconds the reader can wait for a delivery copy (its function's deadline, from the runtime's
    # SLO); 0: best effort. SLO-aware sharing (policy.bandwidth.slo_rates) orders copies by it.
    deadline_s: float = 0.0


class Delete(_Msg):
    id: bytes


class Consumed(_Msg):
    """The caller read these objects locally, from a slab it maps (see :mod:`.slabindex`): count
    the reads as a ``Get`` would. Sent without waiting for a reply."""

    ids: list[bytes]


class Sync(_Msg):
    """Answered with ``Ok``, or with the error of an asynchronous request sent before it (a client
    closing after asynchronous puts learns here whether they all went through)."""


class Release(_Msg):
    """The caller dropped its last view into these segments (one entry per pinned reply).
    Sent without waiting for a reply."""

    segments: list[int]


Request = (
    Hello
    | AdminHello
    | Attach
    | Bind
    | Unbind
    | OpenInvocation
    | EndInvocation
    | EndInvocations
    | Stats
    | Snapshot
    | ObjectInfo
    | QueueHint
    | QueueState
    | DedupHint
    | DedupForget
    | DedupStatus
    | Lease
    | MoreIds
    | Seal
    | Allocate
    | SealAllocated
    | SealWritten
    | Derive
    | Get
    | Delete
    | Release
    | Consumed
    | Sync
)


# ---- replies --------------------------------------------------------------------------------
class Welcome(_Msg):
    node_id: str
    invocation_id: str
    function: str
    functions: list[str]
    slab_bytes: int
    small_object_max: int
    capacity_bytes: int
    devices: list[int] = []  # GPUs with a memory pool on this node
    # A small put described in its slab's directory is sealed from there: send no Seal for it.
    directory_seals: bool = False


class Bound(_Msg):
    """A :class:`Bind` took effect: the connection now acts for ``function`` of ``invocation_id``.
    ``lease``: the slab it asked for (its descriptor travels with this reply), or None (not asked, or
    refused: the first small put leases one and reports why)."""

    invocation_id: str
    function: str
    functions: list[str]
    lease: Leased | None = None
    retired: list[int] = []
    located: list[Located] = []  # the prefetched objects that live on a GPU, as a Get would answer


class AdminWelcome(_Msg):
    node_id: str
    devices: list[int] = []  # GPUs with a memory pool on this node (what the runtime places GPU functions on)
    device_kind: str = ""  # "cuda" (real GPUs), "null" (modelled ones: no bytes, tests and simulation) or ""


class InvocationOpened(_Msg):
    invocation_id: str
    tokens: dict[str, str]


class Ended(_Msg):
    invocation_id: str
    freed: int


class EndedMany(_Msg):
    """The reply to :class:`EndInvocations`: objects freed per invocation ended (those that were open)."""

    freed: dict[str, int]


class StatsReply(_Msg):
    node_id: str
    objects: int
    writing: int
    bytes_reserved: int
    bytes_live: int
    capacity_bytes: int
    segments: int
    invocations: int
    connections: int
    lost: int
    bytes_pooled: int = 0
    segments_pooled: int = 0
    device_bytes_held: int = 0
    device_bytes_used: int = 0
    evictions: int = 0  # objects moved down a tier (GPU -> peer or host, host -> disk)
    restores: int = 0  # objects moved back up
    released_unread: int = 0  # objects dropped under pressure because none of their readers was left
    migrations: int = 0  # GPU evictions that went to a peer GPU
    bytes_spilled: int = 0  # bytes written to disk, in all
    bytes_restored: int = 0  # bytes read back from disk, in all
    queue_hints: int = 0  # queue hints received from the runtime, in all
    objects_on_disk: int = 0
    bytes_on_disk: int = 0
    pool_target: int = 0  # host tier: the demand target that bounds the warm cache
    device_pool_target: int = 0  # sum of the GPU pools' targets
    device_objects: int = 0  # objects written into a GPU pool, in all
    deliveries_to_device: int = 0  # copies onto a GPU for a reader there (host -> GPU, GPU -> GPU)
    deliveries_to_host: int = 0  # copies of GPU objects into host memory for a host reader
    bytes_delivered: int = 0  # bytes of those copies
    staged_for_transfer: int = 0  # GPU objects copied into host memory to be sent to another machine
    prefetched: int = 0  # GPU objects located with a task's Bind, so its get needed no round trip
    spills: int = 0  # segments written to disk, in all (each holds one or more of the objects evicted)
    bytes_host_direct: int = 0  # host <-> GPU bytes moved by one DMA from a registered node segment
    bytes_host_ring: int = 0  # host <-> GPU bytes staged through the pinned ring


class TierFigures(msgspec.Struct, array_like=True):
    """One storage tier in a :class:`SnapshotReply`: ``name`` is ``"host"``, ``"disk"`` or ``"gpu<k>"``.
    ``bytes_live``: bytes of the objects on it (being written or sealed); ``bytes_reserved``: memory
    (or disk) it holds for them, warm segments included; ``bytes_target``: the pool's demand target
    (0 for disk); ``capacity_bytes``: its cap (0: none); ``bytes_pooled``: of the reserved bytes,
    those held warm for reuse."""

    name: str
    bytes_live: int
    bytes_reserved: int
    bytes_target: int
    capacity_bytes: int
    objects: int
    bytes_pooled: int = 0


class SnapshotReply(_Msg):
    """The reply to :class:`Snapshot`. ``counters``: node totals since start (evictions, restores,
    spills, bytes_spilled, ...) and gauges (connections, invocations, writing); ``links``: bytes moved
    in all over each link (``h2d:gpu0``, ``d2h:gpu0``, ``peer:gpu0->gpu1``, ``disk-write``,
    ``disk-read``, ``net-in``, ``net-out``). Names are added over time: readers skip unknown ones."""

    node_id: str
    time: float  # the node's wall clock (time.time()) when it answered
    tiers: list[TierFigures]
    counters: dict[str, int]
    links: dict[str, int]


class ObjectInfoReply(_Msg):
    """The reply to :class:`ObjectInfo`. ``consumers`` None: any function of the invocation may read
    it; ``readers_left``: declared consumers that have not read it yet (None: not tracked)."""

    id: bytes
    invocation: str
    producer: str
    consumers: list[str] | None
    readers_left: list[str] | None
    nbytes: int
    dtype: str
    shape: list[int]
    state: str
    tier: str
    age_s: float


class Leased(_Msg):
    """A fresh slab: objects go in ``[offset, size)``; the slab's directory starts at ``size``.
    ``ids`` are every ID the connection now holds, ``ids[i]`` in directory slot ``first_slot + i``
    (``first_slot`` -1: the slab has no directory, so nothing of it is read locally)."""

    segment: int
    offset: int
    size: int
    ids: list[bytes]
    retired: list[int] = []
    first_slot: int = -1


class Ids(_Msg):
    ids: list[bytes]
    retired: list[int] = []
    first_slot: int = -1  # ids[i] has directory slot first_slot + i of the current slab (-1: none)


class Allocated(_Msg):
    id: bytes
    segment: int
    offset: int
    retired: list[int] = []
    pin: bool = False  # the segment may be reused: send Release when the last view is gone
    device: DeviceRef | None = None  # a device segment: map it through CUDA IPC
    gone: list[int] = []  # arenas returned to the device since: close their cached handles


class Derived(_Msg):
    id: bytes
    retired: list[int] = []


class Located(_Msg):
    id: bytes
    segment: int
    offset: int
    nbytes: int
    dtype: str
    shape: list[int]
    node: str
    retired: list[int] = []
    pin: bool = False  # the segment may be reused: send Release when the last view is gone
    device: DeviceRef | None = None
    event: bytes = b""  # wait on this CUDA IPC event before reading (the producer's writes)
    gone: list[int] = []
    # A slab mapped for the first time: [directory offset, slots]; its index travels as a second fd.
    local: list[int] = []
    # The connection's read log (slabindex.ReadLog) of this many IDs travels as the last fd.
    read_log: int = 0


class DedupReport(_Msg):
    """The merge controller's status as JSON (:meth:`gfaas.dedup.controller.MergeController.status`)."""

    report: bytes


class Ok(_Msg):
    retired: list[int] = []


class Error(_Msg):
    code: str
    message: str


Reply = (
    Welcome
    | Bound
    | AdminWelcome
    | InvocationOpened
    | Ended
    | EndedMany
    | StatsReply
    | SnapshotReply
    | ObjectInfoReply
    | Leased
    | Ids
    | Allocated
    | Derived
    | Located
    | DedupReport
    | Ok
    | Error
)

_enc = msgspec.msgpack.Encoder()
_req_dec = msgspec.msgpack.Decoder(Request)
_rep_dec = msgspec.msgpack.Decoder(Reply)

encode = _enc.encode


def decode_request(data: bytes) -> Request:
    """Decode one request frame or raise :class:`ProtocolError` saying what was wrong: a frame
    that is not exactly one request, or a field outside its range (:func:`check_request`)."""
    if len(data) > MAX_FRAME:
        raise ProtocolError(f"request frame of {len(data)} bytes exceeds the {MAX_FRAME}-byte limit")
    try:
        msg = _req_dec.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"malformed request frame ({len(data)} bytes): {exc}") from None
    check = _CHECKS.get(type(msg))
    if check is not None:
        check(msg)
    return msg


# ---- field ranges, checked before a request reaches any handler ----------------------------------
# Object IDs of the wrong length are answered by the store (InvalidDataRef, as for unknown ones),
# and so are ranges the store checks with the limits of this node (seals, leases, MoreIds, sizes).
MAX_EVENT_BYTES = 64  # a CUDA IPC event handle
_I64 = (1 << 63) - 1


def _range(msg: _Msg, name: str, lo: int, hi: int = _I64, what: str = "") -> None:
    v = getattr(msg, name)
    if not lo <= v <= hi:
        span = f">= {lo}" if hi == _I64 else f"{lo}..{hi}"
        raise ProtocolError(f"{type(msg).__name__}.{name}={v} is out of range: give {what or span}")


def _check_get(m: Get) -> None:
    _range(m, "device", ANY_DEVICE, what=f"{ANY_DEVICE} (wherever it lives), {HOST} (host memory) or a GPU"
           " ordinal >= 0")
    _range(m, "expect_nbytes", -1, what="the object's size in bytes, or -1 (any size)")


def _check_allocate(m: Allocate) -> None:
    _range(m, "device", HOST, what=f"{HOST} (host memory) or a GPU ordinal >= 0")


def _check_seal_allocated(m: SealAllocated) -> None:
    if len(m.event) > MAX_EVENT_BYTES:
        raise ProtocolError(f"SealAllocated.event has {len(m.event)} bytes; a CUDA IPC event has {MAX_EVENT_BYTES}")


def _check_derive(m: Derive) -> None:
    _range(m, "segment", 0)
    _range(m, "offset", 0)
    _range(m, "nbytes", 0)


_NAME_MAX = 128  # workflow, function and domain names (the spec allows fewer characters)


def _check_dedup_hint(m: DedupHint) -> None:
    _range(m, "pid", 1, (1 << 22), "a process id (1..4194304)")
    _range(m, "nbytes", 0)
    for name in ("workflow", "function", "domain"):
        v = getattr(m, name)
        if not v or len(v) > _NAME_MAX or not v.isprintable():
            raise ProtocolError(f"DedupHint.{name}={v[:40]!r} must be 1..{_NAME_MAX} printable characters")


def _check_release(m: Release) -> None:
    if any(not 0 <= x <= _I64 for x in m.segments):
        raise ProtocolError("Release.segments names a segment out of range; give the segment numbers of replies")


def _check_bind(m: Bind) -> None:
    _range(m, "lease", -1, what="-1 (no slab) or the size in bytes of the small objects the slab is for")
    _range(m, "ids", 0, 1024, "0 (the node's ids_per_lease) or 1..1024 IDs")


_CHECKS: dict[type, Callable[[Any], None]] = {
    Bind: _check_bind,
    Get: _check_get,
    Allocate: _check_allocate,
    SealAllocated: _check_seal_allocated,
    Derive: _check_derive,
    Release: _check_release,
    DedupHint: _check_dedup_hint,
    DedupForget: lambda m: _range(m, "pid", 1, (1 << 22), "a process id (1..4194304)"),
}


def decode_reply(data: bytes) -> Reply:
    try:
        return _rep_dec.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"malformed reply frame ({len(data)} bytes): {exc}") from None
