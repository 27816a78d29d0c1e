"""Small objects read without a round trip (``dataplane/slabindex.py``): only by their readers, only
while live, counted as reads, and never for IDs the daemon did not issue for that slot."""

from __future__ import annotations

import array
import os
import socket
from typing import Any

import numpy as np
import pytest

import gfaas
from gfaas import AccessDenied, AuthenticationError, DataDeleted, DataRef
from gfaas.dataplane import protocol as P
from gfaas.dataplane.slabindex import DIR, DIR_ENTRY

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


class Counting:
    """Counts the synchronous requests a client makes (what reaches the daemon and waits)."""

    def __init__(self, client: gfaas.Client) -> None:
        self.calls: list[str] = []
        real = client._ch.call

        def call(msg: Any) -> Any:
            self.calls.append(type(msg).__name__)
            return real(msg)

        client._ch.call = call  # type: ignore[method-assign]


def test_later_objects_of_a_slab_are_read_locally_and_counted(node) -> None:  # type: ignore[no-untyped-def]
    f, g = node.connect("f"), node.connect("g")
    refs = [f.put(np.arange(10, dtype=np.float32) + i, consumers=["g"]) for i in range(5)]
    counted = Counting(g)
    np.testing.assert_array_equal(g.get(refs[0]), np.arange(10, dtype=np.float32))  # maps the slab
    for i, r in enumerate(refs[1:], 1):
        v = g.get(r)
        np.testing.assert_array_equal(v, np.arange(10, dtype=np.float32) + i)
        assert not v.flags.writeable
    assert bytes(g.get(f.put(b"raw bytes", consumers=["g"]))) == b"raw bytes"
    assert counted.calls == ["Get"]  # one round trip, for the first object of the slab
    assert node.stats()["objects"] == 0  # every read counted: all freed
    with pytest.raises(DataDeleted):
        g.get(refs[3])  # a second read asks the daemon, which knows it was read


def test_a_function_that_is_not_a_reader_gets_access_denied(node) -> None:  # type: ignore[no-untyped-def]
    """h maps f's slab by reading an object open to everyone; f's object for g alone stays g's."""
    f, g, h = node.connect("f"), node.connect("g"), node.connect("h")
    shared = f.put(np.arange(3))
    only_g = f.put(np.arange(4), consumers=["g"])
    for_gh = f.put(np.arange(5), consumers=["g", "h"])
    np.testing.assert_array_equal(h.get(shared), np.arange(3))
    assert h._local  # h maps the slab now
    with pytest.raises(AccessDenied):
        h.get(only_g)
    np.testing.assert_array_equal(h.get(for_gh), np.arange(5))
    np.testing.assert_array_equal(g.get(only_g), np.arange(4))


def test_deleted_objects_and_ended_invocations_are_not_read_locally(node) -> None:  # type: ignore[no-untyped-def]
    f, g = node.connect("f"), node.connect("g")
    first = f.put(np.arange(3), consumers=["g"])
    doomed = f.put(np.arange(4), consumers=["g"])
    later = f.put(np.arange(5), consumers=["g"])
    g.get(first)
    f.delete(doomed)
    with pytest.raises(DataDeleted):
        g.get(doomed)
    node.admin.end_invocation(node.inv)
    with pytest.raises(AuthenticationError):
        g.get(later)
    assert g._local == {} and g._local_ids == {}  # nothing keeps the ended slab's mapping alive


def test_a_forged_directory_entry_is_not_read_locally(node) -> None:  # type: ignore[no-untyped-def]
    """A producer can describe only IDs issued for its own slab's slots: an entry naming another
    object's ID (or an ID nobody issued) is checked against the daemon's index and refused."""
    f, g, h = node.connect("f"), node.connect("g"), node.connect("h")
    theirs = h.put(np.full(4, 7, dtype=np.int64), consumers=["g"])  # h's object for g
    first = f.put(np.arange(3), consumers=["g"])
    g.get(first)  # g maps f's slab
    # f puts again, then overwrites that directory entry to claim h's ID for its own bytes.
    mine = f.put(np.zeros(4, dtype=np.int64), consumers=["g"])
    f._call(P.Sync())  # the daemon has sealed it from the directory: what f writes now is only for g
    mm = f._arena_map
    assert mm is not None
    at = next(f._dir_at + k * DIR_ENTRY for k in range(64)
              if DIR.unpack_from(mm, f._dir_at + k * DIR_ENTRY)[1] == mine.id)
    fields = list(DIR.unpack_from(mm, at))
    fields[1] = theirs.id
    DIR.pack_into(mm, at, *fields)
    np.testing.assert_array_equal(g.get(theirs), np.full(4, 7))  # h's bytes, from the daemon
    fields[1] = bytes(16)
    DIR.pack_into(mm, at, *fields)
    with pytest.raises(AccessDenied):
        g.get(DataRef(bytes(16), "n0"))


