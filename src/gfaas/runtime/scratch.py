"""Scratch directories that do not outlive their owner for long.

A runtime keeps its weight store in ``/dev/shm`` (RAM) and its node's socket and state in ``/tmp``,
and removes both when it closes. Killed outright (SIGKILL, the OOM killer) it cannot, and a killed
``gfaas demo`` once left 1.1 GB of RAM behind. So each directory comes with a lock file beside it,
``<dir>.owner``, that its owner holds (``flock``) for as long as it lives; the kernel drops the lock
when the owner dies however it dies. Whoever next makes a directory with the same prefix removes
those whose lock it can take: their owners are gone.

Only this user's lock files older than :data:`STALE_S` count (a lock file is made, then locked: a
moment in which it is not held yet), and only a directory this user owns is removed, so a file or
directory that another user planted in the shared ``/tmp`` or ``/dev/shm`` is never touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path

log = logging.getLogger("gfaas.runtime")

STALE_S = 30.0  # a lock file younger than this may not be locked yet: left alone
_SUFFIX = ".owner"


class Scratch:
    """A directory ``<base>/<prefix>XXXXXXXX`` (mode 0700) held by this process until :meth:`remove`."""

    def __init__(self, prefix: str, base: str | None = None) -> None:
        base = base or tempfile.gettempdir()
        sweep(prefix, base)
        fd, lock = tempfile.mkstemp(prefix=prefix, suffix=_SUFFIX, dir=base)  # not inherited (O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            path = lock[:-len(_SUFFIX)]
            os.mkdir(path, 0o700)  # its name is new: mkstemp made the lock file's name unique
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(lock)
            raise
        self.path = Path(path)
        self._lock_path = lock
        self._fd: int | None = fd

    def remove(self) -> None:
        """Remove the directory and give up its lock (idempotent)."""
        if self._fd is None:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.unlink(self._lock_path)
        os.close(self._fd)
        self._fd = None


def sweep(prefix: str, base: str, now: float | None = None) -> list[str]:
    """Remove the directories ``<base>/<prefix>*`` whose owner is gone (its lock can be taken); the
    paths removed."""
    now = time.time() if now is None else now
    me = os.geteuid()
    removed: list[str] = []
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    for name in names:
        if not (name.startswith(prefix) and name.endswith(_SUFFIX)) or len(name) <= len(prefix) + len(_SUFFIX):
            continue
        lock = os.path.join(base, name)
        try:
            st = os.lstat(lock)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_uid != me or now - st.st_mtime < STALE_S:
            continue
        try:
            fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # held: its owner lives
            path = lock[:-len(_SUFFIX)]
            with contextlib.suppress(OSError):
                d = os.lstat(path)
                if stat.S_ISDIR(d.st_mode) and d.st_uid == me:
                    shutil.rmtree(path, ignore_errors=True)
                    removed.append(path)
            with contextlib.suppress(OSError):
                os.unlink(lock)
        finally:
            os.close(fd)
    if removed:
        log.info("removed %d scratch director%s left by runtimes that were killed: %s", len(removed),
                 "y" if len(removed) == 1 else "ies", ", ".join(removed))
    return removed
