"""The gateway's bearer token: made at first start into a 0600 file of the gateway's state directory,
or given by the operator as a file; compared in constant time.

The token is a secret the clients must present, so the file holds it as it is (like an SSH key or a
kubeconfig): what protects it is the file's mode and owner, checked each time it is read
(:mod:`gfaas.secfiles`: created ``O_EXCL | O_NOFOLLOW``, opened ``O_NOFOLLOW``, so a planted symlink
or a file another user made is refused rather than followed or trusted).
"""

from __future__ import annotations

import hmac
import secrets
from pathlib import Path

from ... import secfiles
from ...errors import ConfigError

TOKEN_FILE = "gateway.token"
ENV_TOKEN = "GFAAS_GATEWAY_TOKEN"  # what GatewayClient reads when given no token
ENV_TOKEN_FILE = "GFAAS_GATEWAY_TOKEN_FILE"
_MIN_LEN = 16
_MAX_LEN = 4096


def new_token() -> str:
    """A fresh token: 256 random bits, URL-safe base64."""
    return secrets.token_urlsafe(32)


def private_dir(path: str | Path) -> Path:
    """``path`` as a directory only this user can enter (made 0700 if missing); refused when it is a
    symlink, not owned by this user, or open to group or others."""
    return Path(secfiles.private_dir(str(path), "gateway state directory",
                                     "pick a directory of your own (--state-dir)", deny=0o077))


def _parse_token(data: bytes, p: Path) -> str:
    try:
        token = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"gateway token file {p} is not ASCII text") from None
    if len(token) < _MIN_LEN or len(token) > _MAX_LEN or any(c.isspace() or not c.isprintable() for c in token):
        raise ConfigError(f"gateway token file {p} must hold one token of {_MIN_LEN} to {_MAX_LEN} printable"
                          " characters without spaces")
    return token


def read_token_file(path: str | Path) -> str:
    """The token in ``path`` (surrounding whitespace stripped); refused when the file is a symlink, not
    this user's, open to group or others, or holds fewer than 16 characters."""
    return _parse_token(secfiles.read_private_file(str(path), "gateway token file", limit=2 * _MAX_LEN), Path(path))


def load_or_create_token(state_dir: str | Path) -> tuple[str, Path]:
    """The token of ``state_dir/gateway.token``, made (0600, ``O_EXCL|O_NOFOLLOW``, synced) on first
    use; returns it and the file's path."""
    p = private_dir(state_dir) / TOKEN_FILE
    data, _ = secfiles.load_or_create(str(p), "gateway token file", (new_token() + "\n").encode())
    return _parse_token(data, p), p


def token_matches(header: bytes | None, token: bytes) -> bool:
    """Whether an ``Authorization`` header value is ``Bearer <token>`` (the token compared in constant time)."""
    if header is None:
        return False
    scheme, _, given = header.strip().partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), token)
