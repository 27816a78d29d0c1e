"""An append-only record of which objects a daemon sealed, so a restarted daemon can tell a
lost object (``DataLost``) from one that never existed (``AccessDenied``).

Each record is 32 bytes: the object ID and its invocation ID. Records are stored through a shared
mapping of the file, so appending one costs a 32-byte copy and no system call, yet it is in the page
cache the moment it is written and survives the daemon being killed (not the machine losing power,
which loses the objects' memory anyway, and with it every reader that could ask). The file is grown
in steps, so it ends in zero bytes; an all-zero record marks the end.
"""

from __future__ import annotations

import mmap
import os

REC = 32
_ZERO = bytes(REC)
_STEP = 1 << 20  # grow the file by this much (32,768 records) at a time


class Journal:
    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = -1
        self._map: mmap.mmap | None = None
        self._pos = 0

    def load(self) -> dict[bytes, str]:
        """Every (object ID -> invocation ID) recorded so far."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return {}
        out: dict[bytes, str] = {}
        for i in range(0, len(data) - REC + 1, REC):
            rec = data[i : i + REC]
            if rec == _ZERO:
                break
            out[rec[:16]] = rec[16:].hex()
        return out

    def rewrite(self, entries: dict[bytes, str]) -> None:
        """Replace the journal with ``entries`` (atomically), then keep appending after them."""
        self.close()
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as f:
            for oid, inv in entries.items():
                f.write(oid + bytes.fromhex(inv))
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.path)
        self._pos = len(entries) * REC

    def _grow(self) -> None:
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        if self._map is not None:
            self._map.close()
        size = (self._pos // _STEP + 1) * _STEP
        if os.fstat(self._fd).st_size < size:
            os.ftruncate(self._fd, size)
        self._map = mmap.mmap(self._fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    def append(self, oid: bytes, invocation: str) -> None:
        m = self._map
        if m is None or self._pos + REC > len(m):
            self._grow()
            m = self._map
            assert m is not None
        m[self._pos : self._pos + REC] = oid + bytes.fromhex(invocation)
        self._pos += REC

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
