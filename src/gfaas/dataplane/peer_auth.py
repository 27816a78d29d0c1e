"""Who may talk to a node as a peer: secrets from files, the cluster key's proofs, signed directory entries.

Every node of a cluster holds the same *cluster key* (``NodeConfig.cluster_key_file``, at least 32
bytes, mode 0600, distributed by the operator). It serves two purposes:

* the transfer protocol starts with a mutual challenge (:mod:`gfaas.dataplane.transfer_wire`): each
  side sends a fresh nonce and proves the key with an HMAC-SHA256 over both nonces and both node IDs,
  under a different label per side (a proof cannot be reflected back). An address that does not hold
  the key learns nothing of the puller and cannot serve it a single byte;
* every entry a node writes to the global directory carries an HMAC under a key derived from it,
  so an entry written by anyone else (a forged object location or node address) is refused before
  any connection is made.

Function tokens never cross the network between nodes: a pull names the invocation and the function,
and the owner checks them against its own registry after the peer proved the key. An invocation
that spans machines gets tokens every node derives from the key itself
(:meth:`PeerKey.function_tokens`), so the gateway opens it on another node by naming it, never by
sending tokens (:mod:`gfaas.dataplane.peer_control`). The Ray cluster's token is derived from the
key too (:meth:`PeerKey.ray_token`): one secret file per machine.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets

from ..errors import ConfigError
from ..secfiles import create_file, read_private_file

KEY_MIN_BYTES = 32
NONCE_BYTES = 32
_LABEL = b"gfaas-peer-v1"


def read_secret_file(path: str, what: str, min_bytes: int = 1) -> bytes:
    """The stripped contents of a secret file, refused unless it is a regular file of this user that
    nobody else can read or write (not followed through a symlink: :mod:`gfaas.secfiles`)."""
    data = read_private_file(path, what, limit=1 << 16).strip()
    if len(data) < min_bytes:
        raise ConfigError(f"{what} {path} holds {len(data)} bytes; it needs at least {min_bytes}"
                          " (generate one with `gfaas cluster keygen PATH`)")
    return data


def generate_key_file(path: str) -> None:
    """Write a fresh cluster key (32 random bytes, hex) to ``path`` (0600, synced, never through a
    symlink; ``FileExistsError`` rather than overwrite one); copy it to every node."""
    create_file(path, secrets.token_hex(KEY_MIN_BYTES).encode() + b"\n")


class PeerKey:
    """The cluster key of this node, and the proofs and MACs made with it."""

    def __init__(self, key: bytes) -> None:
        if len(key) < KEY_MIN_BYTES:
            raise ConfigError(f"a cluster key needs at least {KEY_MIN_BYTES} bytes, got {len(key)}")
        self._key = key
        self._entry_key = hmac.new(key, _LABEL + b" directory-entry", hashlib.sha256).digest()

    @classmethod
    def from_file(cls, path: str) -> PeerKey:
        return cls(read_secret_file(path, "cluster key file", KEY_MIN_BYTES))

    # ---- the transfer handshake ----------------------------------------------------------------------
    def proof(self, role: str, client_node: str, server_node: str, client_nonce: bytes,
              server_nonce: bytes) -> bytes:
        """HMAC of the handshake's transcript by ``role`` ("client" or "server")."""
        msg = b"\0".join((_LABEL, role.encode(), client_node.encode(), server_node.encode(),
                          client_nonce, server_nonce))
        return hmac.new(self._key, msg, hashlib.sha256).digest()

    @staticmethod
    def check(expected: bytes, got: object) -> bool:
        return isinstance(got, bytes) and hmac.compare_digest(expected, got)

    # ---- secrets derived from the key ----------------------------------------------------------------
    def _derive(self, *parts: str) -> str:
        msg = b"\0".join((_LABEL, *(p.encode() for p in parts)))
        return hmac.new(self._key, msg, hashlib.sha256).hexdigest()

    def function_tokens(self, invocation_id: str, functions: list[str] | tuple[str, ...]) -> dict[str, str]:
        """The token of each function of a multi-node invocation (32 hex, as the node would draw):
        every holder of the key derives the same ones, so none has to be sent to another node."""
        return {f: self._derive("function-token", invocation_id, f)[:32] for f in functions}

    def ray_token(self) -> str:
        """The token of the Ray cluster the nodes join (``RAY_AUTH_TOKEN``; Ray's token mode)."""
        return self._derive("ray-auth-token")

    # ---- directory entries ---------------------------------------------------------------------------
    def entry_mac(self, kind: str, name: str, fields: dict[str, str]) -> str:
        """MAC of a directory entry (its kind, its key's name and every field but ``mac``)."""
        body = json.dumps([kind, name, sorted((k, v) for k, v in fields.items() if k != "mac")],
                          separators=(",", ":")).encode()
        return hmac.new(self._entry_key, body, hashlib.sha256).hexdigest()

    def entry_ok(self, kind: str, name: str, fields: dict[str, str]) -> bool:
        mac = fields.get("mac")
        if not isinstance(mac, str):
            return False
        return hmac.compare_digest(self.entry_mac(kind, name, fields).encode(), mac.encode(errors="replace"))
