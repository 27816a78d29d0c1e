"""Object IDs and DataRef strings."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gfaas import DataRef, InvalidDataRef
from gfaas.dataplane.ids import ID_BYTES, check_id, new_id

node_names = st.from_regex(r"\A[A-Za-z0-9_.-]{1,64}\Z")
ids = st.binary(min_size=ID_BYTES, max_size=ID_BYTES)


def test_new_ids_are_16_random_bytes() -> None:
    """new_id() returns 16 bytes and 1000 draws are all distinct."""
    drawn = {new_id() for _ in range(1000)}
    assert len(drawn) == 1000
    assert all(isinstance(i, bytes) and len(i) == 16 for i in drawn)


def test_str_form() -> None:
    """str(ref) is gfaas://<node>/<32 lowercase hex digits>."""
    ref = DataRef(bytes(range(16)), "node-1")
    assert str(ref) == "gfaas://node-1/000102030405060708090a0b0c0d0e0f"
    assert repr(ref) == "DataRef('gfaas://node-1/000102030405060708090a0b0c0d0e0f')"


def test_parse_round_trip_example() -> None:
    """parse(str(ref)) == ref, and parse of a DataRef returns it unchanged."""
    ref = DataRef(b"\xff" * 16, "a.b_c-9")
    assert DataRef.parse(str(ref)) == ref
    assert DataRef.parse(ref) is ref


@given(ids, node_names)
def test_parse_round_trip_property(raw: bytes, node: str) -> None:
    """For every 16-byte ID and valid node name, parse(str(ref)) reproduces ref exactly."""
    ref = DataRef(raw, node)
    back = DataRef.parse(str(ref))
    assert back == ref and back.id == raw and back.node == node
    assert hash(back) == hash(ref)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "gfaas://",
        "gfaas://n0/",
        "gfaas://n0/" + "0" * 31,  # too short
        "gfaas://n0/" + "0" * 33,  # too long
        "gfaas://n0/" + "A" * 32,  # uppercase hex
        "gfaas://n0/" + "g" * 32,  # not hex
        "gfaas:/n0/" + "0" * 32,
        "http://n0/" + "0" * 32,
        "gfaas://n 0/" + "0" * 32,  # space in node
        "gfaas://" + "n" * 65 + "/" + "0" * 32,  # node too long
        "gfaas:///" + "0" * 32,  # empty node
        "gfaas://n0/" + "0" * 32 + "\n",  # trailing newline
        " gfaas://n0/" + "0" * 32,
        "gfaas://n0/x/" + "0" * 32,
    ],
)
def test_malformed_strings_are_rejected_naming_the_text(text: str) -> None:
    """A malformed reference string raises InvalidDataRef whose message quotes the bad text."""
    with pytest.raises(InvalidDataRef) as ei:
        DataRef.parse(text)
    assert repr(text[:120]) in str(ei.value)
    assert "gfaas://<node>/<32 lowercase hex digits>" in str(ei.value)


@given(st.text(max_size=200))
def test_parse_of_arbitrary_text_never_raises_anything_else(text: str) -> None:
    """Arbitrary text either parses to a DataRef whose str() is that text, or raises InvalidDataRef."""
    try:
        ref = DataRef.parse(text)
    except InvalidDataRef:
        return
    assert str(ref) == text


@pytest.mark.parametrize("obj", [None, 5, b"gfaas://n0/" + b"0" * 32, ["x"]])
def test_parse_of_non_strings_names_the_type(obj: object) -> None:
    """parse() of a non-str raises InvalidDataRef naming the type it got."""
    with pytest.raises(InvalidDataRef, match=type(obj).__name__):
        DataRef.parse(obj)  # type: ignore[arg-type]


@pytest.mark.parametrize("raw", [b"", b"x" * 15, b"x" * 17, "0" * 16, None, 16])
def test_bad_ids_are_rejected(raw: object) -> None:
    """A DataRef (and check_id) with an ID that is not exactly 16 bytes raises InvalidDataRef."""
    with pytest.raises(InvalidDataRef, match="is not 16 bytes"):
        check_id(raw)
    with pytest.raises(InvalidDataRef):
        DataRef(raw, "n0")  # type: ignore[arg-type]


def test_long_bad_id_is_shown_truncated() -> None:
    """The message for a too-long ID shows at most 80 hex digits of it."""
    with pytest.raises(InvalidDataRef) as ei:
        check_id(b"\xab" * 1000)
    assert "ab" * 40 in str(ei.value)
    assert "ab" * 41 not in str(ei.value)


@pytest.mark.parametrize("node", ["", "a/b", "n 0", "x" * 65, "gfaas://n0"])
def test_dataref_with_an_invalid_node_is_rejected(node: str) -> None:
    """A DataRef whose node name could not be parsed back is refused at construction."""
    with pytest.raises(InvalidDataRef, match="node"):
        DataRef(b"\x00" * 16, node)


def test_dataref_is_immutable_and_hashable() -> None:
    """DataRefs are frozen and usable as dict keys; a bytearray ID is stored as bytes."""
    ref = DataRef(bytearray(16), "n0")  # type: ignore[arg-type]
    assert isinstance(ref.id, bytes)
    assert {ref: 1}[DataRef(bytes(16), "n0")] == 1
    with pytest.raises(AttributeError):
        ref.node = "other"  # type: ignore[misc]
