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


def test_warm_segments_serve_the_workflows_next_invocation(node) -> None:  # type: ignore[no-untyped-def]
    """Ending the invocation keeps its free segments warm; the workflow's next invocation reuses
    them (no new segment), while a parked one stays untouched until its view is gone."""
    prod, cons = node.connect("f"), node.connect("g")
    kept = _cycle(prod, cons, 9, keep=True)
    for i in range(3):
        _cycle(prod, cons, i)
    prod.put(b"x")  # carries the producer's releases
    node.admin.end_invocation(node.inv)
    st = node.stats()
    assert st["objects"] == 0 and st["segments_pooled"] >= 1 and st["bytes_pooled"] >= BIG
    warm = st["segments"]
    inv = node.open()
    p2, c2 = node.connect("f", inv), node.connect("g", inv)
    for i in range(5):
        _cycle(p2, c2, 50 + i)
    assert node.stats()["segments"] <= warm + 1
    assert int(kept[0]) == 9 and int(kept[-1]) == 9  # the parked segment was never handed out


@pytest.mark.node_config(seal_writes=True)
def test_warm_segments_serve_only_the_connection_that_wrote_them(node) -> None:  # type: ignore[no-untyped-def]
    """With seal_writes, a freed segment's writes are sealed, so only the connection holding its pre-seal mapping
    reuses it: ending the invocation returns its warm segments, the next invocation gets fresh
    ones (then reuses those), and a parked one stays untouched until its view is gone."""
    prod, cons = node.connect("f"), node.connect("g")
    kept = _cycle(prod, cons, 9, keep=True)
    for i in range(3):
        _cycle(prod, cons, i)
    assert node.stats()["segments_pooled"] >= 1
    prod.put(b"x")  # carries the producer's releases
    node.admin.end_invocation(node.inv)
    st = node.stats()
    assert st["objects"] == 0 and st["segments_pooled"] == 0
    base = st["segments"]
    inv = node.open()
    p2, c2 = node.connect("f", inv), node.connect("g", inv)
    for i in range(5):
        _cycle(p2, c2, 50 + i)
    assert node.stats()["segments"] <= base + 2  # one fresh segment, reused by its connection
    assert int(kept[0]) == 9 and int(kept[-1]) == 9  # the parked segment was never handed out


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
    b = prod.put(np.array(9), consumers=["g"])
    prod.close()  # the producer's slab closes: it retires when its last object is read
    cons = node.connect("g")
    assert np.array_equal(cons.get(a, copy=True), np.arange(10.0))  # maps the slab
    last = cons.get(b)  # frees the slab's last object: the reply says the segment retired
    assert last.shape == () and int(last) == 9
    assert node.stats()["objects"] == 0
    cons.put(b"z")  # the connection goes on working after the retirement


def test_put_of_a_slice_of_an_input_is_zero_copy(node) -> None:  # type: ignore[no-untyped-def]
    """A function that forwards chunks of an object it read (video's split) stores them by
    reference: no new segment, the consumer reads the right bytes, and the chunks outlive the
    parent being freed."""
    prod, mid, cons = node.connect("f"), node.connect("g"), node.connect("h")
    clip = np.arange(4 * BIG // 8, dtype=np.float64).reshape(4, -1)
    ref = prod.put(clip, consumers=["g"])
    view = mid.get(ref)  # its only consumer has read it: the parent object is freed now
    before = node.stats()
    parts = [mid.put(c, consumers=["h"]) for c in np.array_split(view, 2)]
    after = node.stats()
    assert after["segments"] == before["segments"] and after["bytes_reserved"] == before["bytes_reserved"]
    assert after["objects"] == 2 and after["bytes_live"] == clip.nbytes
    del view
    gc.collect()
    mid.delete(mid.put(b"x"))  # carries the release: the chunks alone keep the segment
    for i, p in enumerate(parts):
        got = cons.get(p, copy=True)
        assert got.shape == (2, clip.shape[1]) and np.array_equal(got, clip[2 * i : 2 * i + 2])
    assert node.stats()["objects"] == 0


def test_slices_of_other_memory_and_released_views_are_copied(node) -> None:  # type: ignore[no-untyped-def]
    """Arrays that are not inside a held view are stored by copy, even if they once were."""
    prod, mid, cons = node.connect("f"), node.connect("g"), node.connect("h")
    ref = prod.put(np.full(BIG, 5, np.uint8), consumers=["g"])
    copy = np.array(mid.get(ref))  # a private copy; the view died at once
    gc.collect()
    before = node.stats()["segments"]
    r2 = mid.put(copy[: BIG // 2], consumers=["h"])
    assert node.stats()["segments"] == before + 1
    assert np.array_equal(cons.get(r2, copy=True), np.full(BIG // 2, 5, np.uint8))


def test_derive_outside_a_held_object_is_refused(node) -> None:  # type: ignore[no-untyped-def]
    """A forged Derive (a segment never read, or bytes past the object) is AccessDenied."""
    from gfaas import AccessDenied
    from gfaas.dataplane import protocol as P

    prod, mid = node.connect("f"), node.connect("g")
    ref = prod.put(np.zeros(BIG, np.uint8), consumers=["g", "h"])
    view = mid.get(ref)
    seg = next(iter(mid._read))
    with pytest.raises(AccessDenied, match="outside the object"):
        mid._call(P.Derive(seg, BIG - 8, 16, "|u1", [16], None))
    with pytest.raises(AccessDenied, match="holds no view"):
        prod._call(P.Derive(seg, 0, 16, "|u1", [16], None))  # the producer never got it
    with pytest.raises(AccessDenied, match="holds no view"):
        mid._call(P.Derive(seg + 1000, 0, 16, "|u1", [16], None))
    assert int(view[0]) == 0
