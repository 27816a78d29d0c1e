"""Reliability of the node daemon: killed clients, killed daemons, concurrency, hostile frames, a full pool."""

from __future__ import annotations

import array
import glob
import json
import os
import random
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
import pytest

import gfaas
from gfaas import (
    AccessDenied,
    CapacityError,
    DaemonUnavailable,
    DataLost,
    DataRef,
)
from gfaas.config import KiB, MiB
from gfaas.dataplane import protocol as P
from gfaas.dataplane.local import is_serving

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

LEAK_KEYS = ("objects", "writing", "segments", "bytes_reserved", "bytes_live", "connections")


def wait_for(pred: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


def leak_view(stats: dict[str, Any]) -> dict[str, Any]:
    """What is in use: warm segments kept for the workflow's next invocations are not a leak
    (bounded by warm_pool_bytes), so they are taken out of the segment and byte counts."""
    out = {k: stats[k] for k in LEAK_KEYS}
    out["segments"] -= stats["segments_pooled"]
    out["bytes_reserved"] -= stats["bytes_pooled"]
    return out


def fds_settled(node, base_fds: int) -> bool:  # type: ignore[no-untyped-def]
    """The daemon holds ``base_fds`` plus, per warm segment, its descriptor and perhaps a read-only one."""
    pooled = node.stats()["segments_pooled"]
    return base_fds + pooled <= node.open_fds() <= base_fds + 2 * pooled


def warm_up(node) -> None:  # type: ignore[no-untyped-def]
    """Open the daemon's lazily opened files (the journal) so fd counts compare like with like."""
    c = gfaas.connect(node.credentials("h"))
    c.delete(c.put(b"warm-up"))
    c.close()
    wait_for(lambda: node.stats()["connections"] == 0 and node.stats()["segments"] == 0, what="warm-up to settle")


# ---- (a) clients killed in the middle of a put ----------------------------------------------
CHILD = r"""
import os, sys, time
import numpy as np
import gfaas
from gfaas.config import MiB

mode = sys.argv[1]
c = gfaas.connect()
if mode == "allocate":
    buf = c.allocate((4 * MiB,), np.uint8, consumers=["g"])
    buf.array[: MiB] = 1
    print("ready", buf._id.hex(), flush=True)
elif mode == "large-put":
    real = np.copyto
    def half_then_hang(dst, src, **kw):
        n = dst.size // 2
        dst.reshape(-1)[:n] = src.reshape(-1)[:n]
        print("ready", "-", flush=True)
        time.sleep(600)
    np.copyto = half_then_hang
    c.put(np.ones(8 * MiB, np.uint8), consumers=["g"])
elif mode == "small-put":
    def hang(*args):  # send(Seal) or, where puts are sealed from the directory, _describe(map, at, id, ...)
        oid = args[0].id if len(args) == 1 else args[2]
        print("ready", oid.hex(), flush=True)
        time.sleep(600)
    if c._directory_seals:
        c._describe = hang  # the bytes are written, the directory entry that publishes them is not
    else:
        c._ch.send = hang
    c.put(np.arange(1000), consumers=["g"])
elif mode == "mixed":
    kept = c.put(np.arange(100), consumers=["g"])
    big = c.put(np.full(2 * MiB, 7, np.uint8), consumers=["g"])
    buf = c.allocate((3 * MiB,), np.uint8, consumers=["g"])
    small = c.allocate(100, np.uint8, consumers=["g"])
    print("ready", kept, big, buf._id.hex(), small._id.hex(), flush=True)
time.sleep(600)
"""


def spawn_child(node, mode: str, function: str = "f") -> tuple[subprocess.Popen[str], list[str]]:  # type: ignore[no-untyped-def]
    env = {**os.environ, **node.credentials(function).to_env()}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, mode], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 20)
    if not ready:
        proc.kill()
        raise AssertionError(f"child {mode} did not get ready: {proc.stderr.read() if proc.stderr else ''}")
    line = proc.stdout.readline().split()
    if not line or line[0] != "ready":
        proc.kill()
        raise AssertionError(f"child {mode} failed: {line} {proc.communicate()[1]}")
    return proc, line[1:]


def sigkill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    if proc.stdout:
        proc.stdout.close()
    if proc.stderr:
        proc.stderr.close()


@pytest.mark.parametrize("mode", ["allocate", "large-put", "small-put"])
def test_client_killed_mid_put_leaks_nothing(node, mode: str) -> None:  # type: ignore[no-untyped-def]
    """A client SIGKILLed after allocate / mid-copy of a large put / before a small put's seal leaves no
    object, no segment, no reserved byte and no open file descriptor in the daemon."""
    warm_up(node)
    g = node.connect("g")
    base, base_fds = leak_view(node.stats()), node.open_fds()
    proc, info = spawn_child(node, mode)
    during = node.stats()
    assert during["segments"] > base["segments"] and during["bytes_reserved"] > base["bytes_reserved"]
    assert during["objects"] == 0
    assert during["writing"] == (0 if mode == "small-put" else 1)
    if info[0] != "-":
        ref = DataRef(bytes.fromhex(info[0]), "n0")
        with pytest.raises((gfaas.ObjectStateError, AccessDenied)):
            g.get(ref)
    sigkill(proc)
    wait_for(lambda: leak_view(node.stats()) == base, what=f"stats back to {base}")
    wait_for(lambda: fds_settled(node, base_fds), what=f"daemon fds back to {base_fds} plus the warm segments'")
    if info[0] != "-":
        with pytest.raises(AccessDenied):  # never published
            g.get(ref)


def test_killed_client_sealed_objects_survive_and_are_freed_when_read(node) -> None:  # type: ignore[no-untyped-def]
    """Objects a killed client had sealed stay readable; what it was writing vanishes; after the reads,
    stats and fds are back to the baseline."""
    warm_up(node)
    base_fds = node.open_fds()
    g = node.connect("g")
    proc, (kept, big, w1, w2) = spawn_child(node, "mixed")
    assert node.stats()["objects"] == 2 and node.stats()["writing"] == 2
    sigkill(proc)
    wait_for(lambda: node.stats()["writing"] == 0, what="writing objects to be dropped")
    assert node.stats()["objects"] == 2
    np.testing.assert_array_equal(g.get(kept, copy=True), np.arange(100))
    assert int(g.get(big, copy=True).sum()) == 7 * 2 * MiB
    for oid in (w1, w2):
        with pytest.raises(AccessDenied):
            g.get(DataRef(bytes.fromhex(oid), "n0"))
    node.admin.end_invocation(node.inv)
    end = leak_view(node.stats())
    assert (end["objects"], end["writing"], end["segments"], end["bytes_reserved"]) == (0, 0, 0, 0)
    g.close()
    wait_for(lambda: fds_settled(node, base_fds), what=f"daemon fds back to {base_fds} plus the warm segments'")