def test_a_failed_seal_surfaces_at_the_next_call_or_at_close(make_config, monkeypatch, thread_daemon) -> None:  # type: ignore[no-untyped-def]
    from gfaas.dataplane.store import Store

    cfg = make_config()
    with thread_daemon(cfg):
        admin = gfaas.Admin(cfg.socket_path, state_dir=cfg.state_dir)
        inv = admin.open_invocation("wf", ["f", "g"])
        f, g = gfaas.connect(inv.credentials("f")), gfaas.connect(inv.credentials("g"))
        a = f.put(np.arange(3), consumers=["g"])
        np.testing.assert_array_equal(g.get(a), np.arange(3))

        def refuse(self, s, *args, **kw):  # type: ignore[no-untyped-def]
            raise gfaas.ConfigError("injected refusal")

        monkeypatch.setattr(Store, "seal_small", refuse)
        f.put(np.arange(4), consumers=["g"])
        with pytest.raises(gfaas.ConfigError, match="injected refusal"):
            f.close()  # the put did not go through: close says so
        f2 = gfaas.connect(inv.credentials("f"))
        f2.put(np.arange(5))
        with pytest.raises(gfaas.ConfigError, match="injected refusal"):
            f2.get(a)  # a get right after a put asks the daemon, so the failure surfaces there
        monkeypatch.undo()
        f2.close()
        g.close()
        admin.close()


class Raw:
    """A bare connection to the daemon (descriptors it is sent are closed)."""

    def __init__(self, path: str) -> None:
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.s.settimeout(5)
        self.s.connect(path)

    def send(self, msg: P._Msg) -> None:
        self.s.send(P.encode(msg))

    def call(self, msg: P._Msg) -> P.Reply:
        self.send(msg)
        data, anc, _, _ = self.s.recvmsg(P.MAX_FRAME, socket.CMSG_SPACE(16))
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                for fd in array.array("i", payload[: len(payload) - len(payload) % 4]):
                    os.close(fd)
        return P.decode_reply(data)


def test_reads_arriving_before_their_seal_are_counted_when_it_arrives(node) -> None:  # type: ignore[no-untyped-def]
    """A Consumed for an object whose seal is not in yet (the consumer was quicker than the daemon)
    is counted once the seal is handled, so the object is still freed."""
    raw = lambda: Raw(node.config.socket_path)  # noqa: E731
    f = raw()
    assert isinstance(f.call(P.Hello(node.inv.tokens["f"])), P.Welcome)
    leased = f.call(P.Lease(64))
    assert isinstance(leased, P.Leased)
    g = raw()
    assert isinstance(g.call(P.Hello(node.inv.tokens["g"])), P.Welcome)
    oid = leased.ids[0]
    g.send(P.Consumed([oid]))
    assert isinstance(g.call(P.Sync()), P.Ok)
    f.send(P.Seal(oid, 0, 8, "raw", [8], ["g"]))
    assert isinstance(f.call(P.Sync()), P.Ok)
    assert node.stats()["objects"] == 0


def test_a_directory_entry_for_an_id_not_issued_is_refused_at_the_next_call(node) -> None:  # type: ignore[no-untyped-def]
    """The daemon seals from a directory only IDs it issued for that slot: a made-up ID (or one used
    twice) publishes nothing and the producer hears of it at its next call."""
    f, g = node.connect("f"), node.connect("g")
    if not f._directory_seals:
        pytest.skip("this daemon takes Seal messages")
    ref = f.put(np.arange(3), consumers=["g"])
    f._call(P.Sync())
    mm = f._arena_map
    assert mm is not None
    slot = next(k for k in range(64) if DIR.unpack_from(mm, f._dir_at + k * DIR_ENTRY)[1] == ref.id)
    fields = list(DIR.unpack_from(mm, f._dir_at + slot * DIR_ENTRY))
    forged = os.urandom(16)
    fields[1], fields[-1] = forged, fields[-1] + 64
    DIR.pack_into(mm, f._dir_at + (slot + 1) * DIR_ENTRY, *fields)  # the next slot, a made-up ID
    with pytest.raises(gfaas.InvalidDataRef, match="not issued for it"):
        f._call(P.Sync())
    with pytest.raises(AccessDenied):
        g.get(DataRef(forged, "n0"))
    np.testing.assert_array_equal(g.get(ref), np.arange(3))


def test_a_producer_that_exits_right_after_its_puts_loses_nothing(node) -> None:  # type: ignore[no-untyped-def]
    f, g = gfaas.connect(node.credentials("f")), node.connect("g")
    refs = [f.put(np.arange(i + 1), consumers=["g"]) for i in range(3)]
    f._ch.close()  # gone without a word: no Sync, no message
    for i, r in enumerate(refs):
        np.testing.assert_array_equal(g.get(r), np.arange(i + 1))
    assert node.stats()["objects"] == 0
