"""Attached connections (issue 23, item 1): one long-lived daemon connection serves many tasks, each
bound to its own (invocation, function) by ``Bind`` and ended by ``Unbind``, with today's access checks
per binding; the platform's ``Attach`` is proved with the admin token."""

from __future__ import annotations

import array
import gc
import os
import socket
import time
from typing import Any

import numpy as np
import pytest

from gfaas import AccessDenied, AuthenticationError, ProtocolError
from gfaas.dataplane import protocol as P
from gfaas.dataplane.client import Binder, Client
from gfaas.errors import DataLost

pytestmark = pytest.mark.timeout(60)


class Raw:
    """A bare connection that sends any request and reads replies one by one (what an attacker holds)."""

    def __init__(self, path: str, sock: socket.socket | None = None) -> None:
        if sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            sock.connect(path)
        sock.settimeout(10)
        self.s = sock
        self.fds: list[int] = []

    def send(self, msg: P._Msg) -> None:
        self.s.send(P.encode(msg))

    def recv(self) -> P.Reply:
        data, anc, _, _ = self.s.recvmsg(P.MAX_FRAME, socket.CMSG_SPACE(64))
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                self.fds += list(array.array("i", payload[: len(payload) - len(payload) % 4]))
        return P.decode_reply(data)

    def call(self, msg: P._Msg) -> P.Reply:
        self.send(msg)
        return self.recv()

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.s.close()


def admin_token(node: Any) -> str:
    with open(os.path.join(node.config.state_dir, "admin.token")) as fh:
        return fh.read().strip()


def attached(node: Any) -> Raw:
    raw = Raw(node.config.socket_path)
    w = raw.call(P.Attach(admin_token(node)))
    assert isinstance(w, P.Welcome) and (w.invocation_id, w.function, w.functions) == ("", "", [])
    return raw


def spy_requests(c: Any) -> tuple[list[str], socket.socket]:
    """Record the type of every request ``c`` sends from now on (in ``sent``); returns it and the real
    socket to put back."""
    sent: list[str] = []
    real = c._ch.sock

    class Spy:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def send(self, data: bytes, *flags: int) -> int:
            sent.append(type(P.decode_request(data)).__name__)
            return real.send(data, *flags)

    c._ch.sock = Spy()
    return sent, real


def test_attach_needs_the_admin_token_and_gives_no_admin_rights(node: Any) -> None:
    """Attach with a function token or a wrong one is refused; an attached connection cannot open
    invocations or read statistics (the admin's requests)."""
    raw = Raw(node.config.socket_path)
    r = raw.call(P.Attach(node.inv.tokens["f"]))
    assert isinstance(r, P.Error) and r.code == "AuthenticationError" and "wrong admin token for Attach" in r.message
    raw.close()
    raw = attached(node)
    for msg in (P.OpenInvocation("wf", ["f"]), P.Stats(), P.EndInvocation(node.inv.id)):
        r = raw.call(msg)
        assert isinstance(r, P.Error) and r.code == "AuthenticationError", r
        assert "needs the node's admin token" in r.message
    r = raw.call(P.Get(bytes(16)))  # and no function credentials before a Bind
    assert isinstance(r, P.Error) and r.code == "AuthenticationError" and "never given any (Bind)" in r.message
    raw.close()


@pytest.mark.node_config(hello_timeout_s=0.3)
def test_an_attached_connection_outlives_the_hello_deadline_a_bare_one_does_not(node: Any) -> None:
    """An attached connection without credentials is not dropped at the Hello deadline (a warm worker
    waits for tasks), while a connection that said nothing is."""
    raw, bare = attached(node), Raw(node.config.socket_path)
    time.sleep(0.8)
    assert isinstance(raw.call(P.Bind(node.inv.tokens["f"])), P.Bound)
    r = bare.recv()
    assert isinstance(r, P.Error) and r.code == "AuthenticationError" and "no Hello within 0.3 s" in r.message
    raw.close()
    bare.close()


def test_bind_and_unbind_are_refused_on_a_hello_connection(node: Any) -> None:
    """A connection that presented its credentials with Hello keeps them: Bind is a ProtocolError naming
    Attach, and Unbind leaves them in place (its error comes with the next request)."""
    raw = Raw(node.config.socket_path)
    assert isinstance(raw.call(P.Hello(node.inv.tokens["f"])), P.Welcome)
    r = raw.call(P.Bind(node.inv.tokens["g"]))
    assert isinstance(r, P.Error) and r.code == "ProtocolError"
    assert "Bind is for connections the platform attached (Attach)" in r.message
    raw.send(P.Unbind())
    r = raw.call(P.Sync())
    assert isinstance(r, P.Error) and "Unbind is for connections the platform attached" in r.message
    assert isinstance(raw.call(P.MoreIds(1)), P.Ids)  # still f's credentials
    raw.close()


