"""Wire protocol decoding: exactly the declared message types, anything else is a ProtocolError."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gfaas import ProtocolError
from gfaas.dataplane import protocol as P

OID = bytes(range(16))

REQUESTS = [
    P.Hello("t" * 32),
    P.AdminHello("a" * 32, 1),
    P.Attach("a" * 32),
    P.Bind("t" * 32),
    P.Bind("t" * 32, 0, 2),
    P.Unbind(),
    P.OpenInvocation("wf", ["f", "g"], None, None),
    P.OpenInvocation("wf", ["f"], "0" * 32, {"f": "1" * 32}),
    P.EndInvocation("0" * 32),
    P.EndInvocations(["0" * 32, "1" * 32]),
    P.Stats(),
    P.Snapshot(),
    P.ObjectInfo(OID),
    P.Lease(100),
    P.MoreIds(64),
    P.Seal(OID, 64, 40, "<f4", [10], ["g"]),
    P.Seal(OID, 0, 0, "raw", [0], None),
    P.Allocate(1 << 20, "<f8", [128, 1024], None),
    P.SealAllocated(OID),
    P.SealWritten(OID),
    P.Derive(3, 64, 16, "<f4", [4], ["g"]),
    P.Get(OID),
    P.Delete(OID),
    P.Release([1, 2, 2]),
    P.Consumed([OID, OID]),
    P.Sync(),
    P.QueueHint("0" * 32, {"f": 0, "g": 3}),
    P.QueueHint("0" * 32, {}, ["f"]),
    P.QueueState([P.QueueEntry("0" * 32, {"f": ("wf/f", 12)}, ["g"], ["h"]), P.QueueEntry("1" * 32)], {"wf/f": 10}),
    P.DedupHint(4242, "wf", "f", "wf", 1 << 20),
    P.DedupForget(4242),
    P.DedupStatus(),
]

REPLIES = [
    P.Welcome("n0", "0" * 32, "f", ["f", "g"], 1 << 20, 1 << 18, 1 << 30),
    P.AdminWelcome("n0"),
    P.Bound("0" * 32, "f", ["f", "g"]),
    P.Bound("0" * 32, "f", ["f", "g"], P.Leased(1, 0, 1 << 20, [OID], [], 0), [3]),
    P.InvocationOpened("0" * 32, {"f": "1" * 32}),
    P.Ended("0" * 32, 3),
    P.EndedMany({"0" * 32: 3}),
    P.StatsReply("n0", 1, 0, 4096, 100, 1 << 30, 1, 1, 2, 0),
    P.SnapshotReply("n0", 1.5, [P.TierFigures("host", 100, 4096, 0, 1 << 30, 1, 0)], {"evictions": 2},
                    {"net-in": 7}),
    P.ObjectInfoReply(OID, "0" * 32, "f", ["g"], ["g"], 40, "<f4", [10], "sealed", "host", 0.5),
    P.ObjectInfoReply(OID, "0" * 32, "f", None, None, 0, "raw", [0], "writing", "gpu1", 0.0),
    P.DedupReport(b'{"processes": []}'),
    P.Leased(1, 0, 1 << 20, [OID], [3]),
    P.Leased(1, 0, 1 << 20, [OID, OID], [], 7),
    P.Ids([OID, OID]),
    P.Ids([OID], [], 3),
    P.Allocated(OID, 2, 0),
    P.Derived(OID),
    P.Located(OID, 2, 64, 40, "<f4", [10], "n0", []),
    P.Located(OID, 2, 64, 40, "<f4", [10], "n0", local=[1 << 20, 1024]),
    P.Ok([1, 2]),
    P.Error("AccessDenied", "no"),
]


@pytest.mark.parametrize("msg", REQUESTS, ids=lambda m: type(m).__name__)
def test_every_request_round_trips(msg: P._Msg) -> None:
    """Each request type encodes to one frame that decodes back to an equal message."""
    data = P.encode(msg)
    assert len(data) <= P.MAX_FRAME
    assert P.decode_request(data) == msg


@pytest.mark.parametrize("msg", REPLIES, ids=lambda m: type(m).__name__)
def test_every_reply_round_trips(msg: P._Msg) -> None:
    """Each reply type encodes and decodes back to an equal message."""
    assert P.decode_reply(P.encode(msg)) == msg


def test_request_and_reply_types_are_pinned() -> None:
    """The request and reply unions are exactly these types (adding one is a deliberate protocol change)."""
    import typing

    assert sorted(t.__name__ for t in typing.get_args(P.Request)) == [
        "AdminHello", "Allocate", "Attach", "Bind", "Consumed", "DedupForget", "DedupHint", "DedupStatus", "Delete",
        "Derive", "EndInvocation", "EndInvocations", "Get", "Hello", "Lease", "MoreIds", "ObjectInfo",
        "OpenInvocation", "QueueHint", "QueueState", "Release", "Seal", "SealAllocated", "SealWritten", "Snapshot",
        "Stats", "Sync", "Unbind"]
    assert sorted(t.__name__ for t in typing.get_args(P.Reply)) == [
        "AdminWelcome", "Allocated", "Bound", "DedupReport", "Derived", "Ended", "EndedMany", "Error", "Ids",
        "InvocationOpened", "Leased", "Located", "ObjectInfoReply", "Ok", "SnapshotReply", "StatsReply", "Welcome"]
    assert {type(m).__name__ for m in REQUESTS} == {t.__name__ for t in typing.get_args(P.Request)}
    assert {type(m).__name__ for m in REPLIES} == {t.__name__ for t in typing.get_args(P.Reply)}


def test_frames_are_tagged_arrays() -> None:
    """The wire form is a MessagePack array whose first element is the message type's name."""
    assert msgspec.msgpack.decode(P.encode(P.Get(OID)))[:2] == ["Get", OID]
    assert msgspec.msgpack.decode(P.encode(P.Stats())) == ["Stats"]


