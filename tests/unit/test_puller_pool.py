"""dataplane.puller: a pull does not wait for the owner's confirmation that it counted the read.

The connection goes back to the pool owing that ``Consumed`` frame, and the next pull on it reads
it first (``Puller._settle``): a confirmed connection is reused with the stream in step, a refused
count is logged and the connection dropped, and one whose owner never confirms is not reused."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from gfaas.dataplane.puller import Puller
from gfaas.dataplane.transfer_wire import Consumed, Fail, Pull, encode_frame, read_frame, to_owner


@pytest.fixture
def puller() -> Iterator[Puller]:
    config = SimpleNamespace(node_id="m2", remote_timeout_s=0.3)
    p = Puller(config, None, None, None)  # type: ignore[arg-type]  # only the pool is exercised
    yield p
    p.stop()


def _pooled(p: Puller, hexid: str) -> socket.socket:
    """A connection to owner m1 in ``p``'s pool, owing the confirmation of ``hexid``; the owner's end."""
    ours, owner = socket.socketpair()
    p._checkin("m1", "10.0.0.1:7000", ours, hexid)
    return owner


def test_a_confirmed_connection_is_reused_with_the_stream_in_step(puller: Puller) -> None:
    owner = _pooled(puller, "aa")
    owner.sendall(encode_frame(Consumed()))  # what the owner sends once it counted the earlier read
    sock = puller._checkout("m1", "10.0.0.1:7000")
    assert sock is not None
    sock.sendall(encode_frame(Pull(b"\x01" * 16, "inv", "fn")))  # the next pull's first frame ...
    got = read_frame(owner, to_owner)
    assert isinstance(got, Pull) and got.function == "fn"  # ... arrives intact
    sock.close()
    owner.close()


def test_a_refused_count_is_logged_and_the_connection_dropped(puller: Puller, caplog: pytest.LogCaptureFixture) -> None:
    owner = _pooled(puller, "bb")
    owner.sendall(encode_frame(Fail("data_deleted", "freed meanwhile")))
    with caplog.at_level(logging.WARNING, logger="gfaas.dataplane.remote"):
        assert puller._checkout("m1", "10.0.0.1:7000") is None
    assert "could not count the read of bb: freed meanwhile" in caplog.text
    assert owner.recv(1) == b""  # the puller closed its end
    owner.close()


def test_an_owner_that_never_confirms_is_not_reused(puller: Puller, caplog: pytest.LogCaptureFixture) -> None:
    owner = _pooled(puller, "cc")
    good = _pooled(puller, "dd")
    good.sendall(encode_frame(Consumed()))
    # the newest pooled connection is tried first: dd is confirmed, so it is the one handed out
    sock = puller._checkout("m1", "10.0.0.1:7000")
    assert sock is not None
    sock.close()
    with caplog.at_level(logging.WARNING, logger="gfaas.dataplane.remote"):
        assert puller._checkout("m1", "10.0.0.1:7000") is None  # cc: nothing within remote_timeout_s
    assert "no confirmation from node m1 for the read of cc" in caplog.text
    for s in (owner, good):
        s.close()
