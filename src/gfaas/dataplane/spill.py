"""The disk tier under the host memory pool: one file per evicted segment in a spill directory.

The store decides what to evict and what to bring back (``gfaas.policy.storage``); this class only
moves bytes between a segment and a file. It is injected into the store like the journal, so the
store itself stays free of I/O and tests can hand it a directory of their own.

Spilled objects do not survive the daemon: like memory, the disk tier is a cache of this process.
:meth:`SpillDir.clear` removes files a crashed daemon left behind (the daemon calls it once it
knows no other daemon serves its socket), and :meth:`SpillDir.close` removes everything on
shutdown. After a restart, the objects that were on disk read as ``DataLost`` through the journal,
as those that were in memory do.
"""

from __future__ import annotations

import logging
import os

from ..errors import CapacityError

log = logging.getLogger("gfaas.dataplane")

SUFFIX = ".spill"


class SpillDir:
    """Files ``<key>.spill`` under ``path``; at most ``capacity_bytes`` in all (None: no limit)."""

    def __init__(self, path: str, capacity_bytes: int | None = None) -> None:
        self.path = path
        self.capacity_bytes = capacity_bytes
        self.bytes_on_disk = 0
        self.pending = 0  # bytes of writes in flight on a worker thread (counted against the cap)
        self._sizes: dict[int, int] = {}

    def _file(self, key: int) -> str:
        return os.path.join(self.path, f"{key}{SUFFIX}")

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
        path = self._file(key)
        try:
            os.makedirs(self.path, mode=0o700, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                view = data.cast("B")
                done = 0
                while done < n:
                    done += os.write(fd, view[done:])
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
        try:
            os.unlink(self._file(key))
        except OSError:
            pass

    def read_into(self, key: int, dst: memoryview) -> None:
        """Fill ``dst`` (at least the file's size) from the file of ``key``; raises OSError."""
        n = self._sizes[key]
        view = dst.cast("B")
        with open(self._file(key), "rb", buffering=0) as f:
            got = 0
            while got < n:
                k = f.readinto(view[got:n])
                if not k:
                    raise OSError(f"spill file {self._file(key)} is truncated ({got} of {n} bytes)")
                got += k

    def remove(self, key: int) -> None:
        n = self._sizes.pop(key, None)
        if n is None:
            return
        self.bytes_on_disk -= n
        try:
            os.unlink(self._file(key))
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("could not remove spill file %s: %s", self._file(key), exc)

    def clear(self, stale: bool = True) -> int:
        """Remove every spill file in the directory (``stale``: left by a daemon that died, which
        is worth a warning); returns how many."""
        self._sizes.clear()
        self.bytes_on_disk = 0
        try:
            names = os.listdir(self.path)
        except (FileNotFoundError, NotADirectoryError):
            return 0
        n = 0
        for name in names:
            if name.endswith(SUFFIX):
                try:
                    os.unlink(os.path.join(self.path, name))
                    n += 1
                except OSError as exc:
                    log.warning("could not remove stale spill file %s: %s", name, exc)
        if n and stale:
            log.warning("removed %d spill files left in %s by an earlier daemon", n, self.path)
        return n

    def close(self) -> None:
        """Remove every file and the directory itself (if it is empty then)."""
        self.clear(stale=False)
        try:
            os.rmdir(self.path)
        except OSError:
            pass