# ---- (b) the daemon killed and restarted -----------------------------------------------------
def _named_segments() -> list[str]:
    """Shared memory under a gfaas name in /dev/shm (the daemon's segments are memfds, named nowhere).
    A runtime's weight store (runtime/dedup.py: ``gfaas-shared-*``) is left out: it is another
    process's, which a test on the other xdist worker may hold at any moment (a CI run failed on one
    that a killed ``gfaas demo`` had left, before SIGTERM closed the runtime: test_cli_sigterm.py)."""
    return [p for p in glob.glob("/dev/shm/gfaas*") if not os.path.basename(p).startswith("gfaas-shared-")]


def test_daemon_restart_reports_lost_objects(node) -> None:  # type: ignore[no-untyped-def]
    """After SIGKILL and restart on the same state_dir: old credentials connect, lost objects raise
    DataLost fast, random IDs still AccessDenied, nothing stale remains, new puts work."""
    assert _named_segments() == []
    f, g = node.connect("f"), node.connect("g")
    refs = [f.put(np.arange(10), consumers=["g"]), f.put(np.zeros(2 * MiB, np.uint8)),
            f.put(b"raw bytes")]
    buf = f.allocate((1000,), np.float32)
    buf.array[:] = 1.5
    refs.append(buf.seal())
    unsealed = f.allocate(10)
    view = g.get(refs[1])
    sock = node.config.socket_path
    before = os.stat(sock)
    old_pid = node.pid
    node.kill()
    with pytest.raises(DaemonUnavailable):
        g.get(refs[0])
    assert view[0] == 0 and view.shape == (2 * MiB,)  # views of a dead daemon's memory stay valid
    assert os.path.exists(sock) and not is_serving(sock)  # the stale socket is left behind
    node.restart()
    assert node.pid != old_pid and is_serving(sock)
    # a new socket in place of the stale one: tmpfs may give it the freed inode number (a CI run
    # saw it), so the change time tells them apart too
    after = os.stat(sock)
    assert (after.st_ino, after.st_ctime_ns) != (before.st_ino, before.st_ctime_ns)
    with open(os.path.join(node.config.state_dir, "daemon.pid")) as fh:
        assert int(fh.read()) == node.pid
    assert _named_segments() == []
    st = node.stats()
    # "lost" counts every ID handed out before the crash: a slab lease's batch (64) and 3 allocations.
    assert (st["objects"], st["segments"], st["bytes_reserved"], st["invocations"], st["lost"]) == (0, 0, 0, 1, 67)

    g2 = node.connect("g")
    t0 = time.monotonic()
    for ref in refs:
        with pytest.raises(DataLost, match=f"object {ref.id.hex()} was lost when node n0 restarted"):
            g2.get(ref)
    assert time.monotonic() - t0 < 2.0
    with pytest.raises(DataLost):
        g2.get(DataRef(unsealed._id, "n0"))  # never sealed, but its ID was handed out before the crash
    with pytest.raises(AccessDenied):
        g2.get(DataRef(os.urandom(16), "n0"))
    f2 = node.connect("f")
    with pytest.raises(DataLost):
        f2.delete(refs[2])
    ref = f2.put(np.arange(5), consumers=["g"])
    big = f2.put(np.ones(2 * MiB, np.uint8), consumers=["g"])
    np.testing.assert_array_equal(g2.get(ref), np.arange(5))
    assert int(g2.get(big).sum()) == 2 * MiB

    # A second crash: objects lost in both are still reported; ending the invocation forgets them.
    alive = f2.put(np.arange(3))
    f2.get(alive)  # a synchronous call: the asynchronous seal before it has been processed
    node.kill()
    node.restart()
    g3 = node.connect("g")
    for r in (refs[0], refs[3], alive):
        with pytest.raises(DataLost):
            g3.get(r)
    node.admin.end_invocation(node.inv)
    assert node.stats()["lost"] == 0


def test_other_invocations_do_not_see_lost_objects(node) -> None:  # type: ignore[no-untyped-def]
    """DataLost is only told to the object's own invocation; others get the generic AccessDenied."""
    other = node.open()
    f = node.connect("f")
    ref = f.put(np.arange(3))
    f.get(ref)  # the seal is processed
    node.kill()
    node.restart()
    with pytest.raises(AccessDenied):
        node.connect("f", other).get(ref)
    with pytest.raises(DataLost):
        node.connect("g").get(ref)


def test_put_in_flight_at_a_crash_is_reported_lost(node) -> None:  # type: ignore[no-untyped-def]
    """A reference returned by put() before the daemon crashed reads as DataLost after the restart."""
    f = node.connect("f")
    f.put(b"lease a slab first")
    os.kill(node.pid, signal.SIGSTOP)
    ref = f.put(np.arange(3), consumers=["g"])  # returns at once: the seal waits in the socket
    node.kill()
    node.restart()
    with pytest.raises(DataLost):
        node.connect("g").get(ref)


def test_open_invocations_survive_a_crash_amid_opens_and_ends(node) -> None:  # type: ignore[no-untyped-def]
    """A daemon SIGKILLed in a stream of opens and ends restarts knowing exactly the invocations still
    open: their tokens connect, the ended ones' are refused."""
    handles = [node.open(("f", "g")) for _ in range(40)]
    for h in handles[::2]:
        node.admin.end_invocation(h)
    node.kill()
    node.restart()
    assert node.stats()["invocations"] == 1 + 20
    for h in handles[1::2]:
        node.connect("g", h).put(b"ok")
    for h in handles[::2]:
        with pytest.raises(gfaas.AuthenticationError, match="unknown or revoked function token"):
            node.connect("g", h)
    node.kill()  # and once more, after the restart rewrote the journal
    node.restart()
    assert node.stats()["invocations"] == 21


