"""When registering a host mapping with CUDA pays (policy.pinning), against its closed form."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gfaas.errors import ConfigError
from gfaas.policy.pinning import PinCosts, copies_to_pay, pin_pays, register_s, saved_s
from gfaas.units import MiB


def test_the_rule_matches_its_closed_form() -> None:
    c = PinCosts(ring_gbps=12, dma_gbps=50, register_gbps=4, register_fixed_s=50e-6)
    n = 64 * MiB
    assert register_s(n, c) == pytest.approx(50e-6 + n / 4e9)
    assert saved_s(n, c) == pytest.approx(n / 12e9 - n / 50e9)
    k = copies_to_pay(n, c)
    assert k is not None and not pin_pays(n, (k - 1) * n, c) and pin_pays(n, k * n, c)
    assert copies_to_pay(n, PinCosts(ring_gbps=50, dma_gbps=50)) is None  # no faster path: never
    assert not pin_pays(0, 5 * n, c) and not pin_pays(n, 0, c)
    # A large mapping read a little at a time pays later than one copied whole.
    assert pin_pays(n, k * n, c) and not pin_pays(4 * n, k * n, c)


@given(st.integers(1, 1 << 34), st.integers(1, 1000), st.floats(1, 100), st.floats(1, 100), st.floats(0.1, 100))
def test_once_it_pays_it_keeps_paying(n: int, copies: int, ring: float, dma: float, reg: float) -> None:
    c = PinCosts(ring_gbps=ring, dma_gbps=dma, register_gbps=reg)
    if pin_pays(n, copies * n, c):
        assert pin_pays(n, (copies + 1) * n, c)
    k = copies_to_pay(n, c)
    if k is not None:
        assert pin_pays(n, k * n, c) and (k == 1 or not pin_pays(n, (k - 1) * n, c))


def test_rates_a_rounding_apart_give_the_least_copy_that_pays() -> None:
    """Found by Hypothesis in CI: with the ring and the DMA a rounding apart, each copy saves about
    1e-25 s, the estimate register / saved landed many copies past the least one that pays, and the
    saving, a difference of two nearly equal quotients, was not monotone in the bytes copied."""
    c = PinCosts(ring_gbps=1.0, dma_gbps=1.0000000000000002, register_gbps=1.0)
    k = copies_to_pay(1, c)
    assert k is not None and pin_pays(1, k, c) and not pin_pays(1, k - 1, c)
    assert saved_s(3 * 2**60, c) >= saved_s(2**61, c) >= saved_s(2**60, c) > 0


def test_bad_costs_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="register_gbps=0"):
        PinCosts(register_gbps=0)
    with pytest.raises(ConfigError, match="register_fixed_s=-1"):
        PinCosts(register_fixed_s=-1)
