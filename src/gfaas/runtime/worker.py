"""Warm function workers.

:class:`FunctionHost` is what runs a function: it imports the handler and loads the model once, then
serves tasks (one invocation of that function each): open the transport with the invocation's
credentials, call the handler, check and store its outputs, report timings. It knows nothing about
processes, so the same host runs inside a local worker process (:class:`ProcessWorker`), in the
caller's own process (:class:`InProcessWorker`, for tests and debugging) or inside a Ray actor.

The runtime talks to a worker process over a ``SOCK_SEQPACKET`` socket pair with typed msgspec
messages (never pickle): ``Init`` → ``Ready``, then ``Task`` → ``Done`` | ``Failed`` until ``Stop``.
A handler that raises fails its task only; a worker process that dies is noticed by the end of its
socket (:class:`WorkerDied`) and replaced by the runtime.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
import traceback
from array import array
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
import numpy as np

from ..dataplane import protocol as dp
from ..dataplane.device_array import DeviceArray, on_device
from ..dataplane.device_client import device_of
from ..dataplane.ids import DataRef
from ..errors import DaemonUnavailable, DedupError, FunctionFailed, GfaasError, ProtocolError, SpecError
from ..gcpause import freeze_startup
from ..policy.polling import worker_wait
from ..pyexec import module_argv
from .context import Context
from .heap import keep_freed
from .logs import Capture, LogLine
from .sandbox import WORKER_ENV, Identity, drop_privileges, worker_env
from .spec import FunctionSpec, loads, name_diff
from .transport import BoundTransport, Transport, TransportConfig, open_transport
from .worker_native import chosen_core, core_for

if TYPE_CHECKING:
    from ..dataplane.client import Binder

log = logging.getLogger("gfaas.runtime")

GATEWAY = "gateway"  # the data-plane function name of the platform itself (request inputs, results)
MAX_MSG = 1 << 20


class _Ctl(msgspec.Struct, tag=True):
    pass


class Init(_Ctl):
    workflow: str
    function: str
    spec_text: str
    scale: str = "small"
    transport: dict[str, str] = {}
    threads: int = 1
    device: str = "cpu"
    gpu: str = ""  # the GPU the runtime placed this function on (runtime.placement); "": none
    # The tenant identity the worker drops to once loaded (runtime.sandbox); -1: no sandbox.
    sandbox_uid: int = -1
    sandbox_gid: int = -1
    # Page merging (runtime.dedup): "off", "shared" (model weights mapped from the domain's
    # content-addressed store), "merge" (the memory the model load added is hinted to KSM) or "on".
    dedup: str = "off"
    dedup_domain: str = ""
    shared_dir: str = ""
    # How a function on a CUDA GPU passes data (RuntimeConfig.gpu_passing): "device" or "host".
    gpu_passing: str = "device"
    # The workflow version's code package (runtime.codepkg): handlers import from here alone; "": none.
    code_dir: str = ""
    version: int = 1  # the workflow version this worker serves (runtime.versions)
    # The node's Welcome (protocol msgpack) of the attached daemon connection that comes with Init
    # (SCM_RIGHTS) and serves every task bound to it (Task.bound); b"": none, a connection per task.
    daemon: bytes = b""
    # The functions of the same workflow this worker also loads, to run right after its own in one
    # task (policy.fusion: a chain; Task.then); they run only if they loaded (Ready.follow).
    follow: list[str] = []
    # How long it asks for its next task without blocking before it sleeps (RuntimeConfig.poll_us,
    # policy.polling); 0: it sleeps at once.
    poll_s: float = 0.0
    # Whether it keeps the memory its handlers free for the next call (RuntimeConfig.worker_heap).
    heap: str = "release"


class Ready(_Ctl):
    pid: int
    load_s: float
    hinted_bytes: int = 0  # bytes the model load marked mergeable (the runtime tells the node daemon)
    logs: list[LogLine] = []  # what the worker printed and logged while it started (runtime.logs)
    # Its start, phase by phase: "entry" (time.monotonic(), system-wide, when its serving code began),
    # then seconds of "model" (the platform's model load), "drop" (the uid drop) and "import" (the
    # function's code), each present where the start had it.
    phases: dict[str, float] = {}
    follow: list[str] = []  # the functions of Init.follow that loaded, in order (a prefix of it)


class Value(msgspec.Struct, array_like=True):
    """A small array carried inside a ``Task`` or ``Done`` itself, not through the data plane: its dtype
    (``numpy.dtype.str``), shape and C-order bytes (:func:`to_value`, :func:`from_value`)."""

    dtype: str
    shape: list[int]
    data: bytes


INLINE = "inline:"  # the reference a handler sees for an input carried in its Task (Task.values)
_INLINE_LEN = len(INLINE)
_NO_REFS: frozenset[str] = frozenset()
_NUMERIC_KINDS = frozenset("biufc")  # an output of these kinds is checked against its declaration alone
_SCALARS = (np.generic, int, float)  # what a handler may return for a scalar output (made an array)
_VALUE_KINDS = frozenset("biufc")  # numbers and bools: what a value may hold (never objects)


def to_value(arr: np.ndarray) -> Value:
    """``arr`` (a host array) as a :class:`Value`."""
    return Value(arr.dtype.str, list(arr.shape), np.ascontiguousarray(arr).tobytes())


_DTYPES: dict[str, np.dtype[Any]] = {}  # the dtypes values have used, checked once each


def _value_dtype(name: str, what: str) -> np.dtype[Any]:
    dt = _DTYPES.get(name)
    if dt is None:
        try:
            dt = np.dtype(name)
        except TypeError:
            raise SpecError(f"{what}: dtype {name[:40]!r} is not a numpy dtype") from None
        if dt.kind not in _VALUE_KINDS or dt.hasobject:
            raise SpecError(f"{what}: dtype {dt} is not numeric")
        if len(_DTYPES) < 256:
            _DTYPES[name] = dt
    return dt


def check_value(v: Value, what: str = "value") -> np.dtype[Any]:
    """Raise :class:`SpecError` unless ``v`` holds a numeric array whose bytes fit its dtype and shape
    (a worker's reply comes from function code); its dtype."""
    dt = _value_dtype(v.dtype, what)
    n = dt.itemsize
    shape = v.shape
    if len(shape) > 32:
        raise SpecError(f"{what}: shape {shape[:33]} is not a list of sizes >= 0")
    for d in shape:
        if type(d) is not int or d < 0:
            raise SpecError(f"{what}: shape {shape[:33]} is not a list of sizes >= 0")
        n *= d
    if n != len(v.data):
        raise SpecError(f"{what}: {len(v.data)} bytes where dtype {dt} and shape {shape} make {n}")
    return dt


def from_value(v: Value, what: str = "value") -> np.ndarray:
    """The read-only array a :class:`Value` holds (a view of the message's bytes, no copy), checked by
    :func:`check_value`."""
    return np.frombuffer(v.data, dtype=check_value(v, what)).reshape(v.shape)


class Task(_Ctl):
    invocation: str
    token: str
    inputs: dict[str, str]  # input name -> reference (``inline:NAME``: in ``values``)
    host_inputs: list[str]  # the input names that came from the request (host -> function passing)
    consumers: dict[str, list[str]]  # output -> data-plane readers; outputs not listed are not stored
    transport: dict[str, str] = {}  # this invocation's transport; empty: the worker's default
    # Seconds after the task starts by which its inputs are due (policy.bandwidth.input_deadline of
    # the function's last compute time); 0: no estimate yet, best effort.
    deadline_s: float = 0.0
    # The runtime passes a connection to the node daemon with this task (SCM_RIGHTS): a sandboxed
    # worker cannot reach the daemon's socket itself.
    with_socket: bool = False
    # An accelerator preset name when the runtime placed this call of an ``accelerator:`` function on
    # a drive (runtime.accel): its model runs on the emulated accelerator; "": the normal path.
    accel: str = ""
    # The runtime bound the worker's attached daemon connection (Init.daemon) to this task's
    # credentials itself (a Bind sent on it before this message; ``token`` is then empty): use it.
    bound: bool = False
    # Inputs carried in this message (name -> value; the handler's reference is ``inline:NAME``).
    values: dict[str, Value] = {}
    # Outputs of at most this many bytes go back in Done (Done.values), not through the data plane;
    # 0: every output is stored (the Redis baseline, or a node where consumers elsewhere read).
    inline_max: int = 0
    # Not bound: should the task need the data plane (a larger output), the worker asks the runtime
    # with NeedData on its control socket and waits for DataReady (the runtime binds its attached
    # connection meanwhile). So an invocation of small values costs the node daemon nothing.
    lazy: bool = False
    # A chain (policy.fusion): the function this task runs, when not the worker's own ("": its own);
    # the task to run right after this one in the same worker, if its outputs all come back as
    # values; and, in that next task, which of its inputs are which outputs of this one.
    function: str = ""
    then: Task | None = None
    carry: dict[str, str] = {}  # input name -> the previous task's output it is
    # Its invocation was the runtime's only one unresolved when it was sent: the worker may poll for
    # its next task afterwards (policy.polling); under load nobody polls.
    alone: bool = False


class Done(_Ctl):
    invocation: str
    outputs: dict[str, str]  # output -> reference of the stored ones
    scalars: dict[str, float]
    host_get_s: float
    fn_get_s: float
    compute_s: float
    put_s: float
    host_put_s: float
    accel_s: float = 0.0  # modelled accelerator seconds of this call (runtime.accel); 0 off the drive
    hinted_bytes: int = 0  # bytes the handler marked mergeable with ctx.merge during this call
    logs: list[LogLine] = []  # lines printed or logged since the last reply, bounded (runtime.logs)
    slab_used: bool = False  # a put packed an object into a slab (the next Bind leases one with it)
    values: dict[str, Value] = {}  # output -> value of the outputs carried here (Task.inline_max)
    next: Done | Failed | None = None  # the reply of Task.then, when it ran (a chain)
    # Seconds from the task's arrival in the worker's loop to its reply being encoded, the chain's
    # functions and the log capture included (0: not measured). For profiles only: where an
    # invocation's time goes between the worker's framework and the two process hops.
    busy_s: float = 0.0


class Failed(_Ctl):
    invocation: str
    error: str
    message: str
    trace: str = ""
    logs: list[LogLine] = []  # as Done.logs


class Stop(_Ctl):
    pass


class NeedData(_Ctl):
    """Worker -> runtime, during a lazy task: bind my daemon connection to this task's credentials."""

    invocation: str
    function: str = ""  # the function of a chain asking (Task.function); "": the worker's own


class DataReady(_Ctl):
    """Runtime -> worker: the connection is bound (``ok``), or why not."""

    ok: bool
    message: str = ""


class Unmerge(_Ctl):
    """The node refused this worker's merge hints: take them back (gfaas.dedup.hint.unmerge_all)."""


class Unmerged(_Ctl):
    nbytes: int


Reply = Done | Failed
_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder(Init | Ready | Task | Done | Failed | Stop | Unmerge | Unmerged | NeedData | DataReady)
_tls = threading.local()


def _buffer() -> memoryview:
    """This thread's receive buffer, made once. ``sock.recv(MAX_MSG)`` allocates a fresh MiB per message:
    above malloc's mmap threshold, so an mmap, a page fault and a munmap each time, about 12 us of a
    tiny task's path on 2 cores (as much as the task's own Python). Messages are decoded at once, and
    decoding copies what it keeps, so the buffer is free again by the next receive."""
    view: memoryview | None = getattr(_tls, "view", None)
    if view is None:
        view = _tls.view = memoryview(bytearray(MAX_MSG))
    return view


def recv_message(sock: socket.socket, flags: int = 0) -> memoryview:
    """One message from a SOCK_SEQPACKET socket, as a view of this thread's buffer (empty: closed)."""
    view = _buffer()
    return view[:sock.recv_into(view, MAX_MSG, flags)]


def recv_message_fds(sock: socket.socket, maxfds: int, flags: int = 0) -> tuple[memoryview, list[int]]:
    """:func:`recv_message` with up to ``maxfds`` file descriptors passed along (SCM_RIGHTS)."""
    view = _buffer()
    n, anc, _flags, _addr = sock.recvmsg_into([view], socket.CMSG_SPACE(maxfds * _FD_SIZE), flags)
    if not anc:
        return view[:n], []
    fds = array("i")
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    return view[:n], list(fds)


_FD_SIZE = array("i").itemsize


class WorkerDied(GfaasError):
    """The worker process ended while it held a task (crash, kill, out of memory)."""


class TaskTimedOut(WorkerDied):
    """A task ran past its function's ``timeout_s``: its worker was killed (the runtime replaces it)."""

    def __init__(self, function: str, worker: str, timeout_s: float) -> None:
        super().__init__(f"function {function!r} ran longer than its timeout_s={timeout_s:g} s: its worker {worker} "
                         "was killed and is replaced (raise timeout_s in the spec if the function needs longer)")
        self.function = function
        self.timeout_s = timeout_s


class FunctionHost:
    """Runs one function: handler and model loaded once, then one task at a time."""

    def __init__(self, init: Init, enter_sandbox: Any = None, link: Any = None) -> None:
        """``enter_sandbox``: called once the platform's own loading is done and before any of the
        workflow's code package is imported (code from a client never runs with the runtime's rights).
        ``link``: the attached daemon client that serves the tasks the runtime binds it for (Task.bound)."""
        t0 = time.perf_counter()
        self.link = link
        spec = loads(init.spec_text, check_handlers=not init.code_dir)  # a package's: imported below
        self.workflow = spec.name
        self.fn: FunctionSpec = spec.function(init.function)
        self._where = f"function {self.fn.name!r} (handler {self.fn.handler})"  # what its errors name
        self.sandbox_entered = False
        self.phases: dict[str, float] = {}  # seconds of each part of the start (Ready.phases)
        if not init.code_dir:
            t = time.perf_counter()
            self.handler = self.fn.load_handler()  # an installed package: the operator's code
            self.phases["import"] = time.perf_counter() - t
        self.scale = init.scale
        self.device = init.device
        self.gpu = init.gpu
        self.gpu_passing = init.gpu_passing
        # The CUDA ordinal this function computes on; None on the CPU (modelled GPUs included).
        self.cuda = int(init.device[5:]) if init.device.startswith("cuda:") else None
        self.transport = TransportConfig(**init.transport)  # type: ignore[arg-type]
        self.sandboxed = init.sandbox_uid >= 0
        self.model: Any = None
        self.dedup = init.dedup
        self.hinted_bytes = 0
        if self.fn.model:
            t = time.perf_counter()
            self.model = _load_model(self.fn.model, init)
            self.phases["model"] = time.perf_counter() - t
        if init.code_dir:
            if enter_sandbox is not None:
                t = time.perf_counter()
                enter_sandbox()
                self.sandbox_entered = True
                self.phases["drop"] = time.perf_counter() - t
            t = time.perf_counter()
            self.handler = _load_from_package(self.fn, init.code_dir)
            if self.fn.model_file:  # the user's model: parsed with the tenant's rights only
                from ..models.files import load_file

                self.model = load_file(os.path.join(init.code_dir, self.fn.model_file), device=init.device,
                                       threads=init.threads)
            self.phases["import"] = time.perf_counter() - t
        if self.dedup != "off":
            from ..dedup.hint import take_hinted

            self.hinted_bytes = take_hinted()
        self._emulated: dict[str, Any] = {}  # accelerator preset -> EmulatedModel, built on first use
        self._fn_log = logging.getLogger(f"gfaas.fn.{self.workflow}.{self.fn.name}")  # ctx.log, made once
        self.load_s = time.perf_counter() - t0
        self.held: dict[str, np.ndarray] = {}  # the last task's outputs kept for the chain's next function
        self.core: Any = None  # the native path for its common tasks (worker_native), set by the worker

    def use_native(self) -> None:
        """Run the common tasks on the native path from now on, where this function has one."""
        self.core = core_for(self, Value, Done, _carried_array, _SCALARS, _DTYPES, _need_data)

    def serve(self, task: Task, sock: socket.socket | None = None, need_data: Any = None,
              hold: frozenset[str] = frozenset(), asked: list[bool] | None = None) -> Reply:
        """:meth:`run`, or the native path (:meth:`use_native`) where the task is its common case."""
        if self.core is not None and sock is None:
            reply = self.core.run(task, need_data, hold, asked)
            if reply is not None:
                return reply
        return self.run(task, sock, need_data, hold=hold, asked=asked)

    def take_held(self) -> dict[str, np.ndarray]:
        """What the last task held for the chain's next function (:meth:`run`), given up here: an idle
        worker must not keep a large array alive until its next task."""
        held, self.held = self.held, {}
        return held

    def run(self, task: Task, sock: socket.socket | None = None, need_data: Any = None,
            transport: Any = None, hold: frozenset[str] = frozenset(), asked: list[bool] | None = None) -> Reply:
        """Run one task. ``need_data``: for a lazy task, what asks the runtime to bind the attached
        connection (called at the task's first use of the data plane, if any). ``transport``: the
        task's transport, made by the caller (a Ray actor's attached connection); closed after.

        ``hold``: outputs that only the chain's next function, in this worker, reads (:func:`_holdable`):
        a host array among them is kept in :attr:`held` for it instead of stored, unless the task used
        the data plane (``asked[0]``), which ends the chain here, so its reader needs it stored."""
        try:
            return self._run(task, sock, need_data, transport, hold, asked)
        except Exception as exc:  # a handler's failure is its invocation's, never the worker's
            if sock is not None:
                sock.close()
            return self._failed(task, exc)

    def _failed(self, task: Task, exc: BaseException) -> Failed:
        """The task's failure: what raised, with its traceback (the native path's too)."""
        hint = ""
        if isinstance(exc, ImportError) and self.sandboxed:
            hint = ("; the worker runs sandboxed under another uid and can import only files it may "
                    "read: import the module at the top of the handler's module (loaded before the "
                    "sandbox closes), or make the Python installation readable to all users")
        return Failed(task.invocation, type(exc).__name__, f"function {self.fn.name!r}: {exc}{hint}",
                      "".join(traceback.format_exception(exc))[-8000:])

    def _run(self, task: Task, sock: socket.socket | None, need_data: Any = None, transport: Any = None,
             hold: frozenset[str] = frozenset(), asked: list[bool] | None = None) -> Done:
        t: Any
        if transport is not None:
            t = transport
        elif task.bound:
            if self.link is None:
                raise DaemonUnavailable("the runtime bound a daemon connection this worker was not given; restart it")
            self.link.expect_binding(task.invocation)
            t = BoundTransport(self.link)
        elif task.lazy:
            if self.link is None or need_data is None:
                raise DaemonUnavailable("a lazy task needs the worker's attached daemon connection; restart it")
            t = _LazyTransport(self.link, need_data, task.invocation)
        else:
            cfg = TransportConfig(**task.transport) if task.transport else self.transport  # type: ignore[arg-type]
            t = open_transport(cfg, task.invocation, self.fn.name, task.token, sock)
        try:
            return self._call(t, task, hold, asked)
        finally:
            t.close()

    def _call(self, t: Transport, task: Task, hold: frozenset[str] = frozenset(),
              asked: list[bool] | None = None) -> Done:
        host_get = [0.0]
        getter, device_getter = self._getters(t, task, time.monotonic(), host_get)
        model, accel0 = self.model, 0.0
        if task.accel:
            model = self._emulated_model(task.accel)
            accel0 = model.seconds
        ctx = Context(workflow=self.workflow, function=self.fn.name, invocation=task.invocation, getter=getter,
                      params=self.fn.params, model=model, device=self.device, scale=self.scale, gpu=self.gpu,
                      merger=_merge if self.dedup in ("merge", "on") else None,
                      device_getter=device_getter if self.cuda is not None else None, logger=self._fn_log)
        t0 = time.perf_counter()
        out = self.handler(ctx, task.inputs)  # the task's own dict: nothing reads it after the handler
        handler_s = time.perf_counter() - t0
        accel_s = model.seconds - accel0 if task.accel else 0.0
        return self._settle(t, task, out, ctx, handler_s, accel_s, host_get, hold, asked)

    def _getters(self, t: Transport, task: Task, started: float, host_get: list[float]) -> tuple[Any, Any]:
        """A task's getters (host and device) over transport ``t``; ``host_get`` adds up the time spent
        reading the request's own inputs."""
        inputs = task.inputs
        host_refs = {inputs[n] for n in task.host_inputs} if task.host_inputs else _NO_REFS
        carried = task.values

        def left() -> float | None:
            """What is left of the inputs' time budget (a passed deadline is the most urgent)."""
            if task.deadline_s <= 0:
                return None
            return max(task.deadline_s - (time.monotonic() - started), 1e-6)

        def getter(ref: Any) -> np.ndarray:
            if type(ref) is str and ref.startswith(INLINE):
                v = carried.get(ref[_INLINE_LEN:])
                if v is not None:
                    return _carried_array(v, ref)
            if ref not in host_refs:
                return t.get(ref, left())
            t0 = time.perf_counter()
            try:
                return t.get(ref, left())
            finally:
                host_get[0] += time.perf_counter() - t0

        def device_getter(ref: Any) -> Any:
            """The input on this function's GPU: delivered there by the node (device passing), or
            read from host memory and copied up by this function (host passing, the baseline)."""
            assert self.cuda is not None
            t0 = time.perf_counter()
            try:
                if isinstance(ref, str) and ref.startswith(INLINE) and ref[len(INLINE):] in carried:
                    return _upload(_carried_array(carried[ref[len(INLINE):]], ref), self.cuda)
                if self.gpu_passing == "device" and self.cuda in getattr(t, "devices", ()):
                    return _device_array(t.get(ref, left(), device=self.cuda))
                return _upload(t.get(ref, left()), self.cuda)
            finally:
                if ref in host_refs:
                    host_get[0] += time.perf_counter() - t0

        return getter, device_getter

    def _native_slow(self, task: Task, need_data: Any, started: float) -> tuple[Any, Any, list[float]]:
        """For the native path (worker_native), once its handler reads an input not carried in the task:
        the Python getter over a lazy transport (NeedData on first use), the transport, its host time."""
        t = _LazyTransport(self.link, need_data, task.invocation)
        host_get = [0.0]
        return self._getters(t, task, started, host_get)[0], t, host_get

    def _native_settle(self, task: Task, out: Any, ctx: Context, handler_s: float, need_data: Any,
                       hold: frozenset[str], asked: list[bool] | None, slow: Any) -> Reply:
        """The native path's outputs where they are not its common case (one to store, one that fails its
        declaration, the data plane used): settled here as :meth:`_call` would, over the task's lazy
        transport (``slow``'s, if its handler made one)."""
        t, host_get = (slow[1], slow[2]) if slow is not None else (_LazyTransport(self.link, need_data,
                                                                                  task.invocation), [0.0])
        try:
            return self._settle(t, task, out, ctx, handler_s, 0.0, host_get, hold, asked)
        except Exception as exc:  # noqa: BLE001 - as run(): the invocation's failure, never the worker's
            return self._failed(task, exc)
        finally:
            t.close()

    def _settle(self, t: Transport, task: Task, out: Any, ctx: Context, handler_s: float, accel_s: float,
                host_get: list[float], hold: frozenset[str], asked: list[bool] | None) -> Done:
        """A handler's outputs checked, then each carried back, held for the chain or stored."""
        values = self._check(out)
        scalars = {k: float(v if type(v) is np.ndarray else np.asarray(v)) for k, v in values.items()
                   if v.ndim == 0 and v.dtype.kind in "biuf"}
        refs: dict[str, str] = {}
        inline: dict[str, Value] = {}
        held: dict[str, np.ndarray] = {}
        put_s = host_put_s = 0.0
        limit = task.inline_max
        for name, readers in task.consumers.items():
            v = values[name]
            if limit and type(v) is np.ndarray and v.nbytes <= limit:
                inline[name] = to_value(v)  # back in the reply: no data plane for it (and no time to count)
                continue
            if name in hold and type(v) is np.ndarray:
                held[name] = v  # for the chain's next function, here: decided below
                continue
            t1 = time.perf_counter()
            refs[name] = t.put(self._outgoing(v, readers, t), readers)
            dt = time.perf_counter() - t1
            if readers == [GATEWAY]:
                host_put_s += dt
            else:
                put_s += dt
        if held and (asked is None or asked[0]):  # the data plane was used: the chain ends here
            t1 = time.perf_counter()
            for name, v in held.items():
                refs[name] = t.put(v, task.consumers[name])
            put_s += time.perf_counter() - t1
            held = {}
        for name, v in held.items():  # handed over read-only, as the data plane would
            held[name] = v = v.view()
            v.flags.writeable = False
        self.held = held
        hinted = 0
        if self.dedup != "off":
            from ..dedup.hint import take_hinted

            hinted = take_hinted()
        return Done(task.invocation, refs, scalars, host_get[0], ctx.get_s - host_get[0], handler_s - ctx.get_s,
                    put_s, host_put_s, accel_s, hinted, slab_used=bool(getattr(t, "slab_used", False)),
                    values=inline)

    def link_lost(self) -> bool:
        """The attached daemon connection broke (the daemon went, or the function's code closed it): this
        process exits after its reply, and the runtime replaces it with one that has a connection."""
        if self.link is not None and self.link.closed:
            log.warning("worker of %s/%s lost its daemon connection; exiting to be replaced", self.workflow,
                        self.fn.name)
            return True
        return False

    def unmerge(self) -> int:
        if self.dedup == "off":
            return 0
        from ..dedup.hint import unmerge_all

        return unmerge_all()

    def _emulated_model(self, accel: str) -> Any:
        if accel not in self._emulated:
            from ..accel.arch import preset
            from .accel import EmulatedModel

            if self.model is None:
                raise SpecError(f"function {self.fn.name!r} was placed on an accelerator but names no model")
            self._emulated[accel] = EmulatedModel(self.model, preset(accel))
        return self._emulated[accel]

    def _outgoing(self, value: Any, readers: list[str], t: Transport) -> Any:
        """What to store for an output: a device tensor stays on the GPU when it passes on device
        (into the node's pool, one device-to-device copy); results for the client, host passing and
        a node without a pool for that GPU take it through host memory."""
        if not isinstance(value, DeviceArray):
            return value
        on_pool = self.gpu_passing == "device" and self.cuda in getattr(t, "devices", ()) \
            and device_of(value) == self.cuda
        if not on_pool or readers == [GATEWAY]:
            return np.asarray(value)
        return value.tensor.contiguous()

    def _check(self, out: Any) -> dict[str, Any]:
        where = self._where
        if not isinstance(out, dict):
            raise SpecError(f"{where} returned {type(out).__name__}; a handler returns a dict of output -> array")
        decls = self.fn.outputs
        if out.keys() != decls.keys():
            raise SpecError(f"{where} returned outputs {sorted(out)}; the spec declares {sorted(decls)}"
                            f"{name_diff(decls, out, 'undeclared')}")
        values: dict[str, Any] = {}
        for name, v in out.items():
            if isinstance(v, _SCALARS):
                v = np.asarray(v)
            if type(v) is np.ndarray and v.dtype.kind in _NUMERIC_KINDS and decls[name].fits(v):
                values[name] = v  # the common case, checked without building a message
                continue
            if on_device(v) or isinstance(v, DeviceArray):  # checked from its metadata, left on the GPU
                dev = v if isinstance(v, DeviceArray) else _device_array(v)
                self.fn.outputs[name].check(dev, f"{where}: output {name!r}")
                values[name] = dev
                continue
            arr = np.asarray(v)
            if arr.dtype == object:
                raise SpecError(f"{where}: output {name!r} is not a numeric array or scalar ({type(v).__name__})")
            self.fn.outputs[name].check(arr, f"{where}: output {name!r}")
            values[name] = arr
        return values


class _LazyTransport:
    """A lazy task's transport (Task.lazy): nothing at all until the handler's first get or put of a
    stored object; then the runtime is asked to bind the attached connection (NeedData) and it serves
    the rest of the task as a :class:`BoundTransport`."""

    def __init__(self, link: Any, need_data: Any, invocation: str) -> None:
        self._link, self._need, self._invocation = link, need_data, invocation
        self._t: BoundTransport | None = None

    def _bound(self) -> BoundTransport:
        if self._t is None:
            self._need()
            self._link.expect_binding(self._invocation)
            self._t = BoundTransport(self._link)
        return self._t

    @property
    def devices(self) -> frozenset[int]:
        return frozenset(self._link.devices)

    @property
    def slab_used(self) -> bool:
        return self._t is not None and self._t.slab_used

    def get(self, ref: str, deadline_s: float | None = None, device: int | None = None) -> Any:
        return self._bound().get(ref, deadline_s, device)

    def put(self, value: Any, consumers: Any) -> str:
        return self._bound().put(value, consumers)

    def close(self) -> None:
        if self._t is not None:
            self._t.close()


def _load_from_package(fn: FunctionSpec, code_dir: str) -> Any:
    """The handler from the version's code package: the package first on ``sys.path`` (one worker
    process serves one version of one function, so two workflows' same-named modules never meet)."""
    import importlib

    if code_dir not in sys.path:
        sys.path.insert(0, code_dir)
    importlib.invalidate_caches()
    return fn.load_handler()


def _device_array(obj: Any) -> DeviceArray:
    """A device object (a data-plane ``DeviceView``, a torch or CuPy tensor) as a DeviceArray."""
    if isinstance(obj, DeviceArray):
        return obj
    from ..models.torch_engine import as_tensor

    return DeviceArray(as_tensor(obj))


def _upload(host: Any, cuda: int) -> DeviceArray:
    """A host array copied to GPU ``cuda`` by this function (host passing)."""
    from ..models.torch_engine import import_torch

    torch = import_torch()
    return DeviceArray(torch.from_numpy(np.array(host)).to(f"cuda:{cuda}"))


def _load_model(name: str, init: Init) -> Any:
    """The function's model, loaded as ``init.dedup`` says (runtime.dedup): its weights mapped from the
    sharing domain's store, and/or the memory the load added hinted to KSM."""
    from pathlib import Path

    from .. import models

    kw: dict[str, Any] = {}
    if init.dedup in ("shared", "on") and init.device == "cpu":  # a GPU model's weights live on the GPU
        kw = {"shared": True, "domain": init.dedup_domain or "default",
              "store_dir": Path(init.shared_dir) if init.shared_dir else None}

    def load() -> Any:
        try:
            return models.load(name, scale=init.scale, device=init.device, threads=init.threads, **kw)
        except (OSError, DedupError) as exc:
            if not kw:
                raise
            # Shared loading saves memory; it must not cost the function (a full /dev/shm, say).
            log.warning("model %s: shared loading failed (%s); this worker keeps a private copy", name, exc)
            return models.load(name, scale=init.scale, device=init.device, threads=init.threads)

    if init.dedup not in ("merge", "on"):
        return load()
    from ..dedup.hint import merge_regions
    from ..dedup.regions import track_regions

    # onnxruntime's own copies (prepacked weights, arenas) are heap memory Python never sees: what the
    # load added to this process's anonymous mappings is what a warm worker of the same model repeats.
    with track_regions() as tracked:
        model = load()
    merge_regions(tracked.regions)
    return model


def _merge(obj: Any) -> int:
    from ..dedup.hint import merge
    from ..errors import DedupError

    try:
        return merge(obj).length
    except DedupError as exc:  # refused (another sharing domain merges on this node now): advice only
        log.warning("ctx.merge: not marked: %s", exc)
        return 0


# ---- worker handles: what the invoker holds ---------------------------------------------------------
class InProcessWorker:
    """A function host in the caller's process (tests, debugging; no isolation from crashes)."""

    def __init__(self, init: Init) -> None:
        self.name = f"{init.function}@inproc"
        try:
            self._host = FunctionHost(init)
        except Exception as exc:
            raise FunctionFailed(f"function {init.function!r} could not start: {exc}") from exc
        self.pid = os.getpid()
        self.hinted_bytes = self._host.hinted_bytes

    def run(self, task: Task, timeout_s: float | None = None) -> Reply:
        """Run ``task`` in this thread; ``timeout_s`` is not enforced (a thread cannot be killed: use the
        process or Ray executor for functions that may hang)."""
        return self._host.run(task)

    def unmerge(self) -> int:
        return self._host.unmerge()

    def alive(self) -> bool:
        return True

    def stop(self) -> None:
        pass


class Forker(Protocol):
    """What starts a worker by fork (:class:`gfaas.runtime.forkserver.ForkServer`): a process object like
    ``subprocess.Popen``'s serving the socket ``sock_fd``, and the seconds spent starting the template."""

    def fork(self, env: Mapping[str, str], sock_fd: int) -> tuple[Any, float]: ...


class ProcessWorker:
    """A warm worker process serving one function: forked from the runtime's template process
    (:mod:`.forkserver`) or, without one, a fresh isolated interpreter (:mod:`.worker_main`)."""

    def __init__(self, init: Init, *, env: dict[str, str] | None = None, start_timeout: float = 300.0,
                 prefix: list[str] | None = None, binder: Binder | None = None,
                 forks: Forker | None = None) -> None:
        """``binder``: the runtime's end of an attached daemon connection (``Admin.attach_socket``) handed
        to the worker with Init; tasks on its node are then bound to it (no connection per task).
        ``forks``: the template to fork it from (ignored with a ``prefix``, which must exec)."""
        t_request = time.monotonic()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock = ours
        self._binder = binder
        self._lease = True  # lease a slab with the next Bind (while the function's puts use one)
        # The attached connection holds a task's credentials: set before the task is sent, since its
        # reply may reach the invoker's loop thread before send_task returns to whoever called it.
        self._bound = False
        if binder is not None:
            init = msgspec.structs.replace(init, daemon=dp.encode(binder.welcome))
        self._init = init
        self.sandboxed = init.sandbox_uid >= 0
        self.merge_listener: int | None = None  # its seccomp listener, for the runtime's merge supervisor
        ident = Identity(init.sandbox_uid, init.sandbox_gid) if self.sandboxed else None
        parent_env = {**os.environ, **(env or {})}
        child_env = worker_env(parent_env, ident)
        child_env.update(WORKER_ENV)
        if "GFAAS_WORKER_CORE" in parent_env:  # the operator's choice (worker_native), sandboxed or not
            child_env["GFAAS_WORKER_CORE"] = parent_env["GFAAS_WORKER_CORE"]
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            child_env.setdefault(var, str(init.threads))  # numpy's BLAS would otherwise spin a thread per core
        self.forked = forks is not None and not prefix
        self.proc: Any
        template_s = 0.0
        try:
            if forks is not None and not prefix:
                self.proc, template_s = forks.fork(child_env, theirs.fileno())
            else:
                cmd = [*(prefix or []), *module_argv("gfaas.runtime.worker_main", str(theirs.fileno()))]
                self.proc = subprocess.Popen(cmd, pass_fds=(theirs.fileno(),), env=child_env, cwd="/",
                                             stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        self.pid = self.proc.pid
        self.name = f"{init.function}@{self.pid}"
        self._sock.settimeout(start_timeout)
        try:
            if binder is None:
                self._sock.send(_enc.encode(init))
            else:
                socket.send_fds(self._sock, [_enc.encode(init)], [binder.fileno()])
            first = self._recv_first()
        except (WorkerDied, TimeoutError, OSError) as exc:
            self.stop()
            raise FunctionFailed(f"worker for function {init.function!r} did not start: {exc}") from None
        if isinstance(first, Failed):
            self.stop()
            tail = "".join(f"\n  {ln.stream}: {ln.text}" for ln in first.logs[-10:])
            raise FunctionFailed(f"function {init.function!r} could not start: {first.message}"
                                 + (f"; its last output:{tail}" if tail else ""))
        assert isinstance(first, Ready)
        t_ready = time.monotonic()
        # The start phase by phase, in seconds (pool status, /metrics, the dashboard): "fork" (to the
        # forked process running) or "spawn" (a fresh interpreter up to its serving code, imports
        # included), then what the worker reports, and "ready" for the whole of it.
        ph = dict(first.phases)
        entry = ph.pop("entry", t_ready)
        self.start_phases = {**({"template": template_s} if template_s else {}),
                             ("fork" if self.forked else "spawn"): max(0.0, entry - t_request - template_s),
                             **ph, "ready": t_ready - t_request}
        self.start_logs = first.logs  # the runtime keeps them (runtime.logs)
        self.load_s = first.load_s
        self.hinted_bytes = first.hinted_bytes
        self.follows: tuple[str, ...] = tuple(first.follow)  # the chain it can run after its own (Task.then)
        self._sock.settimeout(None)

    def _recv_first(self) -> Any:
        """The worker's first message (Ready or Failed); a sandboxed worker whose merge hints are
        supervised sends its seccomp listener with it (``merge_listener``, runtime.merge_supervisor)."""
        data, fds = recv_message_fds(self._sock, 1)
        if not data:
            for fd in fds:
                os.close(fd)
            code = self.proc.wait(5) if self.proc.poll() is None else self.proc.returncode
            raise WorkerDied(f"worker {self.name} exited (status {code}) before it was ready")
        msg = _dec.decode(data)
        if fds and isinstance(msg, Ready):
            self.merge_listener = fds[0]
        else:
            for fd in fds:
                os.close(fd)
        return msg

    def _recv(self, timeout_s: float | None = None) -> Any:
        """The worker's next message; with ``timeout_s``, a worker silent that long is killed
        (:class:`TaskTimedOut`): a handler that hangs must not hold its slot forever."""
        try:
            if timeout_s is None:
                data = recv_message(self._sock)
            else:
                self._sock.settimeout(timeout_s)
                try:
                    data = recv_message(self._sock)
                finally:
                    self._sock.settimeout(None)
        except TimeoutError:
            self.kill()
            raise TaskTimedOut(self._init.function, self.name, float(timeout_s or 0.0)) from None
        except ConnectionResetError:
            data = memoryview(b"")
        if not data:
            code = self.proc.wait(5) if self.proc.poll() is None else self.proc.returncode
            raise WorkerDied(f"worker {self.name} exited (status {code}) while it held a task")
        return _dec.decode(data)

    def run(self, task: Task, timeout_s: float | None = None) -> Reply:
        """Run ``task``; past ``timeout_s`` seconds the worker is killed and :class:`TaskTimedOut` raised."""
        cfg = task.transport or self._init.transport
        b = self._binder
        if b is not None and task.token and cfg.get("kind", "gfaas") == "gfaas" \
                and cfg.get("socket_path", "") == b.socket_path:
            return self._run_bound(task, b, timeout_s)
        conn = None
        if self.sandboxed and cfg.get("kind", "gfaas") == "gfaas":
            conn = _daemon_connection(cfg.get("socket_path", ""))
            task = msgspec.structs.replace(task, with_socket=True)
        try:
            if conn is None:
                self._sock.send(_enc.encode(task))
            else:
                socket.send_fds(self._sock, [_enc.encode(task)], [conn.fileno()])
        except OSError:
            raise WorkerDied(f"worker {self.name} is gone (status {self.proc.poll()})") from None
        finally:
            if conn is not None:
                conn.close()  # the worker holds its own copy now
        reply = self._recv(timeout_s)
        assert isinstance(reply, Done | Failed)
        return reply

    def _run_bound(self, task: Task, b: Binder, timeout_s: float | None = None) -> Reply:
        """The task on the worker's attached connection: bound to the task's credentials before the
        worker hears of it (the token never reaches the worker), unbound as soon as its reply arrives,
        before any later function of the invocation runs, so nothing written after the task can be
        read with its credentials."""
        lease = 0 if self._lease and task.consumers else -1
        try:
            b.bind(task.token, lease, len(task.consumers) if lease >= 0 else 0)
        except DaemonUnavailable as exc:
            raise WorkerDied(f"worker {self.name} lost its daemon connection: {exc}") from None
        try:
            try:
                self._sock.send(_enc.encode(msgspec.structs.replace(task, token="", bound=True)))
            except OSError:
                raise WorkerDied(f"worker {self.name} is gone (status {self.proc.poll()})") from None
            reply = self._recv(timeout_s)
        finally:
            try:
                b.unbind()
            except DaemonUnavailable as exc:  # the next bind fails too, and replaces the worker
                log.warning("worker %s: could not end its task's credentials: %s", self.name, exc)
        assert isinstance(reply, Done | Failed)
        if isinstance(reply, Done):
            self._lease = reply.slab_used
        return reply

    # -- the invoker's side (runtime.loop): a task goes out without waiting; its loop reads the reply
    def fileno(self) -> int:
        return self._sock.fileno()

    def receive(self) -> Any:
        """The next message from the worker (its socket is readable), or None once it is gone."""
        try:
            data = recv_message(self._sock, socket.MSG_DONTWAIT)
        except BlockingIOError:
            raise
        except OSError:
            data = memoryview(b"")
        return _dec.decode(data) if data else None

    def send_task(self, task: Task) -> bool:
        """Send ``task``; its reply comes to the invoker's loop. A task with a token on this worker's node
        binds the attached connection to it first (the worker never sees the token): True, then, and
        :meth:`release_binding` ends it once the reply is in. :class:`WorkerDied` if it is gone."""
        cfg = task.transport or self._init.transport
        b = self._binder
        conn = None
        bound = False
        try:
            if b is not None and task.token and cfg.get("kind", "gfaas") == "gfaas" \
                    and cfg.get("socket_path", "") == b.socket_path:
                lease = 0 if self._lease and task.consumers else -1
                b.bind(task.token, lease, len(task.consumers) if lease >= 0 else 0, self._prefetch(task))
                task = msgspec.structs.replace(task, token="", bound=True)
                bound = self._bound = True
            elif self.sandboxed and task.token and cfg.get("kind", "gfaas") == "gfaas":
                conn = _daemon_connection(cfg.get("socket_path", ""))
                task = msgspec.structs.replace(task, with_socket=True)
            if conn is None:
                self._sock.send(_enc.encode(task))
            else:
                socket.send_fds(self._sock, [_enc.encode(task)], [conn.fileno()])
        except DaemonUnavailable as exc:
            raise WorkerDied(f"worker {self.name} lost its daemon connection: {exc}") from None
        except OSError:
            raise WorkerDied(f"worker {self.name} is gone (status {self.proc.poll()})") from None
        finally:
            if conn is not None:
                conn.close()  # the worker holds its own copy now
        return bound

    def _prefetch(self, task: Task) -> list[bytes]:
        """The IDs of a CUDA function's stored inputs, for its Bind: those on a GPU come back located,
        so the function's same-GPU get needs no round trip of its own (Bind.prefetch)."""
        if not self._init.device.startswith("cuda"):
            return []
        ids = []
        for ref in task.inputs.values():
            if isinstance(ref, str) and not ref.startswith(INLINE):
                try:
                    ids.append(DataRef.parse(ref).id)
                except (GfaasError, ValueError):
                    continue  # not a reference: the function's get reports it
        return ids

    def grant_data(self, token: str) -> None:
        """Answer a lazy task's ``NeedData``: bind the attached connection to ``token``, then say so."""
        if self._binder is None:
            self.refuse_data("this worker has no attached daemon connection")
            return
        self._binder.bind(token, -1, 0)
        self._bound = True
        self._sock.send(_enc.encode(DataReady(True)))

    def refuse_data(self, message: str) -> None:
        self._sock.send(_enc.encode(DataReady(False, message)))

    def release_binding(self, reply: Any = None) -> None:
        """End the credentials a task's binding gave the attached connection (its reply is in, so
        nothing the worker sends from now on can use them); nothing if the task was given none."""
        if not self._bound:
            return
        self._bound = False
        if isinstance(reply, Done):
            self._lease = reply.slab_used
        if self._binder is None:
            return
        try:
            self._binder.unbind()
        except DaemonUnavailable as exc:  # the next bind fails too, and replaces the worker
            log.warning("worker %s: could not end its task's credentials: %s", self.name, exc)

    def unmerge(self) -> int:
        """Have the (idle) worker take back its merge hints; returns the bytes it un-advised."""
        try:
            self._sock.send(_enc.encode(Unmerge()))
        except OSError:
            raise WorkerDied(f"worker {self.name} is gone (status {self.proc.poll()})") from None
        reply = self._recv()
        assert isinstance(reply, Unmerged)
        return reply.nbytes

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the worker process (a task that ran past its timeout); it cannot take another task."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout: float = 5.0) -> None:
        if self.proc.poll() is None:
            try:
                self._sock.send(_enc.encode(Stop()))
                self.proc.wait(timeout)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._sock.close()
        if self._binder is not None:
            self._binder.close()  # the worker's copy went with it: the daemon drops the connection
        if self.merge_listener is not None:  # never handed to a supervisor
            os.close(self.merge_listener)
            self.merge_listener = None


def _daemon_connection(socket_path: str) -> socket.socket:
    """A connection to the node daemon, opened here for a sandboxed worker."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        conn.connect(socket_path)
    except OSError as exc:
        conn.close()
        raise DaemonUnavailable(f"cannot connect to the node daemon at {socket_path}: {exc}") from None
    return conn


def own_descriptors() -> list[int]:
    """This process's open descriptors (``/proc/self/fd``), the one used to list them left out."""
    fds = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            os.fstat(fd)
        except OSError:  # the directory listing's own descriptor, closed since
            continue
        fds.append(fd)
    return fds


def driver_target(target: str) -> bool:
    """Whether a descriptor whose ``/proc/self/fd`` link reads ``target`` may be the GPU driver's: a
    device file of NVIDIA's driver, or a pipe or event descriptor (CUDA's own threads wake through
    them). Files and sockets never are."""
    return target.startswith(("/dev/nvidia", "pipe:", "anon_inode:"))


def driver_descriptors(before: set[int]) -> set[int]:
    """The descriptors opened since ``before`` (taken before a CUDA function's model load) that belong
    to the GPU driver (:func:`driver_target`). They stay open across the sandbox's close: closing them
    pulls the CUDA context from under the function, and every kernel it launches then fails with
    'unspecified launch failure' (the first H200 run). A file the load read is still closed."""
    out = set()
    for fd in own_descriptors():
        if fd in before:
            continue
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if driver_target(target):
            out.add(fd)
    return out


def _close_others(keep: set[int]) -> None:
    """Close every descriptor but ``keep`` and stdio: what the root phase opened (its libraries' files,
    a duplicate of the runtime's stderr) must not reach the tenant's code."""
    for fd in own_descriptors():
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _enter_sandbox(init: Init, keep: set[int] | None = None) -> int | None:
    """Drop to the tenant's uid once the platform's model is loaded and before the function's code is
    imported (runtime.sandbox), keeping no descriptor but stdio and ``keep``."""
    # What a task needs later must be imported now: the interpreter's and the project's files may be
    # readable by root only (an interpreter under /root), and a worker no longer is root afterwards.
    import importlib

    import gfaas.dataplane.client  # noqa: F401

    # The baseline transport and what redis-py imports only when it first connects.
    for name in ("redis", "email.parser", "encodings.idna", "hmac", "secrets", "stringprep", "unicodedata"):
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    if init.device.startswith("cuda"):
        importlib.import_module("torch")  # a GPU function's device inputs and outputs are torch tensors
    if init.code_dir:  # what loading the package's own model needs, read while the files are readable
        for name in ("onnx", "onnxruntime", "gfaas.models.files", "gfaas.models.runtime"):
            importlib.import_module(name)
    if keep is not None:
        _close_others(keep)
    # the seccomp listener when the runtime supervises merge hints (runtime.merge_supervisor)
    return drop_privileges(Identity(init.sandbox_uid, init.sandbox_gid), merge_hints=init.dedup in ("merge", "on"))


def serve_fd(fd: int) -> int:
    """Serve the runtime on the socket ``fd``: Init, then tasks until Stop or the socket closes."""
    entry = time.monotonic()  # its start's "entry" (Ready.phases): forked or spawned, the process runs
    sock = socket.socket(fileno=fd)
    data, fds = recv_message_fds(sock, 1)
    if not data:
        return 0  # the runtime went away before it sent Init
    init = _dec.decode(data)
    assert isinstance(init, Init)
    # Before the daemon connection and the model load, either of which may initialise the GPU driver.
    before_load = set(own_descriptors()) if init.device.startswith("cuda") else None
    link = _attached_client(init, fds)
    # From here on, what this process prints or logs is the function's log (runtime.logs), sent with
    # each reply: model load and start-up lines with Ready, a task's lines with its Done or Failed.
    # GFAAS_WORKER_LOGS=off leaves the worker's output on the runtime's own terminal (debugging a worker).
    # A sandboxed function's output is always captured: fd 2 must not be the runtime's own stderr.
    cap = Capture() if os.environ.get("GFAAS_WORKER_LOGS", "on") != "off" or init.sandbox_uid >= 0 else None
    if cap is None:
        return _serve(sock, init, None, link, entry, before_load)
    cap.install()
    try:
        return _serve(sock, init, cap, link, entry, before_load)
    except BaseException:
        cap.fatal(f"gfaas worker {init.workflow}/{init.function} (pid {os.getpid()}) failed:\n"
                  f"{traceback.format_exc()}")
        raise


def _need_data(sock: socket.socket, invocation: str, function: str = "", asked: list[bool] | None = None) -> Any:
    """What a lazy task calls when it first needs the data plane: NeedData to the runtime, then wait
    for its DataReady (the runtime binds this worker's attached connection meanwhile). ``asked`` is
    set once it is called (a chain goes on only from a task that left the connection unbound)."""
    def need() -> None:
        if asked is not None:
            asked[0] = True
        sock.send(_enc.encode(NeedData(invocation, function)))
        data = recv_message(sock)
        if not data:
            raise DaemonUnavailable("the runtime closed this worker's socket while it asked for the data plane")
        rep = _dec.decode(data)
        if not isinstance(rep, DataReady):
            raise ProtocolError(f"the runtime answered NeedData with {type(rep).__name__}")
        if not rep.ok:
            raise DaemonUnavailable(f"the data plane is not available to this call: {rep.message}")

    return need


def _load_followers(init: Init, link: Any) -> dict[str, FunctionHost]:
    """The chain's functions (Init.follow), loaded after the worker's own and with its rights (the
    sandbox, if any, is entered already). One that fails to load ends the chain there: the runtime
    runs it, and what follows it, in their own workers, where the failure is reported as theirs."""
    hosts: dict[str, FunctionHost] = {}
    for name in init.follow:
        try:
            hosts[name] = FunctionHost(msgspec.structs.replace(init, function=name, follow=[]), link=link)
        except Exception as exc:  # noqa: BLE001 - its own workers will report it
            log.warning("function %r will not run in this worker of %r (%s: %s)", name, init.function,
                        type(exc).__name__, exc)
            break
    return hosts


def _follow(reply: Done, task: Task, hosts: dict[str, FunctionHost], sock: socket.socket,
            cap: Capture | None, asked: list[bool], held: Mapping[str, np.ndarray]) -> None:
    """Run the chain after ``task`` (Task.then) in this worker: each next task, its inputs filled
    from the last reply's values, while the last one ran whole on values (nothing stored, the
    connection never bound); each reply goes in the last one's ``next``. A value that only the
    functions which ran here read does not travel back (:func:`_keep_outside`)."""
    last, t = reply, task.then
    ran: list[tuple[Done, dict[str, list[str]]]] = [(reply, task.consumers)]  # each Done and its readers
    done: set[str] = set()  # the chain's functions that ran here, to the end
    while t is not None and not asked[0] and not last.outputs:
        host = hosts.get(t.function)
        values = _carried(last, t, held)
        if host is None or values is None:  # stored, or not made: the runtime schedules the rest
            break
        if cap is not None:
            cap.resume()  # the last reply's take() drained the pipes just now
        r = host.serve(msgspec.structs.replace(t, values=values, then=None), None,
                       _need_data(sock, t.invocation, t.function, asked), hold=_holdable(t, hosts), asked=asked)
        held = host.take_held()
        if cap is not None:
            r.logs = cap.take()
        last.next = r
        if type(r) is not Done:
            break
        ran.append((r, t.consumers))
        done.add(t.function)
        last, t = r, t.then
    if done:
        _keep_outside(ran, done)


def _chain(host: FunctionHost, reply: Done, task: Task, hosts: dict[str, FunctionHost], sock: socket.socket,
           cap: Capture | None, asked: list[bool]) -> None:
    """:func:`_follow` after ``host`` ran ``task`` (its reply ``reply``), on the native twin of it
    (WorkerCore.follow) where ``host`` runs on the native core (worker_native)."""
    follow = _follow if host.core is None else host.core.follow
    follow(reply, task, hosts, sock, cap, asked, host.take_held())


def _carried(last: Done, t: Task, held: Mapping[str, np.ndarray]) -> dict[str, Any] | None:
    """``t``'s values: its own, and what it reads from the step before, if that came back as values
    or was held for it in this worker (``held``, a host array: :meth:`FunctionHost.run`)."""
    values: dict[str, Any] = dict(t.values)
    for name, out in t.carry.items():
        v: Value | np.ndarray | None = last.values.get(out)
        if v is None:
            v = held.get(out)
            if v is None:
                return None
        values[name] = v
    return values


def _carried_array(v: Value | np.ndarray, ref: str) -> np.ndarray:
    """A carried input as its handler reads it: a Value from a message, or an array a function before
    it in this worker held for it (already read-only: :meth:`FunctionHost.run`)."""
    return v if type(v) is np.ndarray else from_value(v, ref)  # type: ignore[arg-type]


def _holdable(task: Task, hosts: Mapping[str, FunctionHost]) -> frozenset[str]:
    """The outputs of ``task`` that only the chain's next function reads, through its carry, when that
    function runs in this worker: they can be handed to it here, never stored (``FunctionHost.run``).
    If it then fails, its invocation fails as its failure, and nobody else reads them."""
    nxt = task.then
    if nxt is None or not task.lazy or nxt.function not in hosts:
        return frozenset()
    carried = set(nxt.carry.values())
    return frozenset(name for name, readers in task.consumers.items()
                     if readers == [nxt.function] and name in carried)


def _keep_outside(ran: list[tuple[Done, dict[str, list[str]]]], done: set[str]) -> None:
    """Drop from a chain's replies each value that only functions which ran here (``done``) read: it
    was handed over inside this worker, and nobody else needs it to travel back. The runtime checks
    that whatever is missing from a reply had only such readers (Invoker._finish)."""
    for reply, consumers in ran:
        gone = [name for name in reply.values if (readers := consumers.get(name)) and set(readers) <= done]
        for name in gone:
            del reply.values[name]


def _take(cap: Capture | None) -> list[LogLine]:
    return cap.take() if cap is not None else []


def _attached_client(init: Init, fds: list[int]) -> Any:
    """The attached daemon connection that came with Init, as a client (None without one)."""
    if not fds:
        return None
    conn = socket.socket(fileno=fds[0])
    for fd in fds[1:]:
        os.close(fd)
    if not init.daemon:
        conn.close()
        return None
    from ..dataplane.client import Client

    welcome = dp.decode_reply(init.daemon)
    assert isinstance(welcome, dp.Welcome)
    return Client(init.transport.get("socket_path", ""), None, sock=conn, welcome=welcome)


def _serve(sock: socket.socket, init: Init, cap: Capture | None, link: Any = None, entry: float = 0.0,
           before_load: set[int] | None = None) -> int:
    """``before_load``: a CUDA function's descriptors before anything here could initialise the GPU
    driver (the model load does), so that the driver's own survive the sandbox's close."""
    listener: list[int] = []  # the seccomp listener, sent to the runtime with Ready (runtime.merge_supervisor)

    def sandbox() -> None:
        keep = {sock.fileno(), *(cap.pipe_fds() if cap is not None else ())}
        if before_load is not None:
            keep |= driver_descriptors(before_load)
        if link is not None:
            keep.add(link.fileno())
        if cap is not None:
            cap.console = -1  # closed below: a worker's fatal error now goes to its own log
        fd = _enter_sandbox(init, keep)
        if fd is not None:
            listener.append(fd)

    try:
        sandboxed = init.sandbox_uid >= 0
        native = chosen_core() == "native"  # read once, before any code of the function's runs
        host = FunctionHost(init, enter_sandbox=sandbox if sandboxed else None, link=link)
        # With a code package the sandbox is entered already and they import from it as the tenant;
        # else, like the worker's own, before it closes.
        hosts = _load_followers(init, link) if init.follow else {}
        if sandboxed and not host.sandbox_entered:
            t = time.perf_counter()
            sandbox()
            host.phases["drop"] = time.perf_counter() - t
        if native:
            for h in (host, *hosts.values()):
                h.use_native()
    except Exception as exc:
        sock.send(_enc.encode(Failed("", type(exc).__name__, str(exc), traceback.format_exc()[-8000:],
                                     _take(cap))))
        return 1
    freeze_startup()  # the handler and its model live as long as the worker: out of the collector's walks
    ready = _enc.encode(Ready(os.getpid(), host.load_s, host.hinted_bytes, _take(cap),
                              {"entry": entry, **host.phases}, list(hosts)))
    if listener:
        socket.send_fds(sock, [ready], listener)
        os.close(listener[0])  # the runtime holds it now; function code must not answer its own calls
    else:
        sock.send(ready)
    if init.heap == "reuse":  # after the model's load (its layout as before) and off the start's path
        keep_freed()
    cores = len(os.sched_getaffinity(0))
    replied: float | None = None  # when the last reply went (perf_counter), None before the first
    gap: float | None = None
    light = True  # the last task ran on carried values alone (policy.polling)
    slept = 0  # waits in a row slept at once because of the gap
    while True:
        poll_s, slept = worker_wait(init.poll_s, cores, gap, light, slept)
        data, fds = _next_message(sock, poll_s)
        arrived = time.perf_counter()
        if replied is not None:
            gap = arrived - replied
        if not data:
            return 0  # the runtime went away
        msg = _dec.decode(data)
        if type(msg) is not Task:
            if isinstance(msg, Stop):
                return 0
            if isinstance(msg, Unmerge):
                sock.send(_enc.encode(Unmerged(host.unmerge())))
                continue
            raise ProtocolError(f"the runtime sent {type(msg).__name__} where a task was due")
        conn = socket.socket(fileno=fds[0]) if fds else None
        asked = [False]
        need = _need_data(sock, msg.invocation, "", asked) if msg.lazy else None
        if cap is not None:
            cap.begin()
        reply = host.serve(msg, conn, need, hold=_holdable(msg, hosts), asked=asked)
        if cap is not None:
            reply.logs = cap.take()
        if msg.then is not None and type(reply) is Done and msg.lazy:
            _chain(host, reply, msg, hosts, sock, cap, asked)
        if type(reply) is Done:
            reply.busy_s = time.perf_counter() - arrived
        sock.send(_enc.encode(reply))
        if host.link_lost():
            return 1
        replied, light = time.perf_counter(), msg.lazy and msg.alone and not asked[0]


def _next_message(sock: socket.socket, poll_s: float) -> tuple[memoryview, list[int]]:
    """The next message from the runtime: asked for without blocking for ``poll_s`` seconds first
    (policy.polling: a message that comes meanwhile finds this process awake), then waited for."""
    if poll_s > 0:
        end = time.perf_counter() + poll_s
        while True:
            try:
                return recv_message_fds(sock, 1, socket.MSG_DONTWAIT)
            except BlockingIOError:
                if time.perf_counter() > end:
                    break
                os.sched_yield()  # a process queued on this CPU (the runtime, woken here) runs now
    return recv_message_fds(sock, 1)
