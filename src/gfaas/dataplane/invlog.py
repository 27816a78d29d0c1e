"""The open invocations of a node on disk, so a daemon restarted after a crash still authenticates
their functions and tells their lost objects (``DataLost``) from unknown ones.

An append-only file, ``<state_dir>/invocations.journal``. Each open appends one line holding the
invocation and its tokens' keyed hashes (never a token, see auth.py); each end, or batch of ends,
one line naming the ended IDs. An open or an end costs one ``write`` of a few hundred bytes however
many invocations are open; the JSON registry this replaces was rewritten whole on every open and
end (O(open invocations) each, 8.6 ms with 1,000 open: docs/performance.md). As that registry was,
lines are not synced: once written they are in the page cache and survive the daemon being killed
(not the machine losing power, which takes the objects' memory and the invocations' runtime too).

A line is ``<CRC-32 of the JSON, 8 hex digits> <JSON>\\n``. Loading replays the lines in order and
stops at the first one that is incomplete or fails its checksum: the write the daemon was killed
in, so no record before it is lost. The daemon rewrites the file when it loads it, so nothing is
ever appended after a damaged tail (and a symlink planted at the path is replaced, not followed).

Compaction: once the records of ended invocations (their opens and the ends) outnumber the open
ones ``compact_ratio`` times, and ``compact_min``, the open invocations are written to a new file,
one line each, which is synced and renamed over the journal (journal.py's :func:`replace_durably`).
A crash at any step leaves the old file or the new one, and both replay to the same open
invocations. A compaction is O(open) and follows at least ``compact_ratio`` times that many ends:
O(1) per end, amortised.
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from collections.abc import Callable, Iterable

from ..errors import CapacityError, ConfigError
from ..secfiles import read_private_file
from .auth import Invocation, Registry
from .journal import replace_durably

log = logging.getLogger("gfaas.dataplane")

_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def _line(record: dict[str, object]) -> bytes:
    body = json.dumps(record, separators=(",", ":")).encode()
    return b"%08x %s\n" % (zlib.crc32(body), body)


def _records(data: bytes) -> tuple[list[dict[str, object]], int]:
    """The intact records at the start of ``data``, and the number of bytes after them."""
    out: list[dict[str, object]] = []
    pos = 0
    while pos < len(data):
        end = data.find(b"\n", pos)
        if end < 0:
            break  # a line the writer did not finish
        line = data[pos:end]
        try:
            crc, body = int(line[:8], 16), line[9:]
            if line[8:9] != b" " or zlib.crc32(body) != crc:
                break
            rec = json.loads(body)
        except ValueError:
            break
        if not isinstance(rec, dict):
            break
        out.append(rec)
        pos = end + 1
    return out, len(data) - pos


class InvocationLog:
    """``compact_ratio``/``compact_min``: compact when the records of ended invocations exceed both
    ``compact_ratio`` times the open invocations and ``compact_min``."""

    def __init__(self, path: str, compact_ratio: float = 2.0, compact_min: int = 1024) -> None:
        self.path = path
        self.compact_ratio = compact_ratio
        self.compact_min = compact_min
        self.records = 0  # lines in the file
        self.compactions = 0
        self._fd = -1
        self._damaged = False  # an append failed part-way: the next record rewrites the file instead
        self._step: Callable[[str], None] = lambda name: None  # tests inject crashes between steps

    def load(self, key: bytes, legacy: str | None = None) -> Registry:
        """The open invocations the journal records (token hashes keyed with ``key``), then a fresh
        journal holding just them. Without a journal, ``legacy`` names the JSON registry of earlier
        versions: it is read instead, and removed once the journal holds what it held. A journal or
        registry that cannot be read (wrong owner or mode, a symlink) is ignored with a warning, as
        are records after a damaged line."""
        reg = Registry(key)
        try:
            data: bytes | None = read_private_file(self.path, "invocation journal", must_exist=False)
        except FileNotFoundError:
            data = None
        except ConfigError as exc:
            log.warning("ignoring the unreadable invocation journal: %s", exc)
            data = b""
        if data is not None:
            recs, torn = _records(data)
            try:
                for rec in recs:
                    self._replay(reg, rec)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                log.warning("invocation journal %s: ignoring the records after an unreadable one (%r)", self.path, exc)
            if torn:
                log.warning("invocation journal %s: ignoring %d bytes after its last whole record (a write cut"
                            " short by a crash)", self.path, torn)
        elif legacy is not None:
            self._load_legacy(reg, legacy, key)
        self.rewrite(reg)
        if legacy is not None:
            try:
                os.unlink(legacy)  # the journal holds it now (a symlink there is removed, not followed)
            except FileNotFoundError:
                pass
        return reg

    @staticmethod
    def _replay(reg: Registry, rec: dict[str, object]) -> None:
        if "open" in rec:
            inv = Invocation.from_json(rec["open"], reg.key)  # type: ignore[arg-type]
            if inv.id in reg:
                reg.end(inv.id)
            reg._add(inv)
        for inv_id in rec.get("end", ()):  # type: ignore[attr-defined]
            if inv_id in reg:
                reg.end(inv_id)

    @staticmethod
    def _load_legacy(reg: Registry, path: str, key: bytes) -> None:
        try:
            items = json.loads(read_private_file(path, "invocation registry", must_exist=False))
            for d in items:
                reg._add(Invocation.from_json(d, key))
        except FileNotFoundError:
            pass
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("ignoring unreadable invocation registry %s: %s", path, exc)

    def rewrite(self, registry: Registry) -> None:
        """Replace the journal with one record per invocation open in ``registry``."""
        invs = registry.invocations()
        self.close()
        try:
            replace_durably(self.path, b"".join(_line({"open": inv.to_json()}) for inv in invs), self._step)
        except OSError as exc:
            raise self._error(exc) from None
        self.records = len(invs)
        self._damaged = False

    def opened(self, inv: Invocation, registry: Registry) -> None:
        """Record an open (its token hashes, never its tokens); ``registry`` holds it already."""
        self._append(_line({"open": inv.to_json()}), registry)

    def ended(self, invocation_ids: Iterable[str], registry: Registry) -> bool:
        """Record that these invocations ended (``registry``: what is open now, after them); compact
        (True) when the records of ended invocations have come to outnumber the open ones."""
        ids = list(invocation_ids)
        if ids:
            self._append(_line({"end": ids}), registry)
        dead = self.records - len(registry)
        if dead < self.compact_min or dead <= self.compact_ratio * len(registry):
            return False
        self.rewrite(registry)
        self.compactions += 1
        return True

    def _append(self, line: bytes, registry: Registry) -> None:
        if self._damaged:  # appending after a torn line would hide this record from a replay
            self.rewrite(registry)
            return
        try:
            if self._fd < 0:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW, 0o600)
            view = memoryview(line)
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as exc:
            self._damaged = True
            self.close()
            raise self._error(exc) from None
        self.records += 1

    def _error(self, exc: OSError) -> CapacityError:
        return CapacityError(f"cannot record open invocations in {self.path} ({exc.strerror or exc}); free space"
                             " on its file system")

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
