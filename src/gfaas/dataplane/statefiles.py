"""The node's private directories and files: refused when another local user could have planted or
can change them, and created without following symlinks.

A directory is private when it is not a symlink, is owned by this process's user and is not
writable by group or others. Files in it are created with ``O_EXCL | O_NOFOLLOW`` (mode 0600) and
replaced through a fresh temporary file and ``rename``, which replaces a planted symlink instead of
writing through it.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat

from ..errors import ConfigError

_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def check_private_dir(path: str, what: str) -> None:
    """Raise :class:`ConfigError` unless ``path`` is a directory another local user cannot control."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist") from None
    uid = os.geteuid()
    fix = f"remove it (rm -rf {path}) so the node creates it, or choose another path"
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(f"{what} {path} is a symlink (to {os.readlink(path)!r}); it is refused: {fix}")
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{what} {path} is not a directory; {fix}")
    if st.st_uid != uid:
        raise ConfigError(
            f"{what} {path} is owned by uid {st.st_uid}, not by this user (uid {uid}): another user may have"
            f" planted it; {fix}"
        )
    if st.st_mode & 0o022:
        raise ConfigError(
            f"{what} {path} has mode {stat.S_IMODE(st.st_mode):04o}, writable by group or others;"
            f" run chmod 700 {path}, or {fix}"
        )


def private_dir(path: str, what: str) -> str:
    """Create ``path`` (mode 0700, with its missing parents) unless it exists; then check it."""
    path = os.path.abspath(path)
    try:
        os.mkdir(path, 0o700)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    except FileExistsError:
        pass
    check_private_dir(path, what)
    return path


def create_file(path: str, data: bytes, sync: bool = True) -> None:
    """Create ``path`` holding ``data`` (mode 0600); fails if anything, even a symlink, is there.
    ``sync``: fsync it (files that must outlive the machine, not just the daemon)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(path: str, data: bytes, sync: bool = True) -> None:
    """Write ``data`` to ``path`` atomically (mode 0600): a fresh temporary file, rename."""
    tmp = f"{path}.{secrets.token_hex(4)}.tmp"
    create_file(tmp, data, sync)
    try:
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def read_private_file(path: str, what: str) -> bytes:
    """The contents of ``path``, refused if it is a symlink, not ours, or open to group or others."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the last component is a symlink
            raise ConfigError(f"{what} {path} is a symlink; it is refused: remove it") from None
        raise
    try:
        st = os.fstat(fd)
        uid = os.geteuid()
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in (uid, 0) or st.st_mode & 0o077:
            raise ConfigError(
                f"{what} {path} (uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}) must be a regular file"
                f" owned by uid {uid} with mode 0600; remove it and restart the node"
            )
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def load_or_create_key(path: str, nbytes: int = 32) -> tuple[bytes, bool]:
    """A secret key kept in ``path`` (created once, 0600, never through a symlink), and whether it
    was created just now."""
    try:
        key = read_private_file(path, "key file")
    except FileNotFoundError:
        key = secrets.token_bytes(nbytes)
        create_file(path, key)
        return key, True
    if len(key) < 16:
        raise ConfigError(f"key file {path} holds {len(key)} bytes, too few for a key; remove it and restart"
                          " the node (open invocations' tokens then stop working)")
    return key, False
