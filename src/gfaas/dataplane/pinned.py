"""The node's host segments registered with CUDA (``cudaHostRegister``), so a copy to or from a
GPU is one DMA from the segment itself, with no staging copy through the pinned ring.

One :class:`HostPins` per daemon process, shared by its GPUs' backends: a registration is made
portable (every device's context sees it), once per mapping, and lasts as long as the mapping. Host
segments are reused warm (``store``), so the mapping, and with it the registration, serves many
invocations. Whether a mapping is worth registering is :func:`gfaas.policy.pinning.pin_pays`,
asked at each copy with the bytes copied through that mapping so far.

The rules, each checked against the fake CUDA runtime by ``tests/unit/test_host_pins.py``:

* Only a mapping of a node segment (an ``mmap`` the host backend owns) is registered; any other
  buffer (a reader's bytearray, a numpy array) goes through the ring.
* A read-only mapping (a sealed segment mapped after its seal) is registered read-only and serves
  only copies *from* it; a copy into it never goes direct.
* A mapping is unregistered before it is unmapped (:meth:`HostPins.release`, called by the host
  backend), and only after every direct copy through it finished: unregistering memory a DMA still
  reads is undefined behaviour in CUDA.
* A registration that fails (page-locking limits, an unsupported mapping), or a DMA through one
  refused at launch, is not tried again for that mapping: its copies use the ring, and the failure
  is logged once.
"""

from __future__ import annotations

import logging
import mmap
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..policy.pinning import PinCosts, pin_pays

log = logging.getLogger("gfaas.dataplane.pinned")

PORTABLE = 0x01  # cudaHostRegisterPortable: pinned for every CUDA context, so every GPU's backend
READ_ONLY = 0x08  # cudaHostRegisterReadOnly: the mapping has no PROT_WRITE


@dataclass(slots=True)
class _Mapping:
    base: int
    size: int
    writable: bool
    copied: int = 0  # bytes copied to or from a GPU through it, so far
    registered: bool = False
    failed: bool = False
    in_flight: int = 0  # direct copies running through it now
    # The mapping itself, weakly: an entry whose mapping is gone (unmapped without release) must
    # never answer for a new mapping that reuses its id.
    ref: Any = field(default=None, repr=False)


class HostPins:
    """Registrations of host mappings, shared by a process's CUDA backends (see the module doc)."""

    def __init__(self, rt: Any, costs: PinCosts | None = None) -> None:
        self.rt = rt
        self.costs = costs or PinCosts()
        self._maps: dict[int, _Mapping] = {}  # id(mmap) -> its state; the mmap outlives the entry
        self._cond = threading.Condition()

    def direct(self, view: memoryview, write: bool) -> int | None:
        """The address of ``view``'s first byte if a DMA may use it directly (its mapping is
        registered, now or before), else None (the caller stages it through the ring). A non-None
        answer counts a copy in flight: call :meth:`done` with the same view once the DMA finished."""
        owner = view.obj
        if not isinstance(owner, mmap.mmap) or owner.closed:
            return None
        with self._cond:
            m = self._maps.get(id(owner))
            if m is None or m.ref() is not owner:
                if m is not None and m.registered:  # its mapping went without release: not ours now
                    log.warning("a registered host mapping was unmapped before it was released")
                    m.registered = False
                m = self._maps[id(owner)] = _mapping(owner)
            if m.failed or (write and not m.writable):
                return None
            m.copied += view.nbytes
            if not m.registered:
                if not pin_pays(m.size, m.copied, self.costs):
                    return None
                self._register(m)
                if not m.registered:
                    return None
            m.in_flight += 1
        return _address(view)

    def done(self, view: memoryview) -> None:
        """A direct copy through ``view``'s mapping finished (the DMA completed)."""
        with self._cond:
            m = self._maps.get(id(view.obj))
            if m is not None and m.ref() is view.obj and m.in_flight > 0:
                m.in_flight -= 1
                if not m.in_flight:
                    self._cond.notify_all()

    def refuse(self, view: memoryview, exc: BaseException) -> None:
        """A DMA through ``view``'s registered mapping was refused at launch: its copies use the ring
        from now on (logged once); the registration ends with the mapping, as any other."""
        with self._cond:
            m = self._maps.get(id(view.obj))
            if m is not None and m.ref() is view.obj and not m.failed:
                m.failed = True
                log.warning("a DMA from a registered %d-byte host segment was refused (%s); its copies use the "
                            "staging ring", m.size, exc)

    def release(self, owner: mmap.mmap) -> None:
        """``owner`` is about to be unmapped: wait for the direct copies through it, then unregister."""
        with self._cond:
            m = self._maps.get(id(owner))
            if m is None or m.ref() is not owner:
                return
            while m.in_flight:
                self._cond.wait()
            del self._maps[id(owner)]
            if m.registered:
                self._unregister(m)

    def close(self) -> None:
        """Unregister everything (the daemon stops); waits for direct copies still running."""
        with self._cond:
            while any(m.in_flight for m in self._maps.values()):
                self._cond.wait()
            for m in self._maps.values():
                if m.registered:
                    self._unregister(m)
            self._maps.clear()

    def stats(self) -> dict[str, int]:
        with self._cond:
            return {"mappings": len(self._maps), "registered": sum(m.registered for m in self._maps.values()),
                    "registered_bytes": sum(m.size for m in self._maps.values() if m.registered)}

    # -- under the condition's lock
    def _register(self, m: _Mapping) -> None:
        try:
            self.rt.hostRegister(m.base, m.size, PORTABLE | (0 if m.writable else READ_ONLY))
        except Exception as exc:  # noqa: BLE001 - the ring still works; say why once
            m.failed = True
            log.warning("could not register a %d-byte host segment with CUDA (%s); its copies use the "
                        "staging ring", m.size, exc)
            return
        m.registered = True

    def _unregister(self, m: _Mapping) -> None:
        m.registered = False
        try:
            self.rt.hostUnregister(m.base)
        except Exception as exc:  # noqa: BLE001 - the mapping goes anyway; nothing else to do
            log.warning("cudaHostUnregister of a host segment failed: %s", exc)


def _mapping(owner: mmap.mmap) -> _Mapping:
    if not len(owner):
        return _Mapping(0, 0, False, failed=True, ref=weakref.ref(owner))
    arr = np.frombuffer(owner, np.uint8)  # works on read-only mappings too (ctypes.from_buffer does not)
    return _Mapping(int(arr.ctypes.data), len(owner), writable=bool(arr.flags.writeable), ref=weakref.ref(owner))


def _address(view: memoryview) -> int:
    return int(np.frombuffer(view.cast("B") if view.format != "B" or view.ndim != 1 else view,
                             np.uint8).ctypes.data)
