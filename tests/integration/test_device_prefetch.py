"""A task's GPU inputs handed over located with its Bind (``Bind.prefetch``), so its same-GPU get needs
no round trip of its own, with a daemon whose GPUs are modelled (``devices='null:0,1'``).

What is checked: the get sends nothing at all; only objects this function may read and that live on a
GPU are located (the rest go through the daemon's precise answer); a prefetched object counts as read
when the task reads it or when its binding ends, once; bad prefetch lists are refused.
"""

from __future__ import annotations

import os
import queue
import socket
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gfaas import AccessDenied
from gfaas.config import MiB
from gfaas.dataplane import protocol as P
from gfaas.dataplane.client import Binder, Client
from gfaas.dataplane.device_client import DeviceView

sys.path.insert(0, str(Path(__file__).parent))
from test_dataplane_attached import attached, spy_requests  # noqa: E402
from test_device_objects import FakeMapper  # noqa: E402

pytestmark = [pytest.mark.timeout(60), pytest.mark.node_config(devices="null:0,1", device_capacity_bytes=512 * MiB)]


def _worker(node: Any) -> tuple[Binder, Client]:
    """The platform's Binder and the worker's client on one attached connection (as the runtime has)."""
    sock, welcome = node.admin.attach_socket()
    binder = Binder(sock, welcome, node.config.socket_path)
    worker = Client(node.config.socket_path, None, sock=socket.socket(fileno=os.dup(sock.fileno())), welcome=welcome,
                    device_mapper=FakeMapper())
    return binder, worker


def _device_object(node: Any, consumers: list[str], device: int = 0) -> Any:
    prod = node.connect("f", device_mapper=FakeMapper())
    return prod.allocate((256, 1024), np.float32, consumers=consumers, device=device).seal()


def test_a_prefetched_same_gpu_get_sends_nothing_and_counts_the_read_once(node: Any) -> None:
    ref = _device_object(node, ["g"])
    binder, worker = _worker(node)
    binder.bind(node.inv.tokens["g"], prefetch=[ref.id])
    worker.expect_binding(node.inv.id)
    sent, real = spy_requests(worker)
    v = worker.get(ref, device=0)
    assert sent == []  # not even the Get: the Bound reply had it located
    assert isinstance(v, DeviceView) and (v.device, v.shape, v.readonly) == (0, (256, 1024), True)
    assert worker.prefetched_gets == 1
    worker._ch.sock = real
    st = node.stats()
    assert st["prefetched"] == 1 and st["objects"] == 1  # its read counts when the task's binding ends
    del v
    worker.end_task()
    binder.unbind()
    assert node.stats()["objects"] == 0  # read by g, its only consumer: freed
    binder.close()
    worker.close()


def test_a_second_get_of_a_prefetched_object_goes_to_the_daemon_and_the_read_counts_once(node: Any) -> None:
    ref = _device_object(node, ["g", "h"])
    binder, worker = _worker(node)
    binder.bind(node.inv.tokens["g"], prefetch=[ref.id])
    worker.expect_binding(node.inv.id)
    sent, real = spy_requests(worker)
    first = worker.get(ref, device=0)
    second = worker.get(ref, device=0)  # the prefetched answer (and its pin) was the first view's
    assert sent == ["Get"] and first.ptr == second.ptr
    worker._ch.sock = real
    worker.end_task()
    binder.unbind()
    assert node.stats()["objects"] == 1  # g's read counted once (by its Get, not again at the end): h's due
    node.connect("h", device_mapper=FakeMapper()).get(ref)
    assert node.stats()["objects"] == 0
    binder.close()
    worker.close()


def test_a_prefetched_object_the_task_never_read_counts_as_read_when_its_binding_ends(node: Any) -> None:
    only_g, g_and_h = _device_object(node, ["g"]), _device_object(node, ["g", "h"])
    binder, worker = _worker(node)
    binder.bind(node.inv.tokens["g"], prefetch=[only_g.id, g_and_h.id])
    worker.expect_binding(node.inv.id)
    worker.end_task()  # reads the Bound reply; nothing was read
    binder.unbind()
    assert node.stats()["objects"] == 1  # only_g freed (g was its one reader); g_and_h waits for h
    v = node.connect("h", device_mapper=FakeMapper()).get(g_and_h)
    assert v.shape == (256, 1024)
    binder.close()
    worker.close()