@pytest.mark.parametrize("msg", REPLIES, ids=lambda m: type(m).__name__)
def test_replies_are_not_requests(msg: P._Msg) -> None:
    """A reply type sent to the daemon is rejected (the request union is closed)."""
    with pytest.raises(ProtocolError, match="malformed request frame"):
        P.decode_request(P.encode(msg))


@pytest.mark.parametrize(
    "obj",
    [
        ["Get", 123],  # wrong field type
        ["QueueHint", "0" * 32, {"f": "1"}],  # a position that is not an int
        ["QueueHint", "0" * 32, [["f", 1]]],  # positions not a map
        ["QueueHint", "0" * 32, {"f": 1}, "f"],  # done not a list
        ["QueueState", [["0" * 32, {"f": ["q", "1"]}]]],  # a ticket that is not an int
        ["QueueState", [["0" * 32, {"f": 1}]]],  # a ticket without its queue
        ["QueueState", [], {"q": 1.5}],  # a head that is not an int
        ["Get", "0" * 16],  # str instead of bytes
        ["Get"],  # missing field
        ["Nope", OID],  # unknown tag
        ["Lease", True],  # bool is not an int
        ["Lease", 1.5],
        ["Seal", OID, 0, 8, "raw", [8.0], None],
        ["Seal", OID, 0, 8, "raw", "8", None],
        ["Seal", OID, 0, 8, "raw", [8], "g"],
        ["OpenInvocation", "wf", "f"],
        ["OpenInvocation", "wf", ["f"], None, {"f": 1}],
        ["Hello", None],
        ["Bind", None],  # a token that is not a string
        ["Bind", "t", "0"],
        {"type": "Get", "id": OID},  # map instead of array
        "Get",
        42,
        None,
        [],
        [None],
    ],
)
def test_valid_msgpack_of_the_wrong_shape_is_rejected(obj: object) -> None:
    """Well-formed MessagePack that is not exactly a request type raises ProtocolError."""
    with pytest.raises(ProtocolError, match="malformed request frame"):
        P.decode_request(msgspec.msgpack.encode(obj))


