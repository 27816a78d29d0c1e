"""The gateway's bearer token: made at first start into a 0600 file of the gateway's state directory,
or given by the operator as a file; compared in constant time.

The token is a secret the clients must present, so the file holds it as it is (like an SSH key or a
kubeconfig): what protects it is the file's mode and owner, checked each time it is read. Files are
created with ``O_EXCL | O_NOFOLLOW`` and opened with ``O_NOFOLLOW``, so a planted symlink or a file
another user made is refused rather than followed or trusted.
"""

from __future__ import annotations

import errno
import hmac
import os
import secrets
import stat
from pathlib import Path

from ...errors import ConfigError

TOKEN_FILE = "gateway.token"
ENV_TOKEN = "GFAAS_GATEWAY_TOKEN"  # what GatewayClient reads when given no token
ENV_TOKEN_FILE = "GFAAS_GATEWAY_TOKEN_FILE"
_MIN_LEN = 16


def new_token() -> str:
    """A fresh token: 256 random bits, URL-safe base64."""
    return secrets.token_urlsafe(32)


def private_dir(path: str | Path) -> Path:
    """``path`` as a directory only this user can enter (made 0700 if missing); refused when it is a
    symlink, not owned by this user, or open to others."""
    p = Path(path)
    try:
        p.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(p)
    except OSError as exc:
        raise ConfigError(f"gateway state directory {p}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"gateway state directory {p} is not a directory (a symlink?); remove it or pick another")
    if st.st_uid != os.geteuid():
        raise ConfigError(f"gateway state directory {p} belongs to uid {st.st_uid}, not to this user "
                          f"({os.geteuid()}); pick a directory of your own (--state-dir)")
    if st.st_mode & 0o077:
        raise ConfigError(f"gateway state directory {p} has mode {stat.S_IMODE(st.st_mode):04o}; others may "
                          f"enter it: chmod 700 {p}")
    return p


def read_token_file(path: str | Path) -> str:
    """The token in ``path`` (surrounding whitespace stripped); refused when the file is a symlink, not
    this user's, readable by others, or holds fewer than 16 characters."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        why = "it is a symlink" if exc.errno == errno.ELOOP else exc.strerror
        raise ConfigError(f"cannot read the gateway token file {p}: {why}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"gateway token file {p} is not a regular file")
        if st.st_uid != os.geteuid():
            raise ConfigError(f"gateway token file {p} belongs to uid {st.st_uid}, not to this user")
        if st.st_mode & 0o077:
            raise ConfigError(f"gateway token file {p} has mode {stat.S_IMODE(st.st_mode):04o}; others may read "
                              f"it: chmod 600 {p}")
        data = os.read(fd, 4097)
    finally:
        os.close(fd)
    try:
        token = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"gateway token file {p} is not ASCII text") from None
    if len(token) < _MIN_LEN or len(token) > 4096 or any(c.isspace() or not c.isprintable() for c in token):
        raise ConfigError(f"gateway token file {p} must hold one token of {_MIN_LEN} to 4096 printable characters "
                          "without spaces")
    return token


def load_or_create_token(state_dir: str | Path) -> tuple[str, Path]:
    """The token of ``state_dir/gateway.token``, made (0600, ``O_EXCL|O_NOFOLLOW``) on first use;
    returns it and the file's path."""
    p = private_dir(state_dir) / TOKEN_FILE
    token = new_token()
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return read_token_file(p), p
    except OSError as exc:
        raise ConfigError(f"cannot create the gateway token file {p}: {exc.strerror}") from None
    try:
        os.write(fd, (token + "\n").encode())
    finally:
        os.close(fd)
    return token, p


def token_matches(header: bytes | None, token: bytes) -> bool:
    """Whether an ``Authorization`` header value is ``Bearer <token>`` (the token compared in constant time)."""
    if header is None:
        return False
    scheme, _, given = header.strip().partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), token)
