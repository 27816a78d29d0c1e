"""When registering a host mapping with the GPU (``cudaHostRegister``) pays for itself.

A host object reaches a GPU one of two ways. Through the node's pinned staging ring, every copy
pays a host-to-host copy into the ring beside the DMA, and so runs at the ring's rate. Registered
(pinned in place), every copy is one DMA at the link's rate, but the registration itself costs a
fixed part and a walk over every page of the mapping, once, however often the mapping is used
afterwards. The node's host segments are reused (a workflow's warm segments), so the cost is paid
once per warm segment.

:func:`pin_pays` is the rule the data plane applies at each copy to or from a GPU: register the
mapping once the bytes copied through it, had they gone direct, would have saved at least what the
registration costs. A segment copied once stays on the ring unless registering is cheap against
the bytes saved; a warm segment that comes back is registered as soon as its reuse pays.

Pure: no clock, no CUDA. The rates are inputs (:class:`PinCosts`), defaulted from the one H100
run this project has and overridable by what a node measures (``gfaas bench dataplane --gpu``
prints the registration rows).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True, slots=True)
class PinCosts:
    """Rates in GB/s (1e9 bytes) and the fixed cost of one registration in seconds."""

    ring_gbps: float = 12.0  # through the staging ring (measured on the H100: 11.5-13.2 host -> GPU)
    dma_gbps: float = 50.0  # one DMA from pinned memory (measured: 54.6-55.1)
    register_gbps: float = 4.0  # pinning pages in place; a cautious guess until a GPU run measures it
    register_fixed_s: float = 50e-6

    def __post_init__(self) -> None:
        for name in ("ring_gbps", "dma_gbps", "register_gbps"):
            v = getattr(self, name)
            if not v > 0:
                raise ConfigError(f"PinCosts.{name}={v!r}: give a rate > 0 GB/s")
        if not self.register_fixed_s >= 0:
            raise ConfigError(f"PinCosts.register_fixed_s={self.register_fixed_s!r}: give seconds >= 0")


def register_s(nbytes: int, costs: PinCosts) -> float:
    """Seconds one registration of ``nbytes`` costs."""
    return costs.register_fixed_s + nbytes / (costs.register_gbps * 1e9)


def saved_s(nbytes: int, costs: PinCosts) -> float:
    """Seconds one copy of ``nbytes`` saves when it is a DMA from registered memory, not the ring
    (negative if the ring is the faster path)."""
    # One factor times the bytes: monotone in ``nbytes``, so pin_pays is monotone in the bytes copied.
    # (The difference of two quotients cancels catastrophically when the rates are close: with rates a
    # rounding apart, a larger copy could "save" less than a smaller one.)
    return nbytes * (1 / (costs.ring_gbps * 1e9) - 1 / (costs.dma_gbps * 1e9))


def pin_pays(size: int, copied: int, costs: PinCosts) -> bool:
    """Whether a mapping of ``size`` bytes, through which ``copied`` bytes have now been copied to or
    from a GPU (this copy included), should be registered before this copy: those copies, direct,
    would have saved at least the registration's cost. The cost grows with the mapping's size, the
    saving with the bytes moved, so a large segment read a little at a time waits longer."""
    if size <= 0 or copied <= 0:
        return False
    return saved_s(copied, costs) >= register_s(size, costs)


def copies_to_pay(nbytes: int, costs: PinCosts) -> int | None:
    """The copy of a whole ``nbytes`` mapping at which :func:`pin_pays` first says yes (None: never,
    the ring is as fast as a DMA)."""
    s = saved_s(nbytes, costs)
    if nbytes <= 0 or s <= 0:
        return None
    # The closed form's estimate can be off either way by rounding (by many copies when they save
    # little each), so the least k is bisected: pin_pays is monotone in k, and k = 0 never pays.
    lo, hi = 0, max(1, int(register_s(nbytes, costs) // s))
    while not pin_pays(nbytes, hi * nbytes, costs):
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pin_pays(nbytes, mid * nbytes, costs):
            hi = mid
        else:
            lo = mid
    return hi
