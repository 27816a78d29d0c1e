"""The worker's native per-task path (gfaas_native.WorkerCore, worker_native) against the Python
FunctionHost it stands in for: the same tasks replayed into both give the same replies, field by field
(timings aside) and as the bytes msgspec encodes, and the cases it does not run go to Python."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gfaas.errors import ConfigError, DaemonUnavailable
from gfaas.native import native_class
from gfaas.runtime import worker as wmod
from gfaas.runtime import worker_native
from gfaas.runtime.worker import Done, Failed, FunctionHost, Init, Task, to_value

pytestmark = [pytest.mark.usefixtures("rt_handlers"),
              pytest.mark.skipif(native_class("WorkerCore") is None, reason="gfaas_native is not built")]

SPEC = """
name: nat
inputs: {n: {dtype: int64, shape: []}}
outputs: {total: red.total, b: boom.y, s: strict.y, l: loose.y, t: tamper.y}
functions:
  - {name: gen, kind: cpu, handler: "native_handlers:gen", inputs: {n: input.n},
     outputs: {x: {dtype: float32, shape: [-1]}}}
  - {name: scale, kind: cpu, handler: "native_handlers:scale", params: {k: 3}, inputs: {x: gen.x},
     outputs: {x: {dtype: float32, shape: [-1]}, big: {dtype: bool, shape: []}}}
  - {name: red, kind: cpu, handler: "native_handlers:red", inputs: {x: scale.x},
     outputs: {total: {dtype: float32, shape: []}, count: {dtype: int64, shape: []}}}
  - {name: boom, kind: cpu, handler: "native_handlers:boom", inputs: {n: input.n}, outputs: {y: null}}
  - {name: strict, kind: cpu, handler: "native_handlers:anyout", inputs: {n: input.n},
     outputs: {y: {dtype: float64, shape: [2, -1]}}}
  - {name: loose, kind: cpu, handler: "native_handlers:anyout", inputs: {n: input.n}, outputs: {y: null}}
  - {name: tamper, kind: cpu, handler: "native_handlers:tamper", inputs: {n: input.n}, outputs: {y: null}}
