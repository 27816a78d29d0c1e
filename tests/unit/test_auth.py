"""Invocation registry (tokens) and the read-access rule."""

import hashlib
import hmac
import itertools
import json
import re

import pytest

from gfaas import AuthenticationError, ConfigError
from gfaas.dataplane.auth import MAX_FUNCTIONS, Registry, may_read, token_hash

HEX32 = re.compile(r"^[0-9a-f]{32}$")
INV = "0123456789abcdef0123456789abcdef"


def tok(i: int) -> str:
    return f"{i:032x}"


def test_open_issues_fresh_ids_and_one_token_per_function() -> None:
    """open() gives a random 32-hex invocation ID and a distinct 32-hex token per function."""
    reg = Registry()
    a = reg.open("wf", ["f", "g", "h"])
    b = reg.open("wf", ["f", "g", "h"])
    assert HEX32.match(a.id) and HEX32.match(b.id) and a.id != b.id
    assert a.functions == ("f", "g", "h") and set(a.tokens) == {"f", "g", "h"}
    toks = list(a.tokens.values()) + list(b.tokens.values())
    assert len(set(toks)) == 6 and all(HEX32.match(t) for t in toks)
    assert len(reg) == 2 and a.id in reg and b.id in reg


def test_authenticate_maps_each_token_to_its_function() -> None:
    """Each token authenticates as exactly its own (invocation, function)."""
    reg = Registry()
    inv = reg.open("wf", ["f", "g"])
    for fn, t in inv.tokens.items():
        got_inv, got_fn = reg.authenticate(t)
        assert got_inv is inv and got_fn == fn


@pytest.mark.parametrize("bad", ["", "0" * 32, "not-a-token", None, 17, b"x" * 32, ["t"]])
def test_unknown_or_malformed_tokens_are_rejected(bad: object) -> None:
    """Unknown, empty or non-string tokens raise AuthenticationError with one fixed message."""
    reg = Registry()
    reg.open("wf", ["f"])
    with pytest.raises(AuthenticationError, match="unknown or revoked function token"):
        reg.authenticate(bad)


def test_end_revokes_tokens_and_unknown_end_is_an_error() -> None:
    """After end(), the invocation's tokens no longer authenticate; ending it again raises."""
    reg = Registry()
    inv = reg.open("wf", ["f", "g"])
    other = reg.open("wf", ["f"])
    assert reg.end(inv.id) is inv
    assert inv.id not in reg and len(reg) == 1
    for t in inv.tokens.values():
        with pytest.raises(AuthenticationError):
            reg.authenticate(t)
    assert reg.authenticate(other.tokens["f"])[0] is other
    with pytest.raises(AuthenticationError, match=repr(inv.id)):
        reg.end(inv.id)
    with pytest.raises(AuthenticationError, match="is not open on this node"):
        reg.get("f" * 32)


@pytest.mark.parametrize(
    ("workflow", "functions", "named"),
    [
        ("wf", ["f", "f"], "must be unique"),
        ("wf", ["f", "g", "f"], "['f', 'g', 'f']"),
        ("wf", [], "got 0"),
        ("wf", [f"f{i}" for i in range(MAX_FUNCTIONS + 1)], f"got {MAX_FUNCTIONS + 1}"),
        ("bad wf", ["f"], "workflow name 'bad wf'"),
        ("", ["f"], "workflow name ''"),
        ("wf", ["ok", "no/slash"], "function name 'no/slash'"),
        ("wf", ["x" * 65], "function name '" + "x" * 65 + "'"),
        ("wf", ["f\n"], "function name 'f\\n'"),
        ("wf\n", ["f"], "workflow name 'wf\\n'"),
    ],
)
def test_invalid_open_is_rejected_naming_the_value(workflow: str, functions: list[str], named: str) -> None:
    """Duplicate or invalid names and bad function counts raise ConfigError naming the value."""
    reg = Registry()
    with pytest.raises(ConfigError) as ei:
        reg.open(workflow, functions)
    assert named in str(ei.value)
    assert len(reg) == 0


def test_max_functions_is_accepted() -> None:
    """An invocation may have exactly MAX_FUNCTIONS functions."""
    inv = Registry().open("wf", [f"f{i}" for i in range(MAX_FUNCTIONS)])
    assert len(inv.tokens) == MAX_FUNCTIONS


def test_multi_node_open_with_explicit_id_and_tokens() -> None:
    """Two nodes opened with the same invocation_id and tokens authenticate the same identities."""
    tokens = {"f": tok(1), "g": tok(2)}
    n1, n2 = Registry(), Registry()
    a = n1.open("wf", ["f", "g"], invocation_id=INV, tokens=tokens)
    b = n2.open("wf", ["f", "g"], invocation_id=INV, tokens=dict(tokens))
    assert a.id == b.id == INV and a.tokens == b.tokens == tokens
    for t, fn in ((tok(1), "f"), (tok(2), "g")):
        assert n1.authenticate(t)[0].id == n2.authenticate(t)[0].id == INV
        assert n1.authenticate(t)[1] == n2.authenticate(t)[1] == fn


