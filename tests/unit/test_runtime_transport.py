"""The Redis baseline's references carry key, dtype and shape through a string and back."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gfaas.errors import ConfigError
from gfaas.runtime.transport import TransportConfig, parse_redis_ref, redis_ref

DTYPES = ["|u1", "|i1", "|b1", "<f4", ">f8", "<i8", "<c16", "<u2", "<f2"]


@given(dtype=st.sampled_from(DTYPES), shape=st.lists(st.integers(0, 9), max_size=4))
def test_references_round_trip(dtype: str, shape: list[int]) -> None:
    arr = np.zeros(shape, dtype=np.dtype(dtype))
    key, dt, dims = parse_redis_ref(redis_ref("gfaas:inv:fn:3", arr))
    assert (key, dt, dims) == ("gfaas:inv:fn:3", np.dtype(dtype).str, tuple(shape))


@pytest.mark.parametrize("ref", ["redis:k|<f4", "redis:k|nope|3", "redis:k|<f4|x", "gfaas-ref", "redis:k"])
def test_malformed_references_name_the_format(ref: str) -> None:
    with pytest.raises(ConfigError, match=r"redis:KEY\|DTYPE\|SHAPE"):
        parse_redis_ref(ref)


def test_transport_config_errors_name_the_fix() -> None:
    with pytest.raises(ConfigError, match="'gfaas' or 'redis'"):
        TransportConfig(kind="tcp")
    with pytest.raises(ConfigError, match="needs redis_url"):
        TransportConfig(kind="redis")
