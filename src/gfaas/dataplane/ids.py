"""Object IDs and data references.

An object ID is 128 random bits issued by a node daemon. A :class:`DataRef` is what functions pass
around: the ID plus the node that produced it, as a string ``gfaas://<node>/<32 hex digits>``.
The node part is a hint for people reading logs; the directory is the authority on where data is.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from ..errors import InvalidDataRef

ID_BYTES = 16
_REF = re.compile(r"^gfaas://([A-Za-z0-9_.-]{1,64})/([0-9a-f]{32})$")
_NODE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def new_id() -> bytes:
    """A fresh random 128-bit object ID."""
    return secrets.token_bytes(ID_BYTES)


def check_id(raw: object) -> bytes:
    """Validate a raw ID received from a client: exactly 16 bytes."""
    if not isinstance(raw, bytes | bytearray) or len(raw) != ID_BYTES:
        shown = raw.hex() if isinstance(raw, bytes | bytearray) else repr(raw)
        raise InvalidDataRef(f"object ID {shown[:80]} is not {ID_BYTES} bytes; pass the ID of a DataRef")
    return bytes(raw)


@dataclass(frozen=True, slots=True)
class DataRef:
    """A reference to an immutable object in the gfaas data plane.

    ``str(ref)`` gives ``gfaas://<node>/<hex id>``; :meth:`parse` reverses it exactly.
    """

    id: bytes
    node: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "id", check_id(self.id))  # a bytearray ID would be unhashable
        if not isinstance(self.node, str) or not _NODE.fullmatch(self.node):
            raise InvalidDataRef(f"node name {self.node!r} is invalid; use 1-64 letters, digits, '_', '.' or '-'")

    @classmethod
    def trusted(cls, oid: bytes, node: str) -> DataRef:
        """A reference from values already checked (an ID the daemon issued, this node's name)."""
        ref = object.__new__(cls)
        object.__setattr__(ref, "id", oid)
        object.__setattr__(ref, "node", node)
        return ref

    def __str__(self) -> str:
        return f"gfaas://{self.node}/{self.id.hex()}"

    def __repr__(self) -> str:
        return f"DataRef({str(self)!r})"

    @classmethod
    def parse(cls, text: str) -> DataRef:
        """Parse the string form; raises :class:`~gfaas.errors.InvalidDataRef` with the bad text."""
        if isinstance(text, DataRef):
            return text
        if not isinstance(text, str):
            raise InvalidDataRef(f"a data reference must be a str, got {type(text).__name__}")
        m = _REF.fullmatch(text)  # fullmatch: '$' would accept a trailing newline
        if not m:
            raise InvalidDataRef(
                f"{text[:120]!r} is not a data reference; expected 'gfaas://<node>/<32 lowercase hex digits>'"
            )
        return cls(bytes.fromhex(m.group(2)), m.group(1))


_HEX_ID = re.compile(r"[0-9a-fA-F]{32}")


def object_id(ref: object) -> bytes:
    """The ID a reference names: a :class:`DataRef`, its string form, 32 hex digits or 16 bytes.
    Anything else is :class:`~gfaas.errors.InvalidDataRef`, naming the value."""
    if isinstance(ref, DataRef):
        return ref.id
    if isinstance(ref, bytes | bytearray):
        return check_id(ref)
    if isinstance(ref, str):
        if _HEX_ID.fullmatch(ref):
            return bytes.fromhex(ref)
        if ref.startswith("gfaas://"):
            return DataRef.parse(ref).id
        raise InvalidDataRef(f"{ref[:120]!r} names no object; give 'gfaas://<node>/<32 hex digits>' or the 32 hex"
                             " digits of its ID")
    raise InvalidDataRef(f"an object reference must be a DataRef, str or bytes, got {type(ref).__name__}")
