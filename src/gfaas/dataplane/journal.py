"""An append-only record of which objects a daemon sealed, so a restarted daemon can tell a
lost object (``DataLost``) from one that never existed (``AccessDenied``).

Each record is 32 bytes: the object ID and its invocation ID. Records are stored through a shared
mapping of the file, so appending one costs a 32-byte copy and no system call, yet it is in the page
cache the moment it is written and survives the daemon being killed (not the machine losing power,
which loses the objects' memory anyway, and with it every reader that could ask). The file is grown
in steps (allocated, so a full disk is an error at the step, never a SIGBUS at a write), so it ends
in zero bytes; an all-zero record marks the end.

Only records of open invocations matter (a restart keeps those alone). When the records of ended
invocations outnumber the live ones ``compact_ratio`` times, :meth:`Journal.retain` compacts the
file while the daemon runs: the live records go to a new file, which is synced and renamed over the
journal. A crash at any step leaves either the old file or the new one, and both load to the same
records of open invocations.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Container

import numpy as np

from ..errors import CapacityError

REC = 32
_ZERO = bytes(REC)
_STEP = 1 << 20  # grow the file by this much (32,768 records) at a time
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def replace_durably(path: str, data: bytes, step: Callable[[str], None] = lambda name: None,
                    renamed: Callable[[], None] = lambda: None) -> None:
    """Write ``data`` to ``path.new`` (mode 0600, never through a symlink), sync it, rename it over
    ``path`` (``renamed()`` right after), sync the directory. A crash at any step leaves the old
    file or the new one. ``step`` is called after each step (tests inject crashes there)."""
    tmp = path + ".new"
    try:
        os.unlink(tmp)  # left by a crash during an earlier compaction
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        step("written")
        os.fsync(fd)
    finally:
        os.close(fd)
    step("synced")
    os.replace(tmp, path)
    renamed()
    step("renamed")
    dfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class Journal:
    """``compact_ratio``/``compact_min``: compact when dead records exceed both ``compact_ratio``
    times the live ones and ``compact_min``."""

    def __init__(self, path: str, compact_ratio: float = 2.0, compact_min: int = _STEP // REC) -> None:
        self.path = path
        self.compact_ratio = compact_ratio
        self.compact_min = compact_min
        self._fd = -1
        self._map: mmap.mmap | None = None
        self._pos = 0
        self._counts: dict[str, int] = {}  # invocation -> records of it since the last (re)write
        self._dead = 0  # records of invocations that have ended
        self.compactions = 0
        self._step: Callable[[str], None] = lambda name: None  # tests inject crashes between steps

    @property
    def records(self) -> int:
        return self._pos // REC

    @property
    def dead(self) -> int:
        return self._dead

    def load(self) -> dict[bytes, str]:
        """Every (object ID -> invocation ID) recorded so far."""
        try:
            fd = os.open(self.path, os.O_RDONLY | _NOFOLLOW)
        except FileNotFoundError:
            return {}
        with os.fdopen(fd, "rb") as f:
            data = f.read()
        out: dict[bytes, str] = {}
        for i in range(0, len(data) - REC + 1, REC):
            rec = data[i : i + REC]
            if rec == _ZERO:
                break
            out[rec[:16]] = rec[16:].hex()
        return out

    def rewrite(self, entries: dict[bytes, str]) -> None:
        """Replace the journal with ``entries`` (atomically), then keep appending after them."""
        data = b"".join(oid + bytes.fromhex(inv) for oid, inv in entries.items())
        self._replace(data)
        self._counts = {}
        for inv in entries.values():
            self._counts[inv] = self._counts.get(inv, 0) + 1

    def _replace(self, data: bytes) -> None:
        """Replace the journal with ``data`` (:func:`replace_durably`); appends go after it."""
        self.close()

        def renamed() -> None:
            self._pos = len(data)  # appends go after the new file's records from now on
            self._dead = 0

        replace_durably(self.path, data, self._step, renamed)

    def retain(self, live: Container[str]) -> bool:
        """Note that only invocations in ``live`` are open; compact the journal (True) when the
        records of the others have come to outnumber the live ones (see the class). O(invocations
        with records): :meth:`ended` is the O(1) form for one invocation that ended."""
        for inv in [i for i in self._counts if i not in live]:
            self._dead += self._counts.pop(inv)
        return self._maybe_compact(live)

    def ended(self, invocation: str, live: Container[str]) -> bool:
        """Note that ``invocation`` ended (``live``: the invocations still open); compact the journal
        (True) when the records of ended invocations have come to outnumber the live ones."""
        self._dead += self._counts.pop(invocation, 0)
        return self._maybe_compact(live)

    def _maybe_compact(self, live: Container[str]) -> bool:
        if self._dead < self.compact_min or self._dead <= self.compact_ratio * (self.records - self._dead):
            return False
        self.compact(live)
        return True

    def compact(self, live: Container[str]) -> None:
        """Rewrite the journal with only the records of invocations in ``live``."""
        n = self.records
        if self._map is not None:
            data = self._map[: n * REC]
        else:
            with open(self.path, "rb") as f:
                data = f.read(n * REC)
        recs = np.frombuffer(data, dtype=np.uint8).reshape(-1, REC)
        invs = recs[:, 16:].copy().view("S16").ravel()
        names, inverse, counts = np.unique(invs, return_inverse=True, return_counts=True)
        # Invocation IDs are 16 bytes; S16 drops trailing zero bytes, so pad back before hex().
        keep_name = np.array([bytes(x).ljust(16, b"\0").hex() in live for x in names], dtype=bool)
        keep = keep_name[inverse.ravel()] if len(names) else np.zeros(0, dtype=bool)
        self._replace(recs[keep].tobytes())
        self._counts = {bytes(x).ljust(16, b"\0").hex(): int(c) for x, c, k in zip(names, counts, keep_name, strict=True) if k}
        self.compactions += 1

    def _grow(self) -> None:
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o600)
        if self._map is not None:
            self._map.close()
        size = (self._pos // _STEP + 1) * _STEP
        if os.fstat(self._fd).st_size < size:
            try:
                os.posix_fallocate(self._fd, 0, size)
            except OSError as exc:
                raise CapacityError(
                    f"the object journal {self.path} cannot grow to {size} bytes ({exc.strerror});"
                    " free space on its file system"
                ) from None
        self._map = mmap.mmap(self._fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    def append(self, oid: bytes, invocation: str) -> None:
        m = self._map
        if m is None or self._pos + REC > len(m):
            self._grow()
            m = self._map
            assert m is not None
        m[self._pos : self._pos + REC] = oid + bytes.fromhex(invocation)
        self._pos += REC
        self._counts[invocation] = self._counts.get(invocation, 0) + 1

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