"""
TIMINGS = ("host_get_s", "fn_get_s", "compute_s", "put_s", "host_put_s", "busy_s")


class _Link:  # a lazy task that needs nothing from the data plane never touches it
    devices: tuple[int, ...] = ()
    closed = False


def _no_data() -> None:
    raise DaemonUnavailable("no data plane in this test")


class _Worker:
    """A worker's hosts (its own function and its chain's), on one path, run as worker._serve does."""

    def __init__(self, fn: str, follow: list[str], native: bool) -> None:
        init = Init("nat", fn, SPEC, follow=follow)
        self.host = FunctionHost(init)
        self.host.link = _Link()
        self.hosts = wmod._load_followers(init, _Link())
        self.python_calls = 0  # tasks (a chain's too) that went to the Python path
        for h in (self.host, *self.hosts.values()):
            if native:
                h.use_native()
                assert h.core is not None
            run = h.run

            def counted(*a: Any, _run: Any = run, **kw: Any) -> Any:
                self.python_calls += 1
                return _run(*a, **kw)

            h.run = counted  # type: ignore[method-assign]

    def reply(self, task: Task) -> bytes:
        task = msgspec.msgpack.decode(msgspec.msgpack.encode(task), type=Task)  # as it arrives
        asked = [False]
        reply = self.host.serve(task, None, _no_data, hold=wmod._holdable(task, self.hosts), asked=asked)
        if task.then is not None and type(reply) is Done:  # its chain: _follow, or the core's twin of it
            wmod._chain(self.host, reply, task, self.hosts, None, None, asked)  # type: ignore[arg-type]
        return wmod._enc.encode(reply)


# how each path calls in (and the Python path's getter, whose frame the native getter has no twin of)
_ENTRIES = (" in run", " in _run", " in _call", " in _native_settle", " in getter")


def _cut(trace: str) -> str:
    """A traceback without the frames through which each path enters the handler or the checks (the
    Python path's run/_run/_call and getter, the native one's _native_settle): the rest must be the same."""
    head, frames, cur = [], [], None
    for line in trace.splitlines(keepends=True):
        if line.startswith('  File "'):
            cur = [line]
            frames.append(cur)
        elif cur is None:
            head.append(line)
        else:
            cur.append(line)
    return "".join(head + [ln for f in frames if not f[0].rstrip().endswith(_ENTRIES) for ln in f])


def _zeroed(reply: Any) -> Any:
    """A decoded reply with its timings zeroed and its traceback cut (:func:`_cut`)."""
    if type(reply) is Failed:
        return msgspec.structs.replace(reply, trace=_cut(reply.trace))
    nxt = _zeroed(reply.next) if reply.next is not None else None
    return msgspec.structs.replace(reply, next=nxt, **{k: 0.0 for k in TIMINGS})


def _same(fn: str, task: Task, follow: list[str] | None = None, native_runs: bool = True) -> Any:
    """Replay ``task`` into both paths; their replies must match, field by field (as msgspec decodes
    them) and byte for byte (timings zeroed). The decoded native reply."""
    py, nat = _Worker(fn, follow or [], False), _Worker(fn, follow or [], True)
    a, b = (_zeroed(wmod._dec.decode(w.reply(task))) for w in (py, nat))
    assert type(a) is type(b)
    assert msgspec.to_builtins(a) == msgspec.to_builtins(b)
    assert wmod._enc.encode(a) == wmod._enc.encode(b)
    if native_runs:
        assert nat.python_calls == 0, "the native path handed a common task to Python"
    return b


def _task(fn: str, n: int = 256, inline_max: int = 1 << 20, **kw: Any) -> Task:
    kw.setdefault("consumers", {"x": ["gateway"]})
    return Task(f"inv-{fn}", "", {"n": "inline:n"}, ["n"], values={"n": to_value(np.asarray(n, np.int64))},
                inline_max=inline_max, lazy=True, **kw)


def _then(fn: str, consumers: dict[str, list[str]], then: Task | None = None) -> Task:
    return Task(f"inv-{fn}", "", {"x": "inline:x"}, [], consumers, function=fn, carry={"x": "x"},
                inline_max=1 << 20, lazy=True, then=then)


def test_single_task() -> None:
    r = _same("gen", _task("gen"))
    assert type(r) is Done and r.values["x"].shape == [256]


def test_tiny_chain() -> None:
    red = _then("red", {"total": ["gateway"]})
    scale = Task("inv-scale", "", {"x": "inline:x"}, [], {"x": ["red"], "big": ["gateway"]}, function="scale",
                 carry={"x": "x"}, inline_max=1 << 20, lazy=True)
    two = _same("gen", _task("gen", consumers={"x": ["scale"]}, then=scale), ["scale"])
    assert type(two.next) is Done and two.values == {}  # only scale, here, read it
    three = _same("gen", _task("gen", consumers={"x": ["scale"]},
                               then=msgspec.structs.replace(scale, then=red)), ["scale", "red"])
    assert type(three.next.next) is Done and set(three.next.next.scalars) == {"total", "count"}


def test_held_over_the_inline_limit() -> None:
    """An output over the limit that only the chain's next function reads is held, not stored."""
    red = _then("red", {"total": ["gateway"]})
    scale = _then("scale", {"x": ["red"], "big": ["gateway"]}, red)
    r = _same("gen", _task("gen", inline_max=64, consumers={"x": ["scale"]}, then=scale), ["scale", "red"])
    assert type(r.next) is Done and r.values == {}


def test_inline_limit_exact_and_over() -> None:
    r = _same("gen", _task("gen", n=16, inline_max=64))
    assert "x" in r.values
    r = _same("gen", _task("gen", n=17, inline_max=64), native_runs=False)  # stored: NeedData, Python
    assert type(r) is Failed and r.error == "DaemonUnavailable"


def test_handler_raises() -> None:
    r = _same("boom", _task("boom", consumers={"y": ["gateway"]}))
    assert type(r) is Failed and r.error == "ValueError" and "boom: the handler failed" in r.message
    assert "native_handlers.py" in r.trace


@pytest.mark.parametrize("out", [
    {"y": np.zeros((2, 3), np.float32)},  # wrong dtype
    {"y": np.zeros((3, 3))},  # wrong shape
    {"y": np.zeros((2, 3)), "z": np.zeros(1)},  # undeclared
    {},  # missing
    [np.zeros((2, 3))],  # not a dict
    {"y": np.array([None, 1], dtype=object)},  # not numeric
    {"y": [[1.0, 2.0], [3.0, 4.0]]},  # a list that fits: made an array by the Python path
])
def test_outputs_off_the_common_case(out: Any) -> None:
    from native_handlers import NEXT

    NEXT["out"] = out
    r = _same("strict", _task("strict", consumers={"y": ["gateway"]}), native_runs=False)
    if isinstance(out, dict) and set(out) != {"y"} or not isinstance(out, dict):
        assert type(r) is Failed and r.error == "SpecError"


