"""The disk tier under the host memory pool: one file per evicted segment in a spill directory.

The store decides what to evict and what to bring back (``gfaas.policy.storage``); this class only
moves bytes between a segment and a file. It is injected into the store like the journal, so the
store itself stays free of I/O and tests can hand it a directory of their own.

Spilled objects do not survive the daemon: like memory, the disk tier is a cache of this process.
:meth:`SpillDir.clear` removes files a crashed daemon left behind (the daemon calls it once it
knows no other daemon serves its socket), and :meth:`SpillDir.close` removes everything on
shutdown. After a restart, the objects that were on disk read as ``DataLost`` through the journal,
as those that were in memory do.

Safety (issue 14, row 10): the directory must belong to the daemon's user and be writable by
nobody else (:func:`gfaas.secfiles.open_private_dir`: checked on an ``O_NOFOLLOW`` directory
descriptor that every later call goes through, so a path swapped afterwards is never followed); files are created ``O_EXCL | O_NOFOLLOW``
with mode 0600 and read back ``O_NOFOLLOW``, and only if they are the very file written (same
device, inode, change time and size): a planted symlink or a swapped file reads as ``DataLost``.
"""

from __future__ import annotations

import logging
import os
import stat

from ..errors import CapacityError
from ..secfiles import open_private_dir

log = logging.getLogger("gfaas.dataplane")

SUFFIX = ".spill"
#: The default disk tier is at most this share of the spill filesystem's free space at start.
DEFAULT_FREE_SHARE = 0.25


def default_capacity(path: str, memory_bytes: int) -> int:
    """The disk tier's size when none is configured: as large as the memory pool (doubling what
    the node holds before it refuses puts), but never more than a quarter of the free space of
    the spill filesystem at start, so a node cannot fill a disk that logs and the OS share."""
    st = os.statvfs(path)
    return max(0, min(memory_bytes, int(st.f_bavail * st.f_frsize * DEFAULT_FREE_SHARE)))


def _open_dir(path: str) -> int:
    """Create ``path`` (0700) if missing and open it without following a symlink; refuse one
    owned by another user or writable by group or others (ConfigError naming the fix)."""
    return open_private_dir(path, "spill_dir", "another user could plant or swap spill files there: point"
                            " spill_dir at a directory of the daemon's own user (mkdir -m 700)")


class SpillDir:
    """Files ``<key>.spill`` under ``path``; at most ``capacity_bytes`` in all (None: no limit).

    ``memory_bytes``, when given with ``capacity_bytes`` None, sets the cap to
    :func:`default_capacity`."""

    def __init__(self, path: str, capacity_bytes: int | None = None, memory_bytes: int | None = None) -> None:
        self.path = path
        self._dfd = _open_dir(path)
        if capacity_bytes is None and memory_bytes is not None:
            capacity_bytes = default_capacity(path, memory_bytes)
        self.capacity_bytes = capacity_bytes
        self.bytes_on_disk = 0
        self.pending = 0  # bytes of writes in flight on a worker thread (counted against the cap)
        self._sizes: dict[int, int] = {}
        # Identity of each file as written (device, inode, change time: an inode number can be
        # reused by a file created in its place): read back only that very file.
        self._ident: dict[int, tuple[int, int, int]] = {}

    def _file(self, key: int) -> str:
        return os.path.join(self.path, f"{key}{SUFFIX}")

    @staticmethod
    def _name(key: int) -> str:
        return f"{key}{SUFFIX}"

    def check_room(self, n: int) -> None:
        """Raise CapacityError if ``n`` more bytes (beyond those being written) would not fit."""
        if self.capacity_bytes is not None and self.bytes_on_disk + self.pending + n > self.capacity_bytes:
            raise CapacityError(
                f"spill directory {self.path} would exceed spill_capacity_bytes={self.capacity_bytes}"
                f" ({self.bytes_on_disk} on disk, {self.pending} being written, {n} more asked);"
                " raise spill_capacity_bytes"
            )

    def write_file(self, key: int, data: memoryview) -> None:
        """Write ``data`` as the file of ``key``; raises CapacityError and leaves no file if the
        write fails, so the caller keeps the bytes where they were. Only I/O, no bookkeeping, so a
        worker thread may run it while the daemon's loop reads and removes other files: the caller
        asks :meth:`check_room` first and :meth:`commit` records the file after."""
        n = data.nbytes
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            try:
                fd = os.open(self._name(key), flags, 0o600, dir_fd=self._dfd)
            except FileExistsError:  # left by a crash (or planted): never written through, replaced
                os.unlink(self._name(key), dir_fd=self._dfd)
                fd = os.open(self._name(key), flags, 0o600, dir_fd=self._dfd)
            try:
                view = data.cast("B")
                done = 0
                while done < n:
                    done += os.write(fd, view[done:])
                st = os.fstat(fd)
                self._ident[key] = (st.st_dev, st.st_ino, st.st_ctime_ns)
            finally:
                os.close(fd)
        except OSError as exc:
            self.discard(key)
            raise CapacityError(
                f"cannot write {n} bytes to the spill directory {self.path}: {exc.strerror or exc};"
                " make it writable, point spill_dir elsewhere, or raise capacity_bytes"
            ) from None

    def commit(self, key: int, n: int) -> None:
        self._sizes[key] = n
        self.bytes_on_disk += n

    def discard(self, key: int) -> None:
        """Remove a file that was written but never committed (its segment changed meanwhile)."""
        self._ident.pop(key, None)
        try:
            os.unlink(self._name(key), dir_fd=self._dfd)
        except OSError:
            pass

    def read_into(self, key: int, dst: memoryview) -> None:
        """Fill ``dst`` (at least the file's size) from the file of ``key``; raises OSError, also
        when the file there is not the one written (a symlink, or swapped: other inode or size)."""
        n = self._sizes[key]
        view = dst.cast("B")
        fd = os.open(self._name(key), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._dfd)
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino, st.st_ctime_ns) != self._ident.get(key) or st.st_size != n or not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise OSError(f"spill file {self._file(key)} was replaced after it was written; not reading it")
        with open(fd, "rb", buffering=0) as f:
            got = 0
            while got < n:
                k = f.readinto(view[got:n])
                if not k:
                    raise OSError(f"spill file {self._file(key)} is truncated ({got} of {n} bytes)")
                got += k

    def remove(self, key: int) -> None:
        n = self._sizes.pop(key, None)
        self._ident.pop(key, None)
        if n is None:
            return
        self.bytes_on_disk -= n
        try:
            os.unlink(self._name(key), dir_fd=self._dfd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("could not remove spill file %s: %s", self._file(key), exc)

    def clear(self, stale: bool = True) -> int:
        """Remove every spill file in the directory (``stale``: left by a daemon that died, which
        is worth a warning); returns how many."""
        self._sizes.clear()
        self._ident.clear()
        self.bytes_on_disk = 0
        if self._dfd < 0:
            return 0
        names = os.listdir(self._dfd)
        n = 0
        for name in names:
            if name.endswith(SUFFIX):
                try:
                    os.unlink(name, dir_fd=self._dfd)
                    n += 1
                except OSError as exc:
                    log.warning("could not remove stale spill file %s: %s", name, exc)
        if n and stale:
            log.warning("removed %d spill files left in %s by an earlier daemon", n, self.path)
        return n

    def close(self) -> None:
        """Remove every file and the directory itself (if it is empty then)."""
        self.clear(stale=False)
        if self._dfd >= 0:
            os.close(self._dfd)
            self._dfd = -1
        try:
            os.rmdir(self.path)
        except OSError:
            pass
