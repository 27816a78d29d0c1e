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
