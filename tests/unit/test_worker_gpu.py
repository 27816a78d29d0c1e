"""How a function on a CUDA GPU moves its data, with a recording transport and fake device tensors
(no GPU or torch needed): device passing asks the node for inputs on its GPU and stores device
outputs in the GPU pool; host passing, results for the client and a node without a pool for that
GPU go through host memory."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from gfaas.dataplane.device_array import DeviceArray
from gfaas.runtime import worker
from gfaas.runtime.worker import GATEWAY, FunctionHost, Init, Task

SPEC = """
name: dev
inputs: {x: {dtype: float32, shape: [-1]}}
outputs: {out: b.y}
functions:
  - {name: a, kind: gpu, handler: "gpu_handlers:on_device", inputs: {x: input.x}, outputs: {y: {dtype: float32, shape: [-1]}}}
  - {name: b, kind: gpu, handler: "gpu_handlers:on_device", inputs: {x: a.y}, outputs: {y: {dtype: float32, shape: [-1]}}}
"""


class _Dtype:
    def __str__(self) -> str:
        return "torch.float32"


class FakeTensor:
    """A CUDA tensor as DeviceArray sees it: metadata, DLPack device, a host copy on request."""

    def __init__(self, host: np.ndarray, device: int = 0) -> None:
        self.host, self.ordinal = host, device
        self.shape, self.dtype = host.shape, _Dtype()

    def dim(self) -> int:
        return self.host.ndim

    def numel(self) -> int:
        return self.host.size

    def element_size(self) -> int:
        return self.host.itemsize

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, self.ordinal)

    def contiguous(self) -> FakeTensor:
        return self

    def detach(self) -> FakeTensor:
        return self

    def cpu(self) -> FakeTensor:
        return self

    def numpy(self) -> np.ndarray:
        return self.host


class Recorder:
    def __init__(self, devices: frozenset[int]) -> None:
        self.devices = devices
        self.calls: list[tuple[Any, ...]] = []
        self.deadlines: list[float | None] = []

    def get(self, ref: str, deadline_s: float | None = None, device: int | None = None) -> Any:
        self.calls.append(("get", ref, device))
        self.deadlines.append(deadline_s)
        host = np.arange(4, dtype=np.float32)
        return FakeTensor(host, device) if device is not None else host

    def put(self, value: Any, consumers: Any) -> str:
        self.calls.append(("put", type(value).__name__, list(consumers)))
        return "ref"

    def close(self) -> None:
        pass


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(__file__), "..", "support"))
    monkeypatch.setattr(worker, "_device_array", lambda obj: obj if isinstance(obj, DeviceArray) else DeviceArray(obj))
    uploads: list[int] = []

    def upload(arr: Any, cuda: int) -> DeviceArray:
        uploads.append(cuda)
        return DeviceArray(FakeTensor(np.array(arr), cuda))

    monkeypatch.setattr(worker, "_upload", upload)

    def make(passing: str, device: str = "cuda:1", spec: str = SPEC) -> tuple[FunctionHost, list[int]]:
        return FunctionHost(Init("dev", "a", spec, device=device, gpu="gpu1", gpu_passing=passing)), uploads
    return make


def _task(consumers: list[str], deadline_s: float = 0.0) -> Task:
    return Task("inv", "tok", {"x": "r0"}, [], {"y": consumers}, deadline_s=deadline_s)


def test_device_passing_reads_on_the_gpu_and_stores_in_its_pool(host: Any) -> None:
    h, uploads = host("device")
    t = Recorder(frozenset({1}))
    done = h._call(t, _task(["b"]))
    assert isinstance(done, worker.Done)
    assert t.calls == [("get", "r0", 1), ("put", "FakeTensor", ["b"])]  # the tensor itself, not a host copy
    assert uploads == []


@pytest.mark.parametrize("passing", ["device", "host"])
def test_a_gpu_get_carries_the_functions_input_deadline(host: Any, passing: str) -> None:
    """The node's copy onto the GPU (or to the host, for host passing) is given what is left of the
    task's input deadline, as a CPU function's get is: the staging engine plans by it."""
    h, _ = host(passing)
    t = Recorder(frozenset({1}))
    h._call(t, _task(["b"], deadline_s=5.0))
    (d,) = t.deadlines
    assert d is not None and 0 < d <= 5.0
    h._call(t, _task(["b"]))  # no estimate yet: best effort
    assert t.deadlines[1] is None


def test_results_for_the_client_leave_through_the_host(host: Any) -> None:
    h, _ = host("device")
    t = Recorder(frozenset({1}))
    h._call(t, _task([GATEWAY]))
    assert t.calls == [("get", "r0", 1), ("put", "ndarray", [GATEWAY])]


def test_host_passing_copies_up_and_down_in_the_function(host: Any) -> None:
    h, uploads = host("host")
    t = Recorder(frozenset({1}))
    h._call(t, _task(["b"]))
    assert t.calls == [("get", "r0", None), ("put", "ndarray", ["b"])]
    assert uploads == [1]


def test_a_node_without_a_pool_for_the_gpu_passes_through_the_host(host: Any) -> None:
    h, uploads = host("device")
    t = Recorder(frozenset({0}))  # the node pools GPU 0 only; this function runs on GPU 1
    h._call(t, _task(["b"]))
    assert t.calls == [("get", "r0", None), ("put", "ndarray", ["b"])]
    assert uploads == [1]


def test_on_the_cpu_device_gets_are_host_gets(host: Any) -> None:
    h, uploads = host("device", device="cpu")
    t = Recorder(frozenset({1}))
    h._call(t, _task(["b"]))
    assert t.calls == [("get", "r0", None), ("put", "ndarray", ["b"])] and uploads == []


def test_device_outputs_are_checked_against_the_spec(host: Any) -> None:
    h, _ = host("device", spec=SPEC.replace("x: input.x}, outputs: {y: {dtype: float32", "x: input.x}, outputs: {y: {dtype: int64"))
    with pytest.raises(Exception, match="dtype float32 where int64 is declared"):
        h._call(Recorder(frozenset({1})), _task(["b"]))


def test_a_cuda_functions_bind_prefetches_its_stored_inputs_only() -> None:
    """The runtime's Bind for a task of a CUDA function names the IDs of its stored inputs (so those on
    its GPU come back located: Bind.prefetch); carried values and other functions' tasks name none."""
    import types

    from gfaas.dataplane.ids import DataRef, new_id

    a, b = DataRef(new_id(), "n1"), DataRef(new_id(), "n1")
    task = Task("inv", "tok", {"x": str(a), "y": worker.INLINE + "y", "z": str(b), "w": "not a ref"}, [], {})
    w = worker.ProcessWorker.__new__(worker.ProcessWorker)
    w._init = types.SimpleNamespace(device="cuda:1")  # type: ignore[assignment]
    assert w._prefetch(task) == [a.id, b.id]
    w._init = types.SimpleNamespace(device="cpu")  # type: ignore[assignment]
    assert w._prefetch(task) == []