def test_prefetch_locates_only_gpu_objects_the_function_may_read(node: Any) -> None:
    """An object for h alone and a host object: neither comes back located for g (the first would tell
    g about an object it may not read); g's gets of them take the daemon's answer, the refusal included."""
    for_h = _device_object(node, ["h"])
    host = node.connect("f").put(np.arange(4), consumers=["g"])
    raw = attached(node)
    r = raw.call(P.Bind(node.inv.tokens["g"], prefetch=[for_h.id, host.id, bytes(16)]))
    assert isinstance(r, P.Bound) and r.located == []
    raw.close()
    binder, worker = _worker(node)
    binder.bind(node.inv.tokens["g"], prefetch=[for_h.id, host.id])
    worker.expect_binding(node.inv.id)
    with pytest.raises(AccessDenied):
        worker.get(for_h)
    np.testing.assert_array_equal(worker.get(host), np.arange(4))
    assert worker.prefetched_gets == 0 and node.stats()["prefetched"] == 0
    binder.close()
    worker.close()


def test_a_get_elsewhere_than_the_object_lives_takes_the_daemons_delivery(node: Any) -> None:
    ref = _device_object(node, ["g"], device=1)
    binder, worker = _worker(node)
    binder.bind(node.inv.tokens["g"], prefetch=[ref.id])
    worker.expect_binding(node.inv.id)
    v = worker.get(ref, device=0)  # it lives on GPU 1: a peer copy, through the daemon
    assert v.device == 0 and worker.prefetched_gets == 0
    assert node.stats()["deliveries_to_device"] == 1
    binder.close()
    worker.close()


def test_bad_prefetch_lists_are_refused(node: Any) -> None:
    raw = attached(node)
    for ids, why in (([bytes(16)] * (P.MAX_PREFETCH + 1), f"give at most {P.MAX_PREFETCH}"), ([b"abc"], "each of 16 bytes")):
        r = raw.call(P.Bind(node.inv.tokens["g"], prefetch=ids))
        assert isinstance(r, P.Error) and r.code == "ProtocolError" and why in r.message, r
    assert isinstance(raw.call(P.Bind(node.inv.tokens["g"])), P.Bound)  # the connection still serves
    raw.close()


class _Threads:
    """``bound_gets``'s process context, as threads: the consumer shares this process's fake mapper."""

    Queue = queue.Queue

    class Process(threading.Thread):
        def __init__(self, target: Any, args: tuple[Any, ...]) -> None:
            super().__init__(target=target, args=args, daemon=True)


def test_the_gpu_benchmarks_bound_get_row_is_served_with_no_round_trip(node: Any) -> None:
    """``gfaas bench dataplane --gpu``'s ``gfaas-ipc-bound`` rows, on a modelled GPU: each round's get
    is served from its Bind's prefetch (GPU time is rare, so the code that will run there runs here)."""
    from gfaas.bench import gpu

    prod = node.connect("f", device_mapper=FakeMapper())

    def put() -> Any:
        return prod.allocate((1024,), np.float32, consumers=["g"], device=0).seal()

    class Inv:  # the bench names the consumer "c"; the harness's functions are f, g, h
        id = node.inv.id
        tokens = {"c": node.inv.tokens["g"]}

    # A reader that asks for the object wherever it lives (device=None) or on the host takes the
    # daemon's answer, as before: the prefetch serves GPU readers only.
    binder, worker = _worker(node)
    ref = put()
    binder.bind(node.inv.tokens["g"], prefetch=[ref.id])
    worker.expect_binding(node.inv.id)
    worker.get(ref)
    assert worker.prefetched_gets == 0
    worker.end_task()
    binder.unbind()
    binder.close()
    worker.close()
    before = node.stats()["prefetched"]
    gets = gpu.bound_gets(node.admin, Inv, put, 6, _Threads, FakeMapper())
    assert len(gets) == 6 and all(served for *_, served in gets)
    assert node.stats()["prefetched"] == before + 6 and node.stats()["objects"] == 0  # each read counted
    row = gpu.ipc_row(4096, [(secs, opened) for secs, opened, _ in gets])
    assert row["cold_gets"] == 1  # the arena is opened once, by the first get
