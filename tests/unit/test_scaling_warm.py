"""The warm tier's host-memory cache: keep-alive and LRU eviction by bytes."""

from __future__ import annotations

import pytest

from gfaas.errors import ConfigError
from gfaas.scaling.warm import WarmCache


def _m(n: int) -> list[memoryview]:
    return [memoryview(bytearray(n))]


def test_lru_eviction_by_bytes() -> None:
    """Putting a model that does not fit evicts least recently used models first; a get counts as use."""
    c = WarmCache(capacity_bytes=300, keep_alive_s=100)
    assert c.put("a", _m(100), 0) == []
    assert c.put("b", _m(100), 1) == []
    assert c.put("c", _m(100), 2) == []
    assert c.get("a", 3) is not None  # a is now the most recent
    assert c.put("d", _m(150), 4) == ["b", "c"]
    assert c.keys() == ["a", "d"] and c.nbytes == 250


def test_keep_alive_expiry() -> None:
    """A model unused for longer than the keep-alive is gone; one used within it stays."""
    c = WarmCache(capacity_bytes=1000, keep_alive_s=10)
    c.put("a", _m(10), 0)
    c.put("b", _m(10), 5)
    assert c.get("a", 10) is not None  # exactly at the keep-alive: still there, and touched
    assert c.get("b", 15.5) is None
    assert c.keys() == ["a"]
    assert c.expire(20.5) == ["a"] and c.keys() == []


def test_too_large_and_bad_settings() -> None:
    """A model larger than the cache is not kept; negative settings are refused."""
    c = WarmCache(capacity_bytes=50, keep_alive_s=1)
    c.put("small", _m(10), 0)
    assert c.put("big", _m(51), 0) == ["big"]
    assert c.keys() == ["small"]
    with pytest.raises(ConfigError, match="capacity_bytes >= 0"):
        WarmCache(-1, 1)


def test_a_keep_alive_policy_governs_the_cache() -> None:
    """keep_alive="fixed:1": a model is kept 60 s after each use (the same policy objects as workers);
    a bad policy name is refused at construction."""
    c = WarmCache(capacity_bytes=1000, keep_alive="fixed:1")
    c.put("m", [memoryview(b"x" * 10)], now=0.0)
    assert c.get("m", now=60.0) is not None  # used again at 60 s: kept until 120 s
    assert c.expire(now=120.0) == []
    assert c.expire(now=120.5) == ["m"]
    with pytest.raises(ConfigError, match="unknown keep-alive policy"):
        WarmCache(1000, keep_alive="lru")


def test_gfaas_policy_learns_a_models_period() -> None:
    """Used every 45 minutes: after a few uses the gfaas policy keeps the model through its pre-warm
    window (44 min) and keep-alive (3 min), so the next use finds it; the default 600 s would not."""
    c = WarmCache(capacity_bytes=1000, keep_alive="gfaas")
    fixed = WarmCache(capacity_bytes=1000)
    for i in range(5):
        for cache in (c, fixed):
            if cache.get("m", now=i * 2700.0) is None:
                cache.put("m", [memoryview(b"x")], now=i * 2700.0)
    assert c.get("m", now=5 * 2700.0) is not None
    assert fixed.get("m", now=5 * 2700.0) is None
