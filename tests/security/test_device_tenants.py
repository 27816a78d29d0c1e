"""Issue 37, row 2: a GPU function must not reach another tenant's device objects through an IPC handle.

A CUDA IPC handle names a whole ``cudaMalloc`` allocation, and the daemon's pool serves objects as
blocks of large arenas: when two workflows' objects shared an arena, a function that opened the
handle of its own object had the other workflow's object mapped too, read-write, at another offset.

The daemon here models its GPUs (``devices='null:0,1'``); the function side is the real
``CudaMapper`` over the fake CUDA runtime, whose ``ipcOpenMemHandle`` maps one memory region per
handle for every process that opens it, as CUDA maps one allocation. So the attack is played with
bytes: the attacker maps the arena its own buffer lives in and scans all of it for the victim's.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gfaas.config import MiB
from gfaas.dataplane import device_client

sys.path.insert(0, str(Path(__file__).parents[1] / "support"))
from fake_cuda import FakeCupy, FakeRuntime  # noqa: E402

pytestmark = pytest.mark.node_config(devices="null:0,1", device_capacity_bytes=512 * MiB)

ARENA = 64 * MiB  # the daemon's default arena size: what one handle maps


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRuntime]:
    rt = FakeRuntime()
    monkeypatch.setattr(device_client, "_process_mapper", None)
    monkeypatch.setattr(device_client, "_cupy", lambda: FakeCupy(rt))
    yield rt
    rt.close()


def _handles_seen(client: Any) -> list[Any]:
    """Record the device references the daemon hands ``client`` (what its process maps)."""
    seen: list[Any] = []
    real = client._device_view

    def spy(ref: Any, *args: Any) -> Any:
        seen.append(ref)
        return real(ref, *args)

    client._device_view = spy
    return seen


def test_an_ipc_handle_maps_no_other_workflows_device_objects(node: Any, fake_gpu: FakeRuntime) -> None:
    secret = np.random.default_rng(37).integers(1, 256, 4096, dtype=np.uint8).tobytes()
    victim = node.connect("v", inv=node.open(("v", "w"), workflow="victim"))
    vbuf = victim.allocate(len(secret), np.uint8, consumers=["w"], device=0)
    ctypes.memmove(vbuf.view.ptr, secret, len(secret))
    vbuf.seal()

    attacker = node.connect("a", inv=node.open(("a", "b"), workflow="attacker"))
    seen = _handles_seen(attacker)
    abuf = attacker.allocate(4096, np.uint8, consumers=["b"], device=0)
    ctypes.memset(abuf.view.ptr, 0, 4096)
    (ref,) = seen
    base = fake_gpu.ipcOpenMemHandle(ref.handle)  # all the attacker's handle maps
    mapped = ctypes.string_at(base, ARENA)
    leaked = secret in mapped
    assert not leaked, "the attacker's IPC handle maps the victim's object"

    # The victim's own next object still shares its arena (the pool's point), and the attacker's
    # second one shares the attacker's.
    vseen = _handles_seen(victim)
    victim.allocate(64, np.uint8, consumers=["w"], device=0).seal()
    attacker.allocate(64, np.uint8, consumers=["b"], device=0).seal()
    assert vseen[0].handle != ref.handle and seen[1].handle == ref.handle