@pytest.mark.parametrize("value", [3, 2.5, True, np.float32(1.5), np.int8(-3), np.bool_(False),
                                   np.asarray(7, np.uint16), np.complex64(1 + 2j)])
def test_scalar_outputs(value: Any) -> None:
    """Scalars come back as values and, but for complex ones, in Done.scalars (when: conditions)."""
    from native_handlers import NEXT

    NEXT["out"] = {"y": value}
    r = _same("loose", _task("loose", consumers={"y": ["gateway"]}))
    assert type(r) is Done and ("y" in r.scalars) == (np.asarray(value).dtype.kind != "c")


def test_a_tampered_context_fails_the_task_only() -> None:
    r = _same("tamper", _task("tamper", consumers={"y": ["gateway"]}), native_runs=False)
    assert type(r) is Failed and r.error == "TypeError"


def test_unread_outputs_are_only_checked() -> None:
    from native_handlers import NEXT

    NEXT["out"] = {"y": np.zeros((2, 2))}
    r = _same("strict", _task("strict", consumers={}))
    assert type(r) is Done and r.values == {} and r.outputs == {}


def test_not_the_common_case_goes_to_python() -> None:
    """A task with a stored input, a bound task and an eager one run on the Python path."""
    nat = _Worker("gen", [], True)
    stored = _task("gen")
    stored.inputs = {"n": "ref:somewhere"}
    for task in (stored, msgspec.structs.replace(_task("gen"), bound=True),
                 msgspec.structs.replace(_task("gen"), lazy=False)):
        nat.python_calls = 0
        nat.reply(task)
        assert nat.python_calls == 1


_DTYPES = st.sampled_from(["float64", "float32", "float16", "int8", "int64", "uint16", "bool", "complex64"])
_SHAPES = st.lists(st.integers(0, 4), max_size=3)


@settings(max_examples=60, deadline=None)
@given(dtype=_DTYPES, shape=_SHAPES, transpose=st.booleans(), limit=st.sampled_from([0, 8, 64, 1 << 20]),
       strict=st.booleans())
def test_random_outputs(dtype: str, shape: list[int], transpose: bool, limit: int, strict: bool) -> None:
    """Any numeric array, contiguous or not, against a declaration it may or may not fit."""
    from native_handlers import NEXT

    arr = (np.arange(int(np.prod(shape)), dtype=np.float64) % 5).astype(dtype).reshape(shape)
    NEXT["out"] = {"y": arr.T if transpose else arr}
    fn = "strict" if strict else "loose"
    _same(fn, _task(fn, inline_max=limit, consumers={"y": ["gateway"]}), native_runs=False)


def test_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GFAAS_WORKER_CORE", "python")
    assert worker_native.chosen_core() == "python"
    monkeypatch.setenv("GFAAS_WORKER_CORE", "native")
    assert worker_native.chosen_core() == "native"
    monkeypatch.delenv("GFAAS_WORKER_CORE")
    assert worker_native.chosen_core() == "native"
    monkeypatch.setenv("GFAAS_WORKER_CORE", "rust")
    with pytest.raises(ConfigError, match="'native', 'python'"):
        worker_native.chosen_core()


@pytest.mark.parametrize(("value", "outcome"), [
    (wmod.Value("<i8", [], b"\0" * 7), "SpecError"),  # a byte short
    (wmod.Value("<i8", [2], b"\0" * 8), "SpecError"),  # a shape that wants more bytes
    (wmod.Value("<i8", [-1], b"\0" * 8), "SpecError"),  # a negative size
    (wmod.Value("<i8", [1 << 62, 4], b"\0" * 8), "SpecError"),  # sizes whose product overflows
    (wmod.Value("<i8", [1] * 33, b"\0" * 8), "SpecError"),  # too many dimensions
    (wmod.Value("|O", [], b"\0" * 8), "SpecError"),  # objects
    (wmod.Value("<U2", [], b"\0" * 8), "SpecError"),  # not numeric
    (wmod.Value("nope", [], b"\0" * 8), "SpecError"),  # not a dtype
    (wmod.Value("<i8", [1, 1], b"\1" + b"\0" * 7), "TypeError"),  # a (1, 1) array: gen's int() refuses it
    (wmod.Value(">i8", [], b"\0" * 7 + b"\1"), "done"),  # big-endian, checked by Python first, then cached
    (wmod.Value("<i8", [], b"\3" + b"\0" * 7), "done"),
])
def test_carried_values_checked_as_python_checks_them(value: wmod.Value, outcome: str) -> None:
    """The native getter reads a carried Value itself only where the Python path would raise nothing
    (a dtype worker._value_dtype accepted, sizes that fit its bytes): any other Value goes to the
    Python reader, so the handler sees the same array or the same error."""
    task = _task("gen", consumers={"x": ["gateway"]})
    task.values = {"n": value}
    for _ in range(2):  # the first may find the dtype unchecked yet; the second finds it cached
        r = _same("gen", task)
        if outcome == "done":
            assert type(r) is Done and r.values["x"].shape == [int(wmod.from_value(value))]
        else:
            assert type(r) is Failed and r.error == outcome, r


