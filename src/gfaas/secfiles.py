"""Private directories and secret files: refused when another local user could have planted them or
can read or change them, and never followed through a symlink.

The one place these checks live, for the data plane (state, socket and spill directories, keys,
admin tokens, the invocation registry, the cluster key, Redis passwords) and the gateway (its state
directory and bearer token). The policy package does not use it (no I/O there).

A directory is private when it is not a symlink (opened ``O_NOFOLLOW``), is owned by this process's
user and has none of the caller's ``deny`` bits (by default: not writable by group or others). A
secret file is read only as a regular file of this user with no group or other bits, opened
``O_NOFOLLOW`` and checked on the open descriptor (so a path swapped after the check is never read).
Files are created with ``O_EXCL | O_NOFOLLOW`` (mode 0600) and replaced through a fresh temporary
file and ``rename``, which replaces a planted symlink instead of writing through it.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat

from .errors import ConfigError

_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def _link_target(path: str) -> str:
    try:
        return repr(os.readlink(path))
    except OSError:
        return "somewhere"


def _makedirs(path: str) -> None:
    """``mkdir`` ``path`` (0700, with missing parents 0700) unless something is there already."""
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


def open_private_dir(path: str, what: str, fix: str | None = None, deny: int = 0o022) -> int:
    """Create ``path`` (mode 0700, with missing parents) unless it exists, open it ``O_NOFOLLOW`` and
    return the descriptor; :class:`ConfigError` naming the path, the owner or mode and ``fix`` when it
    is a symlink, not a directory, not this user's, or has any of the mode bits ``deny`` (0o022: group
    or others may write into it; 0o077: they may not even enter it)."""
    path = os.path.abspath(path)
    fix = fix or f"remove it (rm -rf {path}) so it is made anew, or choose another path"
    try:
        _makedirs(path)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(path):
            raise ConfigError(f"{what} {path} is a symlink (to {_link_target(path)}); it is refused: {fix}") from None
        if exc.errno == errno.ENOTDIR:
            raise ConfigError(f"{what} {path} is not a directory; {fix}") from None
        raise ConfigError(f"{what} {path} cannot be used: {exc.strerror or exc}; {fix}") from None
    st = os.fstat(fd)
    uid = os.geteuid()
    problem = ""
    if st.st_uid != uid:
        problem = (f"{what} {path} is owned by uid {st.st_uid}, not by this user (uid {uid}): another user may"
                   f" have planted it; {fix}")
    elif st.st_mode & deny:
        how = "writable by group or others" if st.st_mode & deny & 0o022 else "open to group or others"
        problem = f"{what} {path} has mode {stat.S_IMODE(st.st_mode):04o}, {how}; run chmod 700 {path}, or {fix}"
    if problem:
        os.close(fd)
        raise ConfigError(problem)
    return fd


def private_dir(path: str, what: str, fix: str | None = None, deny: int = 0o022) -> str:
    """:func:`open_private_dir` for callers that go on by path: the checked absolute path."""
    os.close(open_private_dir(path, what, fix, deny))
    return os.path.abspath(path)


def create_file(path: str, data: bytes, sync: bool = True) -> None:
    """Create ``path`` holding ``data`` (mode 0600); ``FileExistsError`` if anything, even a symlink, is
    there. ``sync``: fsync it (files that must outlive the machine, not just the process)."""
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


def read_private_file(path: str, what: str, limit: int | None = None, must_exist: bool = True) -> bytes:
    """The contents of ``path``; :class:`ConfigError` naming the path, owner or mode and the fix when it
    is a symlink, not a regular file, not this user's, open to group or others, or larger than ``limit``
    bytes. A missing file is a ConfigError too, or with ``must_exist=False`` ``FileNotFoundError`` (for
    callers that then create it)."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    except FileNotFoundError:
        if not must_exist:
            raise
        raise ConfigError(f"cannot open the {what} {path}: it does not exist") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the last component is a symlink
            raise ConfigError(f"{what} {path} is a symlink (to {_link_target(path)}); it is never followed:"
                              " put the file itself there") from None
        raise ConfigError(f"cannot open the {what} {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        uid = os.geteuid()
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{what} {path} is not a regular file; put the file itself there")
        if st.st_uid != uid:
            raise ConfigError(f"{what} {path} is owned by uid {st.st_uid}, not by this user (uid {uid}): another"
                              f" user may have planted it; remove it, or chown {uid} {path} if you trust it")
        if st.st_mode & 0o077:
            raise ConfigError(f"{what} {path} has mode {stat.S_IMODE(st.st_mode):04o}: group or others may read"
                              f" or change it; run chmod 600 {path}")
        chunks = []
        size = 0
        while chunk := os.read(fd, 65536 if limit is None else min(65536, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if limit is not None and size > limit:
                raise ConfigError(f"{what} {path} holds more than {limit} bytes; is it the right file?")
        return b"".join(chunks)
    finally:
        os.close(fd)


def load_or_create(path: str, what: str, new: bytes) -> tuple[bytes, bool]:
    """The contents of the private file ``path``, or, when there is none, ``new`` written there first
    (:func:`create_file`); and whether it was created just now. Creating first (``O_EXCL``) makes two
    starts racing for the file agree on one content."""
    try:
        create_file(path, new)
    except FileExistsError:
        return read_private_file(path, what), False
    except OSError as exc:
        raise ConfigError(f"cannot create the {what} {path}: {exc.strerror or exc}") from None
    return new, True
