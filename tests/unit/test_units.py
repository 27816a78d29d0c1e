"""Byte sizes are parsed and printed in one place (gfaas.units)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gfaas.errors import ConfigError
from gfaas.units import GiB, KiB, MiB, format_bytes, format_decimal, parse_size


@pytest.mark.parametrize(("text", "n"), [
    ("4096", 4096), ("512MiB", 512 * MiB), ("2 GiB", 2 * GiB), ("1.5GB", 1_500_000_000), ("64k", 64 * KiB),
    ("10mb", 10**7), (" 3 KiB ", 3 * KiB), ("0", 0), (7, 7), ("1b", 1),
])
def test_parse_size(text: str | int, n: int) -> None:
    assert parse_size(text) == n


@pytest.mark.parametrize("bad", ["", "MiB", "twelve", "-1", "1..5GiB", "nan"])
def test_bad_sizes_name_the_value_and_the_form(bad: str) -> None:
    with pytest.raises(ConfigError, match=f"size {bad!r}"):
        parse_size(bad)


@given(st.integers(0, 1 << 44))
def test_format_bytes_round_trips_exact_sizes(n: int) -> None:
    text = format_bytes(n)
    if "." not in text:
        assert parse_size(text) == n
    else:
        assert abs(parse_size(text) - n) <= 0.05 * n + 1


def test_format_examples() -> None:
    assert [format_bytes(n) for n in (100, 4 * KiB, 256 * MiB, 3 * GiB // 2)] == ["100 B", "4 KiB", "256 MiB", "1.5 GiB"]
    assert format_decimal(6_220_800) == "6.22 MB"