@pytest.mark.parametrize(
    ("inv_id", "tokens", "named"),
    [
        ("0123", None, "invocation_id '0123'"),
        (INV.upper(), None, f"invocation_id {INV.upper()!r}"),
        (INV, {"f": tok(1)}, "tokens must be given for exactly the functions ['f', 'g'], got ['f']"),
        (INV, {"f": tok(1), "g": tok(2), "h": tok(3)}, "got ['f', 'g', 'h']"),
        (INV, {"f": tok(1), "g": "short"}, "token of g 'short'"),
        (INV, {"f": tok(1), "g": tok(0xABC).upper()}, "token of g"),
        (INV + "\n", None, "invocation_id '0123456789abcdef0123456789abcdef\\n'"),
        (INV, {"f": tok(1), "g": tok(2) + "\n"}, "token of g"),
    ],
)
def test_explicit_ids_and_tokens_are_validated(inv_id: str, tokens: dict[str, str] | None, named: str) -> None:
    """Explicit invocation IDs and tokens must be 32 lowercase hex, one token per function."""
    reg = Registry()
    with pytest.raises(ConfigError) as ei:
        reg.open("wf", ["f", "g"], invocation_id=inv_id, tokens=tokens)
    assert named in str(ei.value)
    assert len(reg) == 0


def test_same_invocation_id_twice_on_one_node_is_rejected() -> None:
    """Opening an invocation ID that is already open raises ConfigError naming it."""
    reg = Registry()
    reg.open("wf", ["f"], invocation_id=INV)
    with pytest.raises(ConfigError, match=f"invocation {INV} is already open"):
        reg.open("wf", ["f"], invocation_id=INV)


def test_token_in_use_by_another_invocation_is_rejected() -> None:
    """A token already held by another invocation's function is refused; nothing is registered."""
    reg = Registry()
    reg.open("wf", ["f"], tokens={"f": tok(9)})
    with pytest.raises(ConfigError, match="already in use"):
        reg.open("wf", ["g"], tokens={"g": tok(9)})
    assert len(reg) == 1
    assert reg.authenticate(tok(9))[1] == "f"


def test_one_token_for_two_functions_is_rejected() -> None:
    """Two functions of one invocation may not share a token (one would impersonate the other)."""
    reg = Registry()
    with pytest.raises(ConfigError, match="token"):
        reg.open("wf", ["f", "g"], tokens={"f": tok(5), "g": tok(5)})
    assert len(reg) == 0


def test_json_round_trip() -> None:
    """to_json/from_json (same key) through real JSON restores invocations; their tokens still authenticate."""
    reg = Registry(b"k" * 32)
    a = reg.open("wf", ["f", "g"])
    b = reg.open("w2", ["x"], invocation_id=INV, tokens={"x": tok(3)})
    back = Registry.from_json(json.loads(json.dumps(reg.to_json())), b"k" * 32)
    assert len(back) == 2
    assert back.get(a.id).functions == ("f", "g") and back.get(a.id).workflow == "wf"
    assert back.get(a.id).tokens == {}  # not at rest
    assert back.authenticate(a.tokens["g"])[1] == "g"
    assert back.get(a.id).tokens == {}  # nor kept once presented: nothing needs them
    assert back.authenticate(tok(3))[0].id == b.id == INV


def test_tokens_at_rest_are_keyed_hashes_only() -> None:
    """The stored form names no token, only HMAC-SHA256(key, token); under another key no token authenticates."""
    reg = Registry(b"k" * 32)
    a = reg.open("wf", ["f", "g"])
    text = json.dumps(reg.to_json())
    assert all(t not in text for t in a.tokens.values())
    assert reg.to_json()[0]["token_hashes"] == {f: token_hash(b"k" * 32, t) for f, t in a.tokens.items()}
    assert token_hash(b"k" * 32, "ab") == hmac.new(b"k" * 32, b"ab", hashlib.sha256).hexdigest()
    other = Registry.from_json(json.loads(text), b"j" * 32)
    with pytest.raises(AuthenticationError, match="unknown or revoked function token"):
        other.authenticate(a.tokens["f"])


def test_plain_tokens_of_an_older_registry_are_hashed_on_load() -> None:
    """A registry file with plain tokens (older versions) loads; its tokens authenticate and are stored hashed."""
    old = [{"id": INV, "workflow": "wf", "functions": ["f"], "tokens": {"f": tok(5)}}]
    reg = Registry.from_json(old, b"k" * 32)
    assert reg.authenticate(tok(5))[1] == "f"
    assert tok(5) not in json.dumps(reg.to_json())


# ---- may_read truth table -------------------------------------------------------------------
def _expected(same_inv: bool, is_producer: bool, consumers: str) -> bool:
    if not same_inv:
        return False
    return consumers == "none" or is_producer or consumers == "listed"


@pytest.mark.parametrize(
    ("same_inv", "is_producer", "consumers"),
    list(itertools.product([True, False], [True, False], ["none", "listed", "unlisted", "empty"])),
)
def test_may_read_truth_table(same_inv: bool, is_producer: bool, consumers: str) -> None:
    """Readable iff same invocation and (no consumer list, or reader is the producer, or is listed)."""
    reader = "p" if is_producer else "r"
    cons = {
        "none": None,
        "listed": frozenset({"r", "p", "x"}) if not is_producer else frozenset({"p", "x"}),
        "unlisted": frozenset({"x"}),
        "empty": frozenset(),
    }[consumers]
    got = may_read(INV, "p", cons, INV if same_inv else "f" * 32, reader)
    assert got is _expected(same_inv, is_producer, consumers)


def test_may_read_explicit_rows() -> None:
    """Spot rows: other invocation is never readable, even by a function with the producer's name."""
    assert may_read(INV, "p", None, INV, "anyone") is True
    assert may_read(INV, "p", frozenset({"c"}), INV, "c") is True
    assert may_read(INV, "p", frozenset({"c"}), INV, "d") is False
    assert may_read(INV, "p", frozenset(), INV, "p") is True
    assert may_read(INV, "p", None, "e" * 32, "p") is False
    assert may_read(INV, "p", frozenset({"p"}), "e" * 32, "p") is False