def test_one_connection_serves_tasks_of_two_invocations_each_with_its_own_access(node: Any) -> None:
    """The same attached connection bound to f of invocation A reads A's object; bound to f of B it gets
    AccessDenied for it (as any function of B would); after Unbind it has no credentials at all."""
    a, b = node.inv, node.open()
    ref = node.connect("g", a).put(np.arange(8), consumers=["f"])
    raw = attached(node)
    r = raw.call(P.Bind(a.tokens["f"]))
    assert isinstance(r, P.Bound) and (r.invocation_id, r.function, r.functions) == (a.id, "f", ["f", "g", "h"])
    assert r.lease is None and raw.fds == []
    r = raw.call(P.Bind(b.tokens["f"]))
    assert isinstance(r, P.Bound) and r.invocation_id == b.id
    r = raw.call(P.Get(ref.id))
    assert isinstance(r, P.Error) and r.code == "AccessDenied"
    raw.send(P.Unbind())
    r = raw.call(P.Get(ref.id))
    assert isinstance(r, P.Error) and r.code == "AuthenticationError" and "its task ended (Unbind)" in r.message
    assert isinstance(raw.call(P.Bind(a.tokens["f"])), P.Bound)
    r = raw.call(P.Get(ref.id))
    assert isinstance(r, P.Located) and r.nbytes == 64
    raw.close()


def test_a_refused_bind_leaves_the_connection_without_credentials(node: Any) -> None:
    """A Bind with a revoked token is refused and the credentials held before are gone too."""
    b = node.open()
    raw = attached(node)
    assert isinstance(raw.call(P.Bind(b.tokens["f"])), P.Bound)
    node.admin.end_invocation(b)
    r = raw.call(P.Bind(b.tokens["g"]))
    assert isinstance(r, P.Error) and r.code == "AuthenticationError" and "unknown or revoked" in r.message
    r = raw.call(P.MoreIds(1))
    assert isinstance(r, P.Error) and "holds no function credentials now" in r.message
    raw.close()


def test_bind_with_a_lease_hands_over_a_slab_and_the_ids_asked_for(node: Any) -> None:
    """Bind(lease=0, ids=2): the reply carries the slab (its descriptor alongside) and exactly 2 IDs in
    its directory's first slots, so the task's first small put needs no Lease of its own."""
    raw = attached(node)
    r = raw.call(P.Bind(node.inv.tokens["f"], 0, 2))
    assert isinstance(r, P.Bound) and r.lease is not None and len(raw.fds) == 1
    assert len(r.lease.ids) == 2 and r.lease.first_slot == 0 and r.lease.size < node.config.slab_bytes
    raw.close()


def test_a_seal_refused_after_its_task_ended_is_the_error_its_readers_get(node: Any) -> None:
    """No Sync at the end of a task: a small put's asynchronous seal that the daemon refuses after the
    producer's credentials ended is not raised to the next task's credentials; the object's readers get
    DataLost naming the refusal, and the daemon goes on serving the connection."""
    a = node.inv
    raw = attached(node)
    r = raw.call(P.Bind(a.tokens["f"], 0, 1))
    assert isinstance(r, P.Bound) and r.lease is not None
    oid, at = r.lease.ids[0], r.lease.size + 4096
    raw.send(P.Seal(oid, at, 8, "raw", [8], ["g"]))  # beyond the slab's free part
    raw.send(P.Unbind())
    r = raw.call(P.Bind(a.tokens["h"]))  # the refusal belongs to f's task, not to h's
    assert isinstance(r, P.Bound) and r.function == "h"
    assert isinstance(raw.call(P.Sync()), P.Ok)
    g = node.connect("g")
    with pytest.raises(DataLost, match=f"object {oid.hex()} was never stored: its producer's seal was refused:"
                                       f" seal at offset {at} \\(\\+8\\) is outside the free part"):
        g._call(P.Get(oid))
    raw.close()


def test_a_seal_refused_within_a_task_is_still_raised_at_its_next_request(node: Any) -> None:
    """Within one binding the rule is today's: the next synchronous request carries the refusal."""
    raw = attached(node)
    r = raw.call(P.Bind(node.inv.tokens["f"], 0, 1))
    assert isinstance(r, P.Bound) and r.lease is not None
    raw.send(P.Seal(r.lease.ids[0], r.lease.size + 4096, 8, "raw", [8], None))
    r2 = raw.call(P.Sync())
    assert isinstance(r2, P.Error) and r2.code == "ProtocolError" and "outside the free part" in r2.message
    raw.close()


def test_client_bind_costs_no_round_trip_of_its_own_and_forgets_the_last_credentials(node: Any) -> None:
    """Client.bind sends Bind and reads its reply with the next request's; the client then acts for the
    new credentials only (its functions, its invocation), and end_task forgets them."""
    a, b = node.inv, node.open(("f", "x"))
    ref = node.connect("g", a).put(np.arange(4), consumers=["f"])
    c = node.admin.attach()
    sent, real_sock = spy_requests(c)
    c.bind(a.tokens["f"])
    np.testing.assert_array_equal(c.get(ref), np.arange(4))
    assert sent == ["Bind", "Get"] and c.invocation_id == a.id and c.functions == ("f", "g", "h")
    c.end_task()
    assert (c.invocation_id, c.function) == ("", "")
    c.bind(b.tokens["x"], lease=0, ids=1)
    out = c.put(np.ones(3), consumers=["f"])
    assert sent == ["Bind", "Get", "Bind"] and c.function == "x" and c.functions == ("f", "x")
    c.end_task()
    c.bind(b.tokens["f"])
    np.testing.assert_array_equal(c.get(out), np.ones(3))
    with pytest.raises(AccessDenied):
        c.get(ref)  # invocation A's, read under B's credentials
    c.end_task()
    c._ch.sock = real_sock  # type: ignore[assignment]
    c.close()