def test_ending_invocations_in_a_batch_skips_those_not_open_and_survives_a_crash(node) -> None:  # type: ignore[no-untyped-def]
    """EndInvocations ends each open invocation once (freeing its objects, revoking its tokens) and
    skips IDs not open; a daemon killed afterwards restarts with them ended."""
    a, b, keep = node.open(("f", "g")), node.open(("f", "g")), node.open(("f", "g"))
    node.connect("f", a).put(np.arange(4), consumers=["g"])
    node.connect("f", b).put(b"x")
    node.connect("f", b).get(node.connect("f", b).put(b"y"))  # a synchronous call: the seals are in
    freed = node.admin.end_invocations([a.id, "f" * 32, b.id, a.id])
    assert freed == {a.id: 1, b.id: 2}
    assert node.stats()["invocations"] == 2
    assert node.admin.end_invocations([a.id]) == {}
    node.kill()
    node.restart()
    assert node.stats()["invocations"] == 2
    with pytest.raises(gfaas.AuthenticationError, match="unknown or revoked function token"):
        node.connect("g", b)
    node.connect("g", keep).put(b"ok")


def test_open_and_end_cost_does_not_grow_with_the_invocations_open(make_config, thread_daemon,  # type: ignore[no-untyped-def]
                                                                   monkeypatch) -> None:
    """The bytes the daemon writes into its state directory for one open + end are the same with
    1,000 other invocations open as with none (the registry was rewritten whole on each: O(open))."""
    cfg = make_config()
    state = os.path.realpath(cfg.state_dir) + os.sep
    written = [0]
    real_write = os.write

    def counting(fd: int, data: Any) -> int:
        n = real_write(fd, data)
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(state):
                written[0] += n
        except OSError:
            pass
        return n

    with thread_daemon(cfg), gfaas.Admin(cfg.socket_path, state_dir=cfg.state_dir) as adm:
        monkeypatch.setattr(os, "write", counting)

        def pair() -> int:
            before = written[0]
            adm.end_invocation(adm.open_invocation("wf", ["f", "g", "gateway"]))
            return written[0] - before

        alone = pair()
        for _ in range(1000):
            adm.open_invocation("wf", ["f", "g", "gateway"])
        assert 0 < pair() == alone < 600


def test_client_of_a_dying_daemon_gets_daemon_unavailable(node) -> None:  # type: ignore[no-untyped-def]
    """A call in flight when the daemon is SIGKILLed fails with DaemonUnavailable promptly, not a hang."""
    f = node.connect("f")
    ref = f.put(np.arange(3))
    os.kill(node.pid, signal.SIGSTOP)  # the request will be queued but not answered
    result: list[BaseException | None] = []

    def call() -> None:
        try:
            f.get(ref)
            result.append(None)
        except BaseException as exc:  # noqa: BLE001
            result.append(exc)

    t = threading.Thread(target=call)
    t.start()
    time.sleep(0.3)
    assert result == []  # blocked on the stopped daemon
    t0 = time.monotonic()
    node.kill()
    t.join(5)
    assert not t.is_alive() and time.monotonic() - t0 < 2.0
    assert isinstance(result[0], DaemonUnavailable), result
    for call_ in (lambda: f.get(ref), lambda: f.put(b"x"), lambda: f.put(np.zeros(MiB))):
        with pytest.raises(DaemonUnavailable):
            call_()


def test_puts_to_a_dead_daemon_fail(node) -> None:  # type: ignore[no-untyped-def]
    """An asynchronous small put to a daemon that died raises DaemonUnavailable (no silent success)."""
    f = node.connect("f")
    f.put(b"first")  # leases a slab
    node.kill()
    with pytest.raises(DaemonUnavailable, match="lost the connection"):
        f.put(b"second")


