"""An append-only record of which objects a daemon sealed, so a restarted daemon can tell a
lost object (``DataLost``) from one that never existed (``AccessDenied``).

Each record is 32 bytes: the object ID and its invocation ID. A ``write`` per seal reaches the page
cache, so it survives the daemon being killed (not the machine losing power, which loses the
objects' memory anyway, and with it every reader that could ask).
"""

from __future__ import annotations

import os

REC = 32


class Journal:
    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = -1

    def load(self) -> dict[bytes, str]:
        """Every (object ID -> invocation ID) recorded so far; a torn last record is ignored."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return {}
        out: dict[bytes, str] = {}
        for i in range(0, len(data) - REC + 1, REC):
            out[data[i : i + 16]] = data[i + 16 : i + 32].hex()
        return out

    def rewrite(self, entries: dict[bytes, str]) -> None:
        """Replace the journal with ``entries`` (atomically), then keep appending to it."""
        self.close()
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as f:
            for oid, inv in entries.items():
                f.write(oid + bytes.fromhex(inv))
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.path)

    def append(self, oid: bytes, invocation: str) -> None:
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        os.write(self._fd, oid + bytes.fromhex(invocation))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
