"""Object metadata validation shared by client and daemon."""

import numpy as np
import pytest

from gfaas import ConfigError, ProtocolError
from gfaas.dataplane.meta import MAX_CONSUMERS, MAX_NDIM, RAW, align, check_consumers, check_meta, itemsize


@pytest.mark.parametrize(
    "dtype", [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
              np.float16, np.float32, np.float64, np.complex64, np.complex128, ">f4", ">i8", "<u2"],
)
def test_itemsize_matches_numpy(dtype: object) -> None:
    """For every supported numpy dtype string, itemsize() equals numpy's itemsize."""
    dt = np.dtype(dtype)
    assert itemsize(dt.str) == dt.itemsize


def test_raw_has_itemsize_one() -> None:
    """The 'raw' dtype (bytes objects) has itemsize 1."""
    assert itemsize(RAW) == 1


@pytest.mark.parametrize("dtype", ["<U4", "|O", "<M8[ns]", "|V8", "f4", "<f3", "<f16", "", "raw ", "<f4\n", "raw\n",
                                   None, 4])
def test_unsupported_dtypes_are_named(dtype: object) -> None:
    """Unsupported dtypes raise ProtocolError quoting the dtype."""
    with pytest.raises(ProtocolError) as ei:
        itemsize(dtype)  # type: ignore[arg-type]
    assert repr(dtype) in str(ei.value)


@pytest.mark.parametrize(
    ("nbytes", "dtype", "shape"),
    [(0, "<f4", [0]), (0, "<f4", [3, 0, 2]), (8, "<f8", []), (24, "<i4", [2, 3]), (5, RAW, [5]), (0, RAW, [0]),
     (16, "|b1", [4, 4]), (16, "<c16", [1])],
)
def test_consistent_meta_is_accepted(nbytes: int, dtype: str, shape: list[int]) -> None:
    """Shape x itemsize == nbytes is accepted and returned as a tuple."""
    assert check_meta(nbytes, dtype, shape) == tuple(shape)


@pytest.mark.parametrize(
    ("nbytes", "dtype", "shape", "named"),
    [
        (23, "<i4", [2, 3], "holds 24 bytes, but the object has 23"),
        (25, "<i4", [2, 3], "holds 24 bytes, but the object has 25"),
        (8, "<f4", [], "holds 4 bytes, but the object has 8"),
        (6, RAW, [2, 3], "shape [2, 3] of dtype raw"),
        (0, RAW, [], "shape [] of dtype raw"),
        (-1, "<f4", [], "object size -1"),
        (4, "<f4", [-1], "shape [-1]"),
        (4, "<f4", [1.0], "shape [1.0]"),
        (4, "<f4", [1] * (MAX_NDIM + 1), f"at most {MAX_NDIM}"),
        (4, "<U1", [1], "'<U1'"),
    ],
)
def test_inconsistent_meta_is_rejected(nbytes: int, dtype: str, shape: list[object], named: str) -> None:
    """dtype/shape/nbytes mismatches raise ProtocolError naming the numbers."""
    with pytest.raises(ProtocolError) as ei:
        check_meta(nbytes, dtype, shape)  # type: ignore[arg-type]
    assert named in str(ei.value)


def test_max_ndim_is_accepted() -> None:
    """Exactly MAX_NDIM dimensions is fine."""
    assert check_meta(1, "|u1", [1] * MAX_NDIM) == (1,) * MAX_NDIM


def test_consumers() -> None:
    """None stays None; a list becomes a frozenset; unknown names and too many are ConfigErrors."""
    fns = ("f", "g")
    assert check_consumers(None, fns) is None
    assert check_consumers([], fns) == frozenset()
    assert check_consumers(["g", "g", "f"], fns) == frozenset({"f", "g"})
    with pytest.raises(ConfigError, match=r"consumers \['x', 'y'\] are not functions.*\['f', 'g'\]"):
        check_consumers(["f", "x", "y"], fns)
    with pytest.raises(ConfigError, match=f"{MAX_CONSUMERS + 1} consumers given"):
        check_consumers(["f"] * (MAX_CONSUMERS + 1), fns)


@pytest.mark.parametrize(("n", "want"), [(0, 0), (1, 64), (63, 64), (64, 64), (65, 128), (1000, 1024)])
def test_align_rounds_up_to_64(n: int, want: int) -> None:
    """align() rounds up to the next multiple of 64."""
    assert align(n) == want