def test_hung_daemon_times_out(node) -> None:  # type: ignore[no-untyped-def]
    """A daemon that stops answering makes a call with timeout=0.5 fail with DaemonUnavailable in time."""
    f = node.connect("f", timeout=0.5)
    ref = f.put(np.arange(3))
    os.kill(node.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.raises(DaemonUnavailable, match="did not answer within 0.5 s"):
            f.get(ref)
        assert 0.4 < time.monotonic() - t0 < 3.0
    finally:
        os.kill(node.pid, signal.SIGCONT)
    np.testing.assert_array_equal(node.connect("g").get(ref), np.arange(3))


def read_in_threads(readers: list[Any], ref: Any) -> tuple[list[object], list[threading.Thread]]:
    """Each reader gets a copy of ``ref`` on a thread of its own; results[k] is its array or exception."""
    results: list[object] = [None] * len(readers)

    def read(k: int) -> None:
        try:
            results[k] = readers[k].get(ref, copy=True)
        except BaseException as exc:  # noqa: BLE001
            results[k] = exc

    threads = [threading.Thread(target=read, args=(k,)) for k in range(len(readers))]
    for t in threads:
        t.start()
    return results, threads


def connected_readers(node: Any, *functions: str) -> list[Any]:
    """Clients of ``functions``, each past its Hello and first round trip (so a later get is its only
    message in flight)."""
    readers = [node.connect(fn) for fn in functions]
    for r in readers:
        r.put(b"connected and authenticated")
    return readers


def assert_all_read(results: list[object], threads: list[threading.Thread], expected: np.ndarray) -> None:
    """Every reader thread of :func:`read_in_threads` ended with ``expected``."""
    for t in threads:
        t.join(5)
    for res in results:
        assert isinstance(res, np.ndarray), res
        np.testing.assert_array_equal(res, expected)


def test_concurrent_misses_all_wait_for_a_queued_seal(node) -> None:  # type: ignore[no-untyped-def]
    """Two readers whose gets of a not-yet-sealed small put are queued together both see the object.

    The daemon answers the first miss by draining the other connections; the second reader's get is
    met inside that drain, before the producer's seal (the producer connected last), and must wait for
    the drain to finish rather than be denied.
    """
    readers = connected_readers(node, "g", "h")
    f = node.connect("f")
    f.put(b"lease a slab first")
    os.kill(node.pid, signal.SIGSTOP)
    try:
        f.put(b"an earlier seal queued first")  # the loop serves one message per connection per turn
        ref = f.put(np.arange(5))  # returns at once: the seal waits in the stopped daemon's socket
        results, threads = read_in_threads(readers, ref)
        time.sleep(0.3)  # both gets are queued behind the seal's connection
    finally:
        os.kill(node.pid, signal.SIGCONT)
    assert_all_read(results, threads, np.arange(5))


def test_a_larger_put_seals_without_waiting_and_readers_queued_behind_its_seal_see_it(node) -> None:  # type: ignore[no-untyped-def]
    """A put with a segment of its own allocates (a round trip) and then seals without waiting: with the
    daemon stopped, the seal returns at once, and two readers whose gets are queued with it both read
    the object once it runs (a get that finds the object still being written drains the other
    connections first, where its seal waits)."""
    readers = connected_readers(node, "g", "h")
    f = node.connect("f")
    big = np.arange(f.small_object_max // 8 + 4096, dtype=np.int64)  # over small_object_max
    buf = f.allocate(big.shape, np.int64, consumers=["g", "h"])
    buf.array[:] = big
    os.kill(node.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        ref = buf.seal()
        assert time.monotonic() - t0 < 0.5  # did not wait for the stopped daemon
        results, threads = read_in_threads(readers, ref)
        time.sleep(0.3)
    finally:
        os.kill(node.pid, signal.SIGCONT)
    assert_all_read(results, threads, big)
    assert not buf.array.flags.writeable


def test_a_failed_asynchronous_seal_is_the_error_of_the_next_call_and_seals_nothing(node) -> None:  # type: ignore[no-untyped-def]
    """A SealWritten for an object another connection is writing is refused: its sender hears it with its
    next call, and the other connection's object stays its own to seal."""
    g, f = node.connect("g"), node.connect("f")
    big = np.ones(g.small_object_max // 8 + 4096, dtype=np.int64)
    theirs = g.allocate(big.shape, np.int64, consumers=["f"])
    f._ch.send(P.SealWritten(theirs._id))  # forged: f did not allocate it
    with pytest.raises(AccessDenied, match="seal refused"):
        f.put(np.arange(1 << 16))  # a larger put: a synchronous Allocate carries the error back
    theirs.array[:] = big
    ref = theirs.seal()
    np.testing.assert_array_equal(f.get(ref, copy=True), big)


def test_a_get_parked_after_the_drain_passed_its_producer_waits_for_another_round(make_config) -> None:  # type: ignore[no-untyped-def]
    """The CI stress race, made deterministic: a drain visits the producer's connection, then the
    producer seals and a reader asks for the object before the drain reaches the reader. The parked
    get must see the seal (a further drain round), not be denied."""
    from gfaas.dataplane.daemon import Daemon

    cfg = make_config()
    d = Daemon(cfg)
    d.bind()
    t = threading.Thread(target=d.serve_forever, daemon=True)
    t.start()
    admin = gfaas.Admin(cfg.socket_path, state_dir=cfg.state_dir)
    inv = admin.open_invocation("wf", ["trigger", "producer", "reader"])
    clients = {fn: gfaas.connect(inv.credentials(fn)) for fn in ("trigger", "producer", "reader")}
    try:
        for c in clients.values():
            c.get(c.put(b"warm: session, slab lease and IDs in hand"))
        by_fn = {c.session.function: c for c in d._conns.values() if c.session is not None}
        producer_conn, reader_conn = by_fn["producer"], by_fn["reader"]
        order = list(d._conns.values())
        assert order.index(producer_conn) < order.index(reader_conn)  # drains visit in connect order
        real_serve = d._serve
        got: dict[str, Any] = {}

        def read(ref: DataRef) -> None:
            try:
                got["value"] = clients["reader"].get(ref, copy=True)
            except gfaas.GfaasError as exc:
                got["value"] = exc

        def serve(conn: Any, drain: bool = False) -> None:
            real_serve(conn, drain)
            if drain and conn is producer_conn and "reader" not in got:
                # the drain has just passed the producer: now it seals, and the reader asks
                ref = clients["producer"].put(np.arange(7))
                got["reader"] = threading.Thread(target=read, args=(ref,))
                got["reader"].start()
                ready, _, _ = select.select([reader_conn.sock], [], [], 5)
                assert ready, "the reader's get never reached the daemon"

        d._serve = serve  # type: ignore[method-assign]
        with pytest.raises(AccessDenied):
            clients["trigger"].get(DataRef(os.urandom(16), cfg.node_id))  # a miss: starts the drain
        got["reader"].join(5)
        assert isinstance(got.get("value"), np.ndarray), got.get("value")
        np.testing.assert_array_equal(got["value"], np.arange(7))
    finally:
        for c in clients.values():
            c.close()
        admin.close()
        d.stop()
        t.join(10)

# ---- (c) many concurrent clients -------------------------------------------------------------
WORKER = r"""
import json, random, sys
import numpy as np
import gfaas
from gfaas import DataDeleted

ops, seed, pubfile = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rng = random.Random(seed)
c = gfaas.connect()
me = c.function
MEDIUM = c.small_object_max + 4096  # a segment of its own
own = []
counts = {}
pub_off, pub_refs = 0, []

def tagged(tag, nbytes):
    return np.full(max(nbytes // 8, 1), tag, dtype=np.int64)

def check(view, tag):
    a = np.asarray(view)
    if not (a.size > 0 and a.min() == tag and a.max() == tag):
        raise AssertionError(f"object {tag} reads back wrong: {a[:4]}")

for i in range(ops):
    tag = seed * 10_000_000 + i
    r = rng.random()
    if r < 0.22:
        op = "put_small"; own.append((c.put(tagged(tag, rng.choice((64, 1024, 4096)))), tag))
    elif r < 0.30:
        op = "put_medium"; own.append((c.put(tagged(tag, MEDIUM)), tag))
    elif r < 0.36:
        op = "allocate_seal"
        buf = c.allocate((rng.choice((512, MEDIUM)) // 8,), np.int64)
        buf.array[:] = tag
        own.append((buf.seal(), tag))
    elif r < 0.56:
        op = "get"
        if own:
            ref, t = rng.choice(own); check(c.get(ref), t)
    elif r < 0.66:
        op = "get_copy"
        if own:
            ref, t = rng.choice(own); a = c.get(ref, copy=True); check(a, t); a[:] = 0
    elif r < 0.80:
        op = "delete"
        if own:
            ref, _ = own.pop(rng.randrange(len(own))); c.delete(ref)
    elif r < 0.88:
        op = "consume"  # consumers=[me]: freed by our own read, then DataDeleted
        ref = c.put(tagged(tag, 256), consumers=[me]); check(c.get(ref, copy=True), tag)
        try:
            c.get(ref)
            raise AssertionError("a read after consumption succeeded")
        except DataDeleted:
            pass
    elif r < 0.94:
        op = "put_shared"  # readable by the other workers of this invocation
        ref = c.put(tagged(tag, rng.choice((256, MEDIUM))))
        own.append((ref, tag))
        with open(pubfile, "a") as f:
            f.write(f"{ref} {tag}\n")
    else:
        op = "get_shared"
        with open(pubfile) as f:
            f.seek(pub_off); data = f.read()
        lines = data.split("\n")
        pub_off += len(data) - len(lines[-1])
        pub_refs += [ln.split() for ln in lines[:-1]]
        if pub_refs:
            ref, t = rng.choice(pub_refs[-48:])  # recent ones: often still alive
            try:
                check(c.get(ref), int(t))
            except DataDeleted:
                op = "get_shared_deleted"
    counts[op] = counts.get(op, 0) + 1
    while len(own) > 24:
        ref, _ = own.pop(0); c.delete(ref)
print(json.dumps(counts))
"""

STRESS_PROCS = 32
# make test runs 32 x 2,000 operations (about 15 s on 2 cores); GFAAS_STRESS_OPS=10000 is the long stress.
STRESS_OPS = int(os.environ.get("GFAAS_STRESS_OPS", "2000"))


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.node_config(capacity_bytes=1024 * MiB)
def test_concurrent_clients_stress(node, run_dir) -> None:  # type: ignore[no-untyped-def]
    """32 client processes (4 invocations x 8 functions) x GFAAS_STRESS_OPS mixed operations finish without
    error, read back exactly what was written, and leave nothing behind once the invocations end."""
    warm_up(node)
    base_fds = node.open_fds()
    invs = [node.admin.open_invocation("stress", [f"w{i}" for i in range(8)]) for _ in range(STRESS_PROCS // 8)]
    procs = []
    t0 = time.monotonic()
    for k in range(STRESS_PROCS):
        inv = invs[k // 8]
        pub = os.path.join(run_dir, f"shared-{k // 8}")
        open(pub, "a").close()
        env = {**os.environ, **inv.credentials(f"w{k % 8}").to_env()}
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER, str(STRESS_OPS), str(k + 1), pub], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    totals: dict[str, int] = {}
    failures = []
    for k, p in enumerate(procs):
        out, err = p.communicate(timeout=550)
        if p.returncode != 0:
            failures.append(f"worker {k}: rc={p.returncode}\n{err[-3000:]}")
            continue
        for op, n in json.loads(out.strip().splitlines()[-1]).items():
            totals[op] = totals.get(op, 0) + n
    elapsed = time.monotonic() - t0
    assert not failures, "\n".join(failures)
    assert sum(totals.values()) == STRESS_PROCS * STRESS_OPS
    print(f"\nstress: {STRESS_PROCS} x {STRESS_OPS} ops in {elapsed:.1f} s "
          f"({STRESS_PROCS * STRESS_OPS / elapsed:.0f} ops/s): {dict(sorted(totals.items()))}")
    st = node.stats()
    assert st["writing"] == 0 and st["connections"] == 0 and st["invocations"] == 5
    for inv in invs:
        node.admin.end_invocation(inv)
    node.admin.end_invocation(node.inv)
    st = node.stats()
    assert leak_view(st) == dict.fromkeys(LEAK_KEYS, 0), st
    assert st["invocations"] == 0
    wait_for(lambda: fds_settled(node, base_fds), what=f"daemon fds back to {base_fds} plus the warm segments'")


# ---- (d) hostile frames on the raw socket ---------------------------------------------------
class Raw:
    """A bare SOCK_SEQPACKET connection to the daemon."""

    def __init__(self, path: str) -> None:
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.s.settimeout(5)
        self.s.connect(path)

    def send(self, data: bytes | P._Msg) -> None:
        self.s.send(data if isinstance(data, bytes) else P.encode(data))

    def recv(self) -> P.Reply | None:
        """The next reply, or None if the daemon closed the connection."""
        try:
            data, anc, _, _ = self.s.recvmsg(P.MAX_FRAME, socket.CMSG_SPACE(16))
        except ConnectionResetError:
            return None
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                for fd in array.array("i", payload[: len(payload) - len(payload) % 4]):
                    os.close(fd)
        return P.decode_reply(data) if data else None

    def call(self, data: bytes | P._Msg) -> P.Reply | None:
        self.send(data)
        return self.recv()

    def expect_error(self, data: bytes | P._Msg, code: str, match: str = "") -> str:
        r = self.call(data)
        assert isinstance(r, P.Error), r
        assert r.code == code, r
        assert match in r.message, r.message
        return r.message

    def close(self) -> None:
        self.s.close()


def still_serving(node) -> None:  # type: ignore[no-untyped-def]
    """A normal client can still put and get: the daemon survived."""
    c = gfaas.connect(node.credentials("g"))
    ref = c.put(np.arange(7))
    np.testing.assert_array_equal(c.get(ref), np.arange(7))
    c.delete(ref)
    c.close()


@pytest.fixture
def raw(node):  # type: ignore[no-untyped-def]
    conns: list[Raw] = []

    def make() -> Raw:
        conns.append(Raw(node.config.socket_path))
        return conns[-1]

    yield make
    for c in conns:
        c.close()
    still_serving(node)


GARBAGE = [b"\x00", b"\xff" * 10, b"\xc1", b"\x91\xa1\x80", b"hello daemon", os.urandom(200),
           b"\x92\xa3Get", b"\xdd\xff\xff\xff\xff"]


def test_garbage_frames_get_protocol_errors(node, raw) -> None:  # type: ignore[no-untyped-def]
    """Undecodable frames are answered with ProtocolError and the connection stays usable."""
    r = raw()
    for g in GARBAGE:
        r.expect_error(g, "ProtocolError", "malformed request frame")
    assert isinstance(r.call(P.Hello(node.inv.tokens["f"])), P.Welcome)
    for g in GARBAGE:
        r.expect_error(g, "ProtocolError", "malformed request frame")
    assert isinstance(r.call(P.MoreIds(1)), P.Ids)


WRONG_TYPES = [
    ["Get", 123], ["Get", "0" * 16], ["Get"], ["Nope", b"x" * 16], ["Lease", True], ["Lease", "big"],
    ["Seal", b"x" * 16, 0, 8, "raw", [8.5], None], ["OpenInvocation", "wf", "f"], ["Hello", None],
    {"Get": b"x" * 16}, "Stats", 7, None, [], ["Ok", []], ["Welcome", "n", "i", "f", [], 1, 1, 1],
    ["Error", "AccessDenied", "forged"],
]


@pytest.mark.parametrize("obj", WRONG_TYPES, ids=[repr(o)[:30] for o in WRONG_TYPES])
def test_valid_msgpack_of_wrong_types_is_rejected(node, raw, obj) -> None:  # type: ignore[no-untyped-def]
    """Well-formed MessagePack that is no request type (including reply types) gets ProtocolError."""
    r = raw()
    r.expect_error(msgspec.msgpack.encode(obj), "ProtocolError", "malformed request frame")
    assert isinstance(r.call(P.Hello(node.inv.tokens["f"])), P.Welcome)


def test_oversize_and_truncated_frames(node, raw) -> None:  # type: ignore[no-untyped-def]
    """Frames over 64 KiB are refused by size; truncated valid frames are malformed; the connection lives."""
    r = raw()
    assert isinstance(r.call(P.Hello(node.inv.tokens["f"])), P.Welcome)
    for n in (P.MAX_FRAME + 1, 100 * KiB, 200 * KiB):
        r.expect_error(b"\x90" * n, "ProtocolError", "exceeds the 65536-byte limit")
    big_valid = P.encode(P.Seal(b"x" * 16, 0, 8, "raw", [8], ["f"] * 40000))
    assert len(big_valid) > P.MAX_FRAME
    r.expect_error(big_valid, "ProtocolError", "exceeds")
    frame = P.encode(P.Allocate(1000, "<f8", [125], ["g"]))
    for cut in range(1, len(frame)):
        r.expect_error(frame[:cut], "ProtocolError", "malformed request frame")
    assert isinstance(r.call(frame), P.Allocated)


def test_empty_frame_closes_only_that_connection(node, raw) -> None:  # type: ignore[no-untyped-def]
    """A zero-length datagram reads as end-of-stream: that connection is closed, others are unaffected."""
    r1, r2 = raw(), raw()
    assert isinstance(r2.call(P.Hello(node.inv.tokens["g"])), P.Welcome)
    r1.send(b"")
    assert r1.recv() is None
    assert isinstance(r2.call(P.MoreIds(2)), P.Ids)


@pytest.mark.parametrize(
    "msg",
    [P.Get(b"x" * 16), P.Delete(b"x" * 16), P.Lease(8), P.MoreIds(4), P.Allocate(8, "raw", [8], None),
     P.SealAllocated(b"x" * 16)],
    ids=lambda m: type(m).__name__,
)
def test_function_requests_before_hello_are_refused(node, raw, msg) -> None:  # type: ignore[no-untyped-def]
    """Every function request on a connection without Hello gets AuthenticationError."""
    raw().expect_error(msg, "AuthenticationError", "has not presented function credentials")


@pytest.mark.parametrize(
    "msg", [P.Stats(), P.OpenInvocation("wf", ["f"]), P.EndInvocation("0" * 32)], ids=lambda m: type(m).__name__
)
def test_admin_requests_need_the_admin_token(node, raw, msg) -> None:  # type: ignore[no-untyped-def]
    """Admin requests on an unauthenticated or function connection get AuthenticationError."""
    r = raw()
    r.expect_error(msg, "AuthenticationError", "admin token")
    assert isinstance(r.call(P.Hello(node.inv.tokens["f"])), P.Welcome)
    r.expect_error(msg, "AuthenticationError", "admin token")


def test_hello_twice_and_bad_hello(node, raw) -> None:  # type: ignore[no-untyped-def]
    """A second Hello is a ProtocolError; a Hello with a bad token is an AuthenticationError."""
    r = raw()
    r.expect_error(P.Hello("0" * 32), "AuthenticationError", "unknown or revoked")
    r.expect_error(P.Hello("x" * 10000), "AuthenticationError", "unknown or revoked")
    assert isinstance(r.call(P.Hello(node.inv.tokens["f"])), P.Welcome)
    r.expect_error(P.Hello(node.inv.tokens["g"]), "ProtocolError", "already authenticated")


def test_async_seal_before_hello_is_reported_on_the_next_request(node, raw) -> None:  # type: ignore[no-untyped-def]
    """A Seal (no reply) without Hello is refused; the error comes back on the next synchronous request."""
    r = raw()
    r.send(P.Seal(b"x" * 16, 0, 8, "raw", [8], None))
    r.expect_error(P.Hello(node.inv.tokens["f"]), "AuthenticationError", "function credentials")
    assert isinstance(r.call(P.Hello(node.inv.tokens["f"])), P.Welcome)


def test_bad_seals_are_refused(node, raw) -> None:  # type: ignore[no-untyped-def]
    """Seals outside the leased slab, unaligned, of IDs not issued, or with bad metadata publish nothing."""
    r = raw()
    assert isinstance(r.call(P.Hello(node.inv.tokens["f"])), P.Welcome)
    ids = r.call(P.MoreIds(2))
    assert isinstance(ids, P.Ids)
    r.send(P.Seal(ids.ids[0], 0, 8, "raw", [8], None))  # no slab leased yet
    r.expect_error(P.MoreIds(1), "ProtocolError", "outside the free part")
    leased = r.call(P.Lease(64))
    assert isinstance(leased, P.Leased)
    oid = leased.ids[0]
    bad = [
        (P.Seal(oid, leased.size, 8, "raw", [8], None), "ProtocolError", "outside"),
        (P.Seal(oid, leased.size - 64, 128, "raw", [128], None), "ProtocolError", "outside"),
        (P.Seal(oid, 2**62, 8, "raw", [8], None), "ProtocolError", "outside"),
        (P.Seal(oid, -64, 8, "raw", [8], None), "ProtocolError", "outside"),
        (P.Seal(oid, 32, 8, "raw", [8], None), "ProtocolError", "outside"),
        (P.Seal(oid, 0, -8, "raw", [8], None), "ProtocolError", "object size -8"),
        (P.Seal(oid, 0, 8, "<f4", [1], None), "ProtocolError", "holds 4 bytes"),
        (P.Seal(oid, 0, 8, "<U2", [1], None), "ProtocolError", "'<U2'"),
        (P.Seal(oid, 0, 8, "raw", [8], ["nobody"]), "ConfigError", "not functions"),
        (P.Seal(os.urandom(16), 0, 8, "raw", [8], None), "InvalidDataRef", "not issued"),
        (P.Seal(b"short", 0, 8, "raw", [8], None), "InvalidDataRef", "not issued"),
    ]
    for msg, code, match in bad:
        r.send(msg)
        r.expect_error(P.MoreIds(1), code, match)
    st = node.stats()
    assert st["objects"] == 0
    # A correct seal after all that works, and the ID cannot be sealed twice.
    r.send(P.Seal(oid, 0, 8, "raw", [8], ["g"]))
    assert isinstance(r.call(P.MoreIds(1)), P.Ids)
    r.send(P.Seal(oid, 64, 8, "raw", [8], None))
    r.expect_error(P.MoreIds(1), "InvalidDataRef", "not issued")
    assert node.stats()["objects"] == 1
    assert bytes(node.connect("g").get(DataRef(oid, "n0"))) == b"\x00" * 8


def test_bad_allocations_and_ids(node, raw) -> None:  # type: ignore[no-untyped-def]
    """Oversize, negative or inconsistent allocations, bad ID lengths and double seals get precise errors."""
    r = raw()
    assert isinstance(r.call(P.Hello(node.inv.tokens["f"])), P.Welcome)
    r.expect_error(P.Allocate(2**62, "raw", [2**62], None), "CapacityError", "exceeds the whole pool")
    r.expect_error(P.Allocate(-1, "raw", [-1], None), "ProtocolError", "object size -1")
    r.expect_error(P.Allocate(8, "<f8", [2], None), "ProtocolError", "holds 16 bytes")
    r.expect_error(P.Allocate(8, "raw", [8], ["zz"]), "ConfigError", "not functions")
    r.expect_error(P.Lease(-1), "CapacityError", "asked for -1")
    r.expect_error(P.Lease(2**40), "CapacityError", "asked for 1099511627776")
    r.expect_error(P.MoreIds(0), "ProtocolError", "ask for 1-1024")
    r.expect_error(P.MoreIds(10**6), "ProtocolError", "ask for 1-1024")
    r.expect_error(P.Get(b"x" * 15), "InvalidDataRef", "16 bytes")
    r.expect_error(P.Get(b""), "InvalidDataRef", "16 bytes")
    r.expect_error(P.Delete(b"x" * 17), "InvalidDataRef", "16 bytes")
    r.expect_error(P.SealAllocated(os.urandom(16)), "AccessDenied", "seal refused")
    a = r.call(P.Allocate(100, "raw", [100], None))
    assert isinstance(a, P.Allocated)
    assert isinstance(r.call(P.SealAllocated(a.id)), P.Ok)
    r.expect_error(P.SealAllocated(a.id), "ObjectStateError", "already sealed")
    assert node.stats()["writing"] == 0 and node.stats()["objects"] == 1


def test_admin_garbage_is_refused(node, raw) -> None:  # type: ignore[no-untyped-def]
    """Invalid invocation requests from the admin get ConfigError/AuthenticationError; the registry is unchanged."""
    r = raw()
    with open(os.path.join(node.config.state_dir, "admin.token")) as fh:
        assert isinstance(r.call(P.AdminHello(fh.read().strip())), P.AdminWelcome)
    r.expect_error(P.OpenInvocation("bad wf", ["f"]), "ConfigError", "workflow name")
    r.expect_error(P.OpenInvocation("wf", []), "ConfigError", "got 0")
    r.expect_error(P.OpenInvocation("wf", ["f", "f"]), "ConfigError", "unique")
    r.expect_error(P.OpenInvocation("wf", ["f"], "xyz"), "ConfigError", "invocation_id")
    r.expect_error(P.OpenInvocation("wf", ["f", "g"], None, {"f": "1" * 32, "g": "1" * 32}), "ConfigError", "token")
    r.expect_error(P.EndInvocation("no such"), "AuthenticationError", "is not open")
    st = r.call(P.Stats())
    assert isinstance(st, P.StatsReply) and st.invocations == 1
    r.expect_error(P.AdminHello("0" * 32), "AuthenticationError", "wrong admin token")


def test_random_frames_fuzz_the_live_daemon(node, raw) -> None:  # type: ignore[no-untyped-def]
    """500 random frames (bytes and mutated valid frames), before and after Hello, each get an Error reply
    or close the connection; the daemon keeps serving throughout."""
    rng = random.Random(1234)
    valid = [P.encode(m) for m in (P.Get(b"x" * 16), P.Lease(64), P.Seal(b"x" * 16, 0, 8, "raw", [8], None),
                                   P.Allocate(8, "raw", [8], None), P.MoreIds(3), P.Stats(), P.Release([1, 2]))]
    r = raw()
    authed = False
    closed = 0
    for i in range(500):
        if i % 50 == 0 and not authed and rng.random() < 0.5:
            reply = r.call(P.Hello(node.inv.tokens["f"]))
            if isinstance(reply, P.Error):  # the error of an earlier asynchronous request comes first
                reply = r.call(P.Hello(node.inv.tokens["f"]))
            assert isinstance(reply, P.Welcome), reply
            authed = True
        if rng.random() < 0.5:
            data = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 64)))
        else:
            data = bytearray(rng.choice(valid))
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] = rng.getrandbits(8)
            data = bytes(data)
        r.send(data)
        try:
            msg: Any = P.decode_request(data)
        except gfaas.ProtocolError:
            msg = None
        if isinstance(msg, P.Seal | P.Release):
            continue  # asynchronous: no reply (an error is reported on the next request)
        reply = r.recv()
        if reply is None:  # the daemon may close a connection; it must not die
            closed += 1
            r = raw()
            authed = False
            continue
        assert not (isinstance(reply, P.Error) and "internal error" in reply.message), reply
        if msg is None:
            assert isinstance(reply, P.Error) and reply.code == "ProtocolError", reply
    assert closed <= 5
    still_serving(node)


def test_a_client_that_never_reads_replies_is_dropped_not_waited_for(node, raw) -> None:  # type: ignore[no-untyped-def]
    """A connection flooding requests without reading replies is cut off; other clients keep being served."""
    r = raw()
    assert isinstance(r.call(P.Hello(node.inv.tokens["f"])), P.Welcome)
    r.s.settimeout(0.5)
    frame = P.encode(P.MoreIds(1024))  # ~18 KiB per reply
    dropped = False
    t0 = time.monotonic()
    while time.monotonic() - t0 < 20:
        try:
            r.s.send(frame)
        except (BrokenPipeError, ConnectionResetError):
            dropped = True
            break
        except TimeoutError:
            still_serving(node)  # our send queue is full; the daemon still serves others
    assert dropped
    still_serving(node)


# ---- (e) a full pool ---------------------------------------------------------------------------
# No disk tier: these are about a full pool (test_elastic_daemon.py covers spilling).
@pytest.mark.node_config(capacity_bytes=4 * MiB, slab_bytes=256 * KiB, spill_capacity_bytes=0,
                         quota_reserved_bytes=4 * MiB)  # one tenant: the pool binds, not its quota
def test_full_pool_capacity_errors_name_sizes_and_recover(node) -> None:  # type: ignore[no-untyped-def]
    """When the pool is full, put raises CapacityError with the request, pool, used and free bytes;
    after freeing, the same put succeeds."""
    f, g = node.connect("f"), node.connect("g")
    a = f.put(np.zeros(3 * MiB, np.uint8))
    used = node.stats()["bytes_reserved"]
    assert used == 3 * MiB
    with pytest.raises(CapacityError) as ei:
        f.put(np.zeros(2 * MiB, np.uint8))
    assert str(ei.value).startswith(
        f"allocation of {2 * MiB} bytes failed on n0/host: pool {4 * MiB}, in use {used}, free {4 * MiB - used};")
    with pytest.raises(CapacityError, match=f"allocation of {5 * MiB} bytes on n0/host exceeds the whole pool of {4 * MiB}"):
        f.allocate(5 * MiB)
    assert node.stats()["writing"] == 0
    f.delete(a)
    b = f.put(np.ones(2 * MiB, np.uint8), consumers=["g"])
    assert int(g.get(b).sum()) == 2 * MiB
    c = f.put(np.ones(3 * MiB, np.uint8))
    assert node.stats()["bytes_reserved"] <= 4 * MiB
    f.delete(c)


# No disk tier: these are about a full pool (test_elastic_daemon.py covers spilling).
@pytest.mark.node_config(capacity_bytes=4 * MiB, slab_bytes=256 * KiB, spill_capacity_bytes=0,
                         quota_reserved_bytes=4 * MiB)  # one tenant: the pool binds, not its quota
def test_small_put_after_a_failed_slab_lease(node) -> None:  # type: ignore[no-untyped-def]
    """When a new slab cannot be leased, the put raises CapacityError, later small puts raise it too (never
    return a reference that does not exist), and after freeing they succeed."""
    f, g = node.connect("f"), node.connect("g")
    chunk = 60 * KiB  # under small_object_max (64 KiB): packed into slabs
    first = f.put(np.zeros(chunk, np.uint8))  # leases slab 1
    hog = f.put(np.zeros(4 * MiB - 256 * KiB - 128 * KiB, np.uint8))  # leaves 128 KiB: no room for a slab
    puts = [first]
    with pytest.raises(CapacityError, match="slab lease of 262144 bytes failed"):
        for _ in range(10):
            puts.append(f.put(np.full(chunk, len(puts), np.uint8)))
    assert len(puts) == 4  # 4 x 60 KiB fit in the 256 KiB slab, a fifth needs a new one
    for _ in range(3):
        with pytest.raises(CapacityError):
            f.put(b"tiny")  # would fit in the old slab, which the failed lease closed
    for i, ref in enumerate(puts):
        assert int(g.get(ref)[0]) == i
    f.delete(hog)
    ref = f.put(b"tiny")
    assert bytes(g.get(ref)) == b"tiny"
    assert node.stats()["objects"] == 5


# No disk tier: these are about a full pool (test_elastic_daemon.py covers spilling).
@pytest.mark.node_config(capacity_bytes=4 * MiB, slab_bytes=256 * KiB, spill_capacity_bytes=0,
                         quota_reserved_bytes=4 * MiB)  # one tenant: the pool binds, not its quota
def test_many_clients_filling_the_pool_recover(node) -> None:  # type: ignore[no-untyped-def]
    """Several clients racing for a full pool get CapacityErrors, never corruption; after end_invocation the
    pool is empty and usable."""
    clients = [node.connect(fn) for fn in ("f", "g", "h")]
    stored: list[tuple[gfaas.Client, DataRef, int]] = []
    errors = 0
    for i in range(60):
        c = clients[i % 3]
        try:
            stored.append((c, c.put(np.full(300 * KiB, i % 251, np.uint8)), i % 251))
        except CapacityError:
            errors += 1
    assert errors > 0 and len(stored) >= 10
    for c, ref, v in stored:
        arr = c.get(ref)
        assert arr.min() == v == arr.max()
    node.admin.end_invocation(node.inv)
    st = leak_view(node.stats())
    assert (st["objects"], st["segments"], st["bytes_reserved"]) == (0, 0, 0)
    inv = node.open()
    c = node.connect("f", inv)
    assert int(c.get(c.put(np.ones(3 * MiB, np.uint8))).sum()) == 3 * MiB


def test_clean_shutdown_removes_socket_and_pid_file(node) -> None:  # type: ignore[no-untyped-def]
    """SIGTERM stops the daemon within seconds and removes its socket and pid file; clients then get
    DaemonUnavailable."""
    c = node.connect("f")
    c.put(b"x")
    node.local.proc.terminate()
    assert node.local.proc.wait(10) == 0
    assert not os.path.exists(node.config.socket_path)
    assert not os.path.exists(os.path.join(node.config.state_dir, "daemon.pid"))
    with pytest.raises(DaemonUnavailable):
        c.get(DataRef(os.urandom(16), "n0"))
    with pytest.raises(DaemonUnavailable, match="no node daemon at"):
        gfaas.connect(node.credentials("f"))


def test_internal_error_in_an_asynchronous_request_does_not_desynchronise_replies(make_config, monkeypatch, thread_daemon) -> None:  # type: ignore[no-untyped-def]
    """If handling an asynchronous Seal fails with an unexpected exception, the client gets that error on
    its next call and every later call gets its own reply (no reply is sent for the Seal itself)."""
    from gfaas.dataplane.store import Store

    cfg = make_config()
    with thread_daemon(cfg):
        admin = gfaas.Admin(cfg.socket_path, state_dir=cfg.state_dir)
        inv = admin.open_invocation("wf", ["f", "g"])
        f, g = gfaas.connect(inv.credentials("f")), gfaas.connect(inv.credentials("g"))
        a = f.put(np.arange(3))
        b = f.put(np.arange(4))
        f.get(a)  # both seals are processed
        real = Store.seal_small
        calls = []

        def broken(self, *args, **kw):  # type: ignore[no-untyped-def]
            calls.append(1)
            raise RuntimeError("injected bug")

        monkeypatch.setattr(Store, "seal_small", broken)
        f.put(np.arange(5))  # its seal fails inside the daemon
        wait_for(lambda: calls == [1], what="the daemon to handle the seal")
        monkeypatch.setattr(Store, "seal_small", real)
        with pytest.raises(gfaas.DataPlaneError, match="internal error"):
            f.get(a)
        assert calls == [1]
        np.testing.assert_array_equal(f.get(b), np.arange(4))
        np.testing.assert_array_equal(f.get(a), np.arange(3))
        np.testing.assert_array_equal(g.get(b), np.arange(4))
        f.close()
        g.close()
        admin.close()