def test_a_refused_bind_is_the_error_of_the_next_call(node: Any) -> None:
    """A Bind with a bad token fails the call it was read with, naming why, and the client stays in step."""
    c = node.admin.attach()
    c.bind("0" * 32)
    with pytest.raises(AuthenticationError, match="unknown or revoked function token"):
        c.get("gfaas://n0/" + "00" * 16)
    c.bind(node.inv.tokens["f"])
    assert c.put(np.arange(2)).node == "n0"
    c.close()


def test_a_view_of_an_earlier_task_does_not_release_a_pin_under_the_next(node: Any) -> None:
    """The daemon released the earlier credentials' pins when they ended: a view of that task dying later
    is not told under the next credentials (it could release the next task's pin of the same segment)."""
    big = np.arange(1 << 18, dtype=np.int64)  # 2 MiB: a segment of its own, pinned while viewed
    ref = node.connect("g").put(big, consumers=["f"])
    c = node.admin.attach()
    c.bind(node.inv.tokens["f"])
    view = c.get(ref)
    c.end_task()
    c.bind(node.inv.tokens["h"])
    del view
    gc.collect()
    assert c._released == []
    c.close()


def test_binder_sends_what_the_worker_reads_and_the_worker_never_holds_a_token(node: Any) -> None:
    """The platform's Binder binds the connection a worker holds: the worker's client reads the Bound
    reply (checking it names the task's invocation) and its requests run with those credentials."""
    sock, welcome = node.admin.attach_socket()
    binder = Binder(sock, welcome, node.config.socket_path)
    worker = Client(node.config.socket_path, None, sock=socket.socket(fileno=os.dup(sock.fileno())), welcome=welcome)
    ref = node.connect("g").put(np.arange(3), consumers=["f"])
    binder.bind(node.inv.tokens["f"], 0, 1)
    worker.expect_binding(node.inv.id)
    np.testing.assert_array_equal(worker.get(ref), np.arange(3))
    out = worker.put(np.arange(5), consumers=["h"])
    assert worker.slab_used
    worker.end_task()
    binder.unbind()
    np.testing.assert_array_equal(node.connect("h").get(out), np.arange(5))
    other = node.open()
    binder.bind(other.tokens["f"])
    worker.expect_binding(node.inv.id)  # a Bound naming another invocation is refused
    with pytest.raises(ProtocolError, match=f"bound to invocation {other.id}, not {node.inv.id}"):
        worker.get(ref)
    binder.close()
    worker.close()


def test_a_copy_of_the_connection_made_non_blocking_does_not_break_its_client(node: Any) -> None:
    """O_NONBLOCK belongs to the connection, not to a descriptor: a function that sets it on its copy of
    the connection it shares does not turn the client's next wait into 'did not answer' (it is cleared)."""
    import signal
    import threading

    c = node.connect("f")
    ref = c.put(np.arange(3))
    assert c._ch.sock is not None
    copy = socket.socket(fileno=os.dup(c._ch.sock.fileno()))
    copy.setblocking(False)
    os.kill(node.pid, signal.SIGSTOP)  # the reply comes late, so the client's receive waits
    threading.Timer(0.3, os.kill, (node.pid, signal.SIGCONT)).start()
    np.testing.assert_array_equal(c.get(ref, copy=True), np.arange(3))
    copy.close()


@pytest.mark.parametrize("hint", [False, True])
def test_a_task_bound_by_a_get_leases_its_slab_with_the_bind_when_told_a_small_put_follows(node: Any,
                                                                                          hint: bool) -> None:
    """A Ray actor's task binds at its first use; when that is a get, the slab for the small put after
    it comes with the Bind only if the caller says the function's last task packed one (``lease_hint``):
    otherwise the put leases it in a round trip of its own (what the lab measured at 0.5-0.9 ms)."""
    from gfaas.runtime.transport import BoundTransport

    ref = node.connect("g").put(np.arange(8, dtype=np.float32), consumers=["f"])
    c = node.admin.attach()
    sent, real_sock = spy_requests(c)
    t = BoundTransport(c, node.inv.tokens["f"], lease_hint=hint)
    np.testing.assert_array_equal(t.get(str(ref)), np.arange(8, dtype=np.float32))
    out = t.put(np.ones(1024, dtype=np.float32), consumers=["h"])
    assert t.slab_used
    assert [m for m in sent if m not in ("Seal", "Release", "Consumed")] == \
        (["Bind", "Get"] if hint else ["Bind", "Get", "Lease"])
    c.end_task()
    c._ch.sock = real_sock  # type: ignore[assignment]
    np.testing.assert_array_equal(node.connect("h").get(out), np.ones(1024, dtype=np.float32))
    c.close()
