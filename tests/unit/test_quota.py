"""The per-invocation quota bookkeeping (gfaas.dataplane.quota), without a daemon."""

from __future__ import annotations

import pytest

from gfaas.dataplane.quota import IDS, RESERVED, SPILL, UNSEALED, Limits, Quotas
from gfaas.errors import CapacityError, QuotaExceeded


def quotas() -> Quotas:
    return Quotas(Limits(reserved_bytes=100, unsealed_objects=2, issued_ids=10, spill_bytes=50))


def test_check_names_quota_usage_limit_and_knob() -> None:
    """A refused charge names what is counted, the usage, the request, the limit and the knob."""
    q = quotas()
    q.hold("a", "inv1", RESERVED, 60)
    with pytest.raises(QuotaExceeded) as ei:
        q.hold("b", "inv1", RESERVED, 41)
    assert str(ei.value) == (
        "invocation inv1 is over its quota of bytes reserved for objects being written and open slabs: 60 held,"
        " 41 more asked, limit 100 (quota_reserved_bytes=100); free or seal what it holds, or raise"
        " quota_reserved_bytes")
    assert isinstance(ei.value, CapacityError)
    assert q.usage("inv1", RESERVED) == 60  # the refused charge left nothing behind


def test_invocations_are_counted_apart() -> None:
    """One invocation at its quota does not limit another."""
    q = quotas()
    q.hold(1, "a", UNSEALED, 1)
    q.hold(2, "a", UNSEALED, 1)
    with pytest.raises(QuotaExceeded, match="quota_unsealed_objects=2"):
        q.check("a", UNSEALED, 1)
    q.check("b", UNSEALED, 2)


def test_keyed_charges_release_once() -> None:
    """Dropping a key twice, or one never held, changes nothing; holding a key again replaces it."""
    q = quotas()
    q.hold("k", "a", SPILL, 30, check=False)
    q.hold("k", "a", SPILL, 40, check=False)
    assert q.usage("a", SPILL) == 40
    q.drop("k")
    q.drop("k")
    q.drop("never")
    assert q.usage("a", SPILL) == 0


def test_counters_and_forget() -> None:
    """Plain counters go up and down; ending an invocation forgets all its usage."""
    q = quotas()
    q.add("a", IDS, 10)
    with pytest.raises(QuotaExceeded, match="issued IDs not used yet: 10 held, 1 more asked, limit 10"):
        q.check("a", IDS, 1)
    q.add("a", IDS, -3)
    q.check("a", IDS, 3)
    q.hold("x", "a", RESERVED, 5)
    q.forget("a")
    assert q.usage("a", IDS) == q.usage("a", RESERVED) == 0
    q.drop("x")  # already forgotten
    assert q.usage("a", RESERVED) == 0
    with pytest.raises(QuotaExceeded, match="limit 7"):
        q.check("a", SPILL, 8, limit=7)
