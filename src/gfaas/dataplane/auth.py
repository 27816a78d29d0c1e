"""Credentials and access decisions (pure: no I/O, no clock).

The platform opens a *workflow invocation* on a node through the admin interface and receives one
token per function of the workflow. A function process presents its token when it connects; the
connection is then bound to ``(invocation, function)`` and every request on it is checked against
that identity (seed 001 §7: each access is authenticated by function and workflow).

Tokens are kept at rest only as keyed hashes, ``HMAC-SHA256(key, token)``, under a key of the node's
state directory: a copy of ``invocations.journal`` names no token that works. A token is known in
plain text only in memory, where the node generated it or a function presented it.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass, field

from ..errors import AuthenticationError, ConfigError

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_HEX32 = re.compile(r"^[0-9a-f]{32}$")
MAX_FUNCTIONS = 256


def check_name(kind: str, name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(f"{kind} name {name!r} is invalid: use 1-64 letters, digits, '_', '.' or '-'")
    return name


def check_hex32(kind: str, value: object) -> str:
    if not isinstance(value, str) or not _HEX32.fullmatch(value):
        raise ConfigError(f"{kind} {value!r} is invalid: expected 32 lowercase hex digits")
    return value


def token_hash(key: bytes, token: str) -> str:
    """The keyed hash a token is stored as (hex HMAC-SHA256)."""
    return hmac.new(key, token.encode(), hashlib.sha256).hexdigest()


@dataclass
class Invocation:
    """One run of a workflow on this node, with the keyed hash of each of its functions' tokens.

    ``tokens`` holds the plain tokens only in the process that opened the invocation, to hand them to
    the platform once; nothing else needs them (cross-node pulls prove the cluster key and name the
    function, docs/security/peers.md), and a restarted daemon never has them."""

    id: str
    workflow: str
    functions: tuple[str, ...]
    tokens: dict[str, str] = field(default_factory=dict)
    hashes: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {"id": self.id, "workflow": self.workflow, "functions": list(self.functions),
                "token_hashes": self.hashes}

    @classmethod
    def from_json(cls, d: dict[str, object], key: bytes) -> Invocation:
        if "token_hashes" in d:
            hashes = {str(f): str(h) for f, h in d["token_hashes"].items()}  # type: ignore[attr-defined]
        else:  # written by a version that stored plain tokens: hash them now
            hashes = {str(f): token_hash(key, str(t)) for f, t in d["tokens"].items()}  # type: ignore[attr-defined]
        return cls(
            id=str(d["id"]),
            workflow=str(d["workflow"]),
            functions=tuple(d["functions"]),  # type: ignore[arg-type]
            hashes=hashes,
        )


class Registry:
    """The open invocations of a node and the (hashed) tokens that identify their functions.

    ``key`` keys the token hashes; without one a random key lives as long as this registry."""

    def __init__(self, key: bytes | None = None) -> None:
        self.key = key if key is not None else secrets.token_bytes(32)
        self._invocations: dict[str, Invocation] = {}
        self._by_hash: dict[str, tuple[str, str]] = {}

    def __len__(self) -> int:
        return len(self._invocations)

    def __bool__(self) -> bool:
        return True  # an empty registry is still this registry, with its key (``registry or Registry()``)

    def __contains__(self, invocation_id: object) -> bool:
        return invocation_id in self._invocations

    def invocations(self) -> list[Invocation]:
        return list(self._invocations.values())

    def get(self, invocation_id: str) -> Invocation:
        try:
            return self._invocations[invocation_id]
        except KeyError:
            raise AuthenticationError(
                f"invocation {invocation_id!r} is not open on this node; open it with Admin.open_invocation"
            ) from None

    def open(
        self,
        workflow: str,
        functions: list[str] | tuple[str, ...],
        invocation_id: str | None = None,
        tokens: dict[str, str] | None = None,
    ) -> Invocation:
        """Register an invocation; fresh random ID and tokens unless given (multi-node invocations)."""
        check_name("workflow", workflow)
        if not functions or len(functions) > MAX_FUNCTIONS:
            raise ConfigError(f"an invocation needs 1-{MAX_FUNCTIONS} functions, got {len(functions or [])}")
        fns = tuple(check_name("function", f) for f in functions)
        if len(set(fns)) != len(fns):
            raise ConfigError(f"function names must be unique, got {list(fns)}")
        inv_id = check_hex32("invocation_id", invocation_id) if invocation_id else secrets.token_hex(16)
        if inv_id in self._invocations:
            raise ConfigError(f"invocation {inv_id} is already open on this node; end it first or use a new ID")
        if tokens is None:
            toks = {f: secrets.token_hex(16) for f in fns}
        else:
            if set(tokens) != set(fns):
                raise ConfigError(f"tokens must be given for exactly the functions {list(fns)}, got {sorted(tokens)}")
            toks = {f: check_hex32(f"token of {f}", t) for f, t in tokens.items()}
            if len(set(toks.values())) != len(toks):
                raise ConfigError("two functions were given the same token; each function needs its own")
        hashes = {f: token_hash(self.key, t) for f, t in toks.items()}
        for h in hashes.values():
            if h in self._by_hash:
                raise ConfigError("a token is already in use by another invocation; let the node generate tokens")
        inv = Invocation(inv_id, workflow, fns, toks, hashes)
        self._add(inv)
        return inv

    def _add(self, inv: Invocation) -> None:
        self._invocations[inv.id] = inv
        for f, h in inv.hashes.items():
            self._by_hash[h] = (inv.id, f)

    def end(self, invocation_id: str) -> Invocation:
        inv = self.get(invocation_id)
        del self._invocations[invocation_id]
        for h in inv.hashes.values():
            self._by_hash.pop(h, None)
        return inv

    def authenticate(self, token: object) -> tuple[Invocation, str]:
        """The (invocation, function) a token belongs to; :class:`AuthenticationError` otherwise."""
        digest = token_hash(self.key, token) if isinstance(token, str) else ""
        who = self._by_hash.get(digest)
        if who is None:
            raise AuthenticationError(
                "unknown or revoked function token; ask the platform for the credentials of this invocation"
            )
        inv, fn = self._invocations[who[0]], who[1]
        # The lookup found it by its digest; compare once more in constant time all the same.
        if not hmac.compare_digest(inv.hashes[fn], digest):  # pragma: no cover - a dict lookup matched it
            raise AuthenticationError("unknown or revoked function token")
        return inv, fn

    def to_json(self) -> list[dict[str, object]]:
        """What is stored at rest: token hashes, never tokens."""
        return [inv.to_json() for inv in self._invocations.values()]

    @classmethod
    def from_json(cls, items: list[dict[str, object]], key: bytes | None = None) -> Registry:
        reg = cls(key)
        for d in items:
            reg._add(Invocation.from_json(d, reg.key))
        return reg


def may_read(
    obj_invocation: str, producer: str, consumers: frozenset[str] | None, invocation: str, function: str
) -> bool:
    """Whether ``function`` of ``invocation`` may read an object: same invocation, and it is the
    producer, a declared consumer, or the object is open to the whole invocation (no consumer list)."""
    if obj_invocation != invocation:
        return False
    return consumers is None or function == producer or function in consumers