@pytest.mark.parametrize("cut", [1, 2, 5, 10, 20])
def test_truncated_frames_are_rejected(cut: int) -> None:
    """A valid Seal frame cut short anywhere raises ProtocolError."""
    data = P.encode(P.Seal(OID, 64, 40, "<f4", [10], ["g"]))
    assert cut < len(data)
    with pytest.raises(ProtocolError, match=f"malformed request frame \\({cut} bytes\\)"):
        P.decode_request(data[:cut])


def test_trailing_garbage_is_rejected() -> None:
    """Bytes after a complete message make the frame invalid."""
    with pytest.raises(ProtocolError):
        P.decode_request(P.encode(P.Stats()) + b"\x00")


@pytest.mark.parametrize("data", [b"\x91\xa1\x80", b"\x92\xa3Get\xa1\xff", b"\xa2\xc3\x28"])
def test_invalid_utf8_is_a_protocol_error(data: bytes) -> None:
    """Strings that are not UTF-8 (in the tag or a field) raise ProtocolError, not UnicodeDecodeError."""
    with pytest.raises(ProtocolError, match="malformed request frame"):
        P.decode_request(data)
    with pytest.raises(ProtocolError, match="malformed reply frame"):
        P.decode_reply(data)


def test_empty_frame_is_rejected() -> None:
    """An empty frame is not a message."""
    with pytest.raises(ProtocolError, match=r"\(0 bytes\)"):
        P.decode_request(b"")


def test_oversize_frames_are_rejected_before_decoding() -> None:
    """A frame over 64 KiB is refused naming its size, even if it would decode."""
    big = P.encode(P.OpenInvocation("wf", ["f" * 60] * 1200, None, None))
    assert len(big) > P.MAX_FRAME
    with pytest.raises(ProtocolError, match=f"request frame of {len(big)} bytes exceeds the 65536-byte limit"):
        P.decode_request(big)
    with pytest.raises(ProtocolError, match="exceeds"):
        P.decode_request(b"\x00" * (P.MAX_FRAME + 1))
    assert P.decode_request(P.encode(P.Stats())) == P.Stats()  # a small frame still decodes


def test_max_frame_is_64_kib() -> None:
    """The frame limit is 64 KiB."""
    assert P.MAX_FRAME == 65536


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=256))
def test_random_bytes_raise_only_protocol_error(data: bytes) -> None:
    """Random bytes decode to a request or raise ProtocolError, never anything else."""
    try:
        msg = P.decode_request(data)
    except ProtocolError:
        return
    assert isinstance(msg, P._Msg)


_mp = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
_tags = st.sampled_from(["Hello", "AdminHello", "OpenInvocation", "EndInvocation", "Stats", "Lease", "MoreIds",
                         "Seal", "Allocate", "SealAllocated", "Get", "Delete", "Release", "Ok", "Error", "x"])


@settings(max_examples=200, deadline=None)
@given(_tags, st.lists(_mp, max_size=8))
def test_random_tagged_arrays_raise_only_protocol_error(tag: str, fields: list[object]) -> None:
    """Arrays with a (mostly valid) tag and random fields decode or raise ProtocolError only."""
    data = msgspec.msgpack.encode([tag, *fields])
    try:
        msg = P.decode_request(data)
    except ProtocolError:
        return
    assert type(msg).__name__ == tag


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=256))
def test_random_reply_bytes_raise_only_protocol_error(data: bytes) -> None:
    """The client's reply decoder is equally strict: random bytes give ProtocolError or a reply."""
    try:
        P.decode_reply(data)
    except ProtocolError:
        pass


@pytest.mark.parametrize(("msg", "field"), [(P.Bind("t", -2), "lease"), (P.Bind("t", 0, -1), "ids"),
                                            (P.Bind("t", 0, 1025), "ids")])
def test_bind_fields_out_of_range_are_refused_naming_the_field(msg: P.Bind, field: str) -> None:
    """A Bind asking for a slab of negative size, or a negative or huge ID batch, is a ProtocolError
    naming the field and the range, before any handler."""
    with pytest.raises(ProtocolError, match=f"Bind.{field}=-?\\d+ is out of range: give"):
        P.decode_request(P.encode(msg))
