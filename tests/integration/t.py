"""Warm reuse of large-object segments, and the view pins that keep it safe."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from gfaas import ConfigError, DataDeleted
from gfaas.config import KiB

BIG = 512 * KiB  # above small_object_max (128 KiB): a segment of its own


def _cycle(prod, cons, value: int, keep: bool = False):  # type: ignore[no-untyped-def]
    ref = prod.put(np.full(BIG, value, np.uint8), consumers=["g"])
    view = cons.get(ref)
    assert int(view[0]) == value and int(view[-1]) == value
    return view if keep else None


def test_segments_are_reused_once_views_are_gone(node) -> None:  # type: ignore[no-untyped-def]
    """A stream of same-size objects cycles through a bounded set of warm segments."""
    prod, cons = node.connect("f"), node.connect("g")
    for i in range(20):
        _cycle(prod, cons, i)
    st = node.stats()
    assert st["objects"] == 0
    # Releases travel with each side's next request, so at most a few segments are in flight.
    assert st["segments"] <= 3 and st["bytes_reserved"] <= 3 * BIG, st


def test_a_live_view_is_never_overwritten(node) -> None:  # type: ignore[no-untyped-def]
    """While a consumer holds a view of a freed object, its segment is not handed out again."""
    prod, cons = node.connect("f"), node.connect("g")
    kept = _cycle(prod, cons, 7, keep=True)
    derived = kept[10:20]  # a derived view keeps the pin too
    del kept
    gc.collect()
    for i in range(10):
        _cycle(prod, cons, 100 + i)
    assert np.all(derived == 7)
    assert node.stats()["objects"] == 0


def test_released_view_lets_the_segment_back(node) -> None:  # type: ignore[no-untyped-def]
    """Dropping the last view (and making any request) returns the segment to the warm pool."""
    prod, cons = node.connect("f"), node.connect("g")
    kept = _cycle(prod, cons, 1, keep=True)
    prod.put(b"x")  # the producer's own release of its write buffer travels with this put
    before = node.stats()
    assert before["bytes_pooled"] == 0  # parked: the consumer still holds a view
    del kept
    gc.collect()
    cons.put(b"y")  # carries the consumer's release
    node.stats()  # a round trip after the asynchronous messages
    assert node.stats()["bytes_pooled"] >= BIG


def test_copy_get_releases_at_once(node) -> None:  # type: ignore[no-untyped-def]
    """get(copy=True) holds no pin after it returns; the copy is private and writable."""
    prod, cons = node.connect("f"), node.connect("g")
    ref = prod.put(np.full(BIG, 5, np.uint8), consumers=["g"])
    out = cons.get(ref, copy=True)
    out[:] = 0
    prod.put(b"x")
    cons.put(b"y")
    st = node.stats()
    assert st["bytes_pooled"] >= BIG and st["objects"] == 2


def test_disconnect_releases_pins(node) -> None:  # type: ignore[no-untyped-def]
    """A consumer that goes away holding views does not keep segments parked forever."""
    prod, cons = node.connect("f"), node.connect("g")
    kept = _cycle(prod, cons, 3, keep=True)
    prod.put(b"x")
    assert node.stats()["bytes_pooled"] == 0
    cons.close()
    assert int(kept[0]) == 3  # the mapping outlives the connection
    node.stats()
    assert node.stats()["bytes_pooled"] >= BIG


def test_end_invocation_returns_warm_segments(node) -> None:  # type: ignore[no-untyped-def]
    """Ending the invocation frees pooled and parked segments: the pool is back to zero."""
    prod, cons = node.connect("f"), node.connect("g")
    kept = _cycle(prod, cons, 9, keep=True)
    for i in range(3):
        _cycle(prod, cons, i)
    node.admin.end_invocation(node.inv)
    st = node.stats()
    assert (st["segments"], st["bytes_reserved"], st["bytes_pooled"]) == (0, 0, 0)
    assert int(kept[0]) == 9  # still readable: retired memory lives on until the view goes


def test_get_into_a_caller_buffer(node) -> None:  # type: ignore[no-untyped-def]
    """get(out=buf) fills the caller's buffer; a wrong size is refused without counting the read."""
    prod, cons = node.connect("f"), node.connect("g")
    x = np.arange(BIG // 4, dtype=np.float32)
    ref = prod.put(x, consumers=["g"])
    small = np.empty(10, np.float32)
    with pytest.raises(ConfigError, match=f"buffer of 40 bytes, but object {ref.id.hex()} has {BIG}"):
        cons.get(ref, out=small)
    with pytest.raises(ConfigError, match="read-only"):
        cons.get(ref, out=b"\0" * BIG)
    buf = np.zeros(BIG // 4, np.float32)
    assert cons.get(ref, out=buf) is buf and np.array_equal(buf, x)
    with pytest.raises(DataDeleted):  # that read was the one counted
        cons.get(ref)
    r2 = prod.put(b"abc", consumers=["g"])
    ba = bytearray(3)
    cons.get(r2, out=ba)
    assert ba == b"abc"


def test_protocol_version_mismatch_is_refused(node) -> None:  # type: ignore[no-untyped-def]
    """A client of another protocol version is told which versions differ, and nothing is bound."""
    import socket

    from gfaas.dataplane import protocol as P

    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(node.config.socket_path)
    s.send(P.encode(P.Hello(node.inv.tokens["f"], version=P.PROTOCOL_VERSION + 1)))
    reply = P.decode_reply(s.recv(65536))
    assert isinstance(reply, P.Error) and reply.code == "ProtocolError"
    assert f"protocol version {P.PROTOCOL_VERSION + 1}, this daemon {P.PROTOCOL_VERSION}" in reply.message
    s.send(P.encode(P.Get(b"\0" * 16)))
    reply = P.decode_reply(s.recv(65536))
    assert isinstance(reply, P.Error) and reply.code == "AuthenticationError"
    s.close()


def test_reading_the_last_object_of_a_closed_slab_on_a_mapped_connection(node) -> None:  # type: ignore[no-untyped-def]
    """The get that frees a slab's last object is answered with that slab retired in the same
    reply; the reader already holds its mapping and must still read the object through it."""
    prod = node.connect("f")
    a = prod.put(np.arange(10.0), consumers=["g"])
    b = prod.put(np.int64(9), consumers=["g"])
    prod.close()  # the producer's slab closes: it retires when its last object is read
    cons = node.connect("g")
    assert np.array_equal(cons.get(a, copy=True), np.arange(10.0))  # maps the slab
    last = cons.get(b)  # frees the slab's last object: the reply says the segment retired
    assert last.shape == () and int(last) == 9
    assert node.stats()["objects"] == 0
    cons.put(b"z")  # the connection goes on working after the retirement