def test_native_context_is_contexts_own() -> None:
    """The native core makes each task's Context without its __init__: every slot must hold what
    Context(...) would have put there (a slot __init__ gains and the core does not set fails here),
    params a dict of the task's own."""
    seen: dict[bool, list[Any]] = {False: [], True: []}
    for native in (False, True):
        host = FunctionHost(Init("nat", "scale", SPEC))
        host.link = _Link()
        handler = host.handler

        def record(ctx: Any, inputs: Any, _h: Any = handler, _seen: list[Any] = seen[native]) -> Any:
            _seen.append((ctx, {s: getattr(ctx, s) for s in ctx.__slots__}))
            ctx.params["k"] = 5  # function code may change its params: the next task must not see it
            return _h(ctx, inputs)

        host.handler = record
        if native:
            host.use_native()
        for i in range(2):
            task = _then("scale", {"x": ["gateway"], "big": ["gateway"]})
            task.invocation = f"inv-{i}"
            task.values = {"x": to_value(np.arange(4, dtype=np.float32))}
            assert type(host.serve(task, None, _no_data, asked=[False])) is Done
    for (py_ctx, py), (nat_ctx, nat) in zip(seen[False], seen[True], strict=True):
        assert type(nat_ctx) is type(py_ctx)
        assert set(nat) == set(py) == set(type(py_ctx).__slots__)
        assert type(nat["_getter"]).__name__ == "CarriedGetter"
        del py["_getter"], nat["_getter"]
        assert nat == py
        assert nat["params"] == {"k": 5}  # as changed by the handler, in a dict of its own
    assert seen[True][0][0].params is not seen[True][1][0].params
    assert [c.invocation for c, _ in seen[True]] == ["inv-0", "inv-1"]


def _boom_then() -> Task:
    return Task("inv-boom", "", {"n": "inline:n"}, [], {"y": ["gateway"]}, function="boom", carry={"n": "x"},
                inline_max=1 << 20, lazy=True)


@pytest.mark.parametrize(("follow", "consumers", "then", "ran"), [
    # the follower fails: its Failed in next, the value it was to read stays in the first reply
    (["boom"], {"x": ["boom"]}, _boom_then(), 1),
    # a follower this worker did not load: the chain ends before it
    ([], {"x": ["red"]}, _then("red", {"total": ["gateway"]}), 0),
    # a carry that names no output: the chain ends before it
    (["red"], {"x": ["red"]}, msgspec.structs.replace(_then("red", {"total": ["gateway"]}), carry={"x": "nope"}), 0),
    # read here and by the gateway: it travels back all the same
    (["red"], {"x": ["red", "gateway"]}, _then("red", {"total": ["gateway"], "count": ["gateway"]}), 1),
    # a follower's output over its inline limit that only the next follower reads: held for it, never stored
    (["scale", "red"], {"x": ["scale"]},
     msgspec.structs.replace(_then("scale", {"x": ["red"], "big": ["gateway"]}, _then("red", {"total": ["gateway"]})),
                             inline_max=64), 2),
    # three functions, the last failing: the first two ran to the end, their values handed over stay here
    (["scale", "boom"], {"x": ["scale"]},
     msgspec.structs.replace(_then("scale", {"x": ["boom"], "big": ["gateway"]}), then=_boom_then()), 2),
])
def test_chains_end_where_python_ends_them(follow: list[str], consumers: dict[str, list[str]], then: Task,
                                           ran: int) -> None:
    """WorkerCore.follow against worker._follow: where a chain stops (a failure, a function not loaded
    here, a value not made) and which values its replies keep."""
    r = _same("gen", _task("gen", consumers=consumers, then=then), follow)
    steps = 0
    while type(r) is Done and r.next is not None:
        steps, r = steps + 1, r.next
    assert steps == ran
