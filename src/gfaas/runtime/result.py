"""What an invocation produced, and where its time went."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import numpy as np

Status = Literal["queued", "running", "done", "failed"]

_T = TypeVar("_T")
_UNSET: Any = object()  # a defaulted-by-factory argument that was not passed


def _one_call_init(cls: type[_T]) -> type[_T]:
    """Give a frozen dataclass an ``__init__`` that fills the instance's dict in one call, where the
    generated one makes an ``object.__setattr__`` call per field: about half the time per record, and
    every invocation makes several of these records on its hot path (tests/unit/test_result_init.py).
    The signature, defaults and factories are the fields' own; assigning to a field still raises."""
    if hasattr(cls, "__post_init__") or hasattr(cls, "__slots__"):  # the one-call init would skip or break them
        raise TypeError(f"_one_call_init does not support {cls.__name__}: it has __post_init__ or __slots__")
    ns: dict[str, Any] = {"_UNSET": _UNSET}
    params, items = [], []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.default is not dataclasses.MISSING:
            ns[f"_d_{f.name}"] = f.default
            params.append(f"{f.name}=_d_{f.name}")
            items.append(f"{f.name}={f.name}")
        elif f.default_factory is not dataclasses.MISSING:
            ns[f"_f_{f.name}"] = f.default_factory
            params.append(f"{f.name}=_UNSET")
            items.append(f"{f.name}=_f_{f.name}() if {f.name} is _UNSET else {f.name}")
        else:
            params.append(f.name)
            items.append(f"{f.name}={f.name}")
    exec(f"def __init__(self, {', '.join(params)}):\n    self.__dict__.update({', '.join(items)})", ns)  # noqa: S102
    init: Callable[..., None] = ns["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = init  # type: ignore[method-assign]
    return cls


@_one_call_init
@dataclass(frozen=True)
class Breakdown:
    """An invocation's latency split the way the papers report it (seconds).

    ``queue_s``: waiting for a worker, summed over functions; ``host_pass_s``: moving the request's
    inputs from the gateway into the first functions and the results back out; ``fn_pass_s``: moving
    intermediate data between functions (put by the producer + get by the consumer); ``compute_s``: the
    handlers' own time. ``total_s`` is wall time from submit to result, so it also holds dispatch
    overhead and, for parallel branches, less than the sum of the parts.

    ``accel_s``: the *modelled* seconds of the functions that ran on an in-storage accelerator
    (``accelerator: dscs``, :mod:`gfaas.runtime.accel`), summed; not part of ``total_s``, which is
    measured here (where ``compute_s`` holds the emulator's own time). Listed by :meth:`as_dict` only
    when non-zero, so workflows without the field report what they always did.
    """

    queue_s: float = 0.0
    host_pass_s: float = 0.0
    fn_pass_s: float = 0.0
    compute_s: float = 0.0
    total_s: float = 0.0
    accel_s: float = 0.0
    cold_start_s: float = 0.0  # the part of queue_s spent starting workers (and loading models) for it

    def as_dict(self) -> dict[str, float]:
        d = {"queue_s": self.queue_s, "host_pass_s": self.host_pass_s, "fn_pass_s": self.fn_pass_s,
             "compute_s": self.compute_s, "total_s": self.total_s}
        if self.accel_s:
            d["accel_s"] = self.accel_s
        if self.cold_start_s:
            d["cold_start_s"] = self.cold_start_s
        return d


@_one_call_init
@dataclass(frozen=True)
class FunctionRecord:
    """One function's run inside an invocation (``skipped`` when a ``when:`` condition was false).

    ``slo_s`` is the function's SLO and ``deadline_s`` when (seconds after it started) its data had to be
    in, both from its measured compute time by the policy's shared rule (``gfaas.policy.slo_for``,
    ``gfaas.policy.input_deadline``), the one the simulator applies to its profiled compute times.
    """

    function: str
    worker: str = ""
    queued_s: float = 0.0
    get_s: float = 0.0
    compute_s: float = 0.0
    put_s: float = 0.0
    skipped: bool = False
    slo_s: float = 0.0
    deadline_s: float = 0.0
    # For functions marked ``accelerator:`` (runtime.accel): where this call ran ("dscs" on its drive's
    # accelerator, "cpu" after fail-over; "" for unmarked functions), the drive (its home drive on a
    # fail-over; -1: none) and the modelled accelerator seconds.
    placement: str = ""
    drive: int = -1
    accel_s: float = 0.0
    # A cold start: the seconds (within queued_s) this call waited for its worker to start and load its
    # model, because none was warm; 0.0 on a warm worker.
    cold_start_s: float = 0.0

    @property
    def met_deadline(self) -> bool:
        """Whether the function's inputs were in by its deadline (its get took no longer)."""
        return self.skipped or self.get_s <= self.deadline_s


@dataclass(frozen=True)
class Failure:
    """Why an invocation failed, when a function's run did: that ``function``, its exception's type
    (``error``), its ``trace`` (the handler's traceback; "" when its worker died) and the last lines it
    printed or logged during this invocation (``logs``, each ``"stream: text"``; see runtime.logs)."""

    function: str
    error: str = ""
    trace: str = ""
    logs: tuple[str, ...] = ()


@_one_call_init
@dataclass(frozen=True)
class InvocationResult:
    """The outcome of one invocation. ``outputs`` holds the workflow's declared outputs (arrays);
    ``scalars`` the scalar outputs of every function that ran (what conditions were evaluated on)."""

    invocation_id: str
    workflow: str
    status: Status
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    scalars: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    breakdown: Breakdown = field(default_factory=Breakdown)
    functions: tuple[FunctionRecord, ...] = ()
    failure: Failure | None = None

    @property
    def ok(self) -> bool:
        return self.status == "done"
