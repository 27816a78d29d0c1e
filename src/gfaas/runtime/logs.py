"""Function logs: captured in each worker, kept by the runtime, read by workflow, function and invocation.

**Capture** (:class:`Capture`, in the worker process): file descriptors 1 and 2 are pipes read by one
thread started with the worker (so prints from C extensions and subprocesses are caught too, and
``sys.stdout``/``sys.stderr`` write through to them), and a handler on the worker's root logger turns
log records into lines. Each line is bounded (:data:`MAX_LINE` bytes, cut with a marker) and so is a
batch (:data:`MAX_BATCH_LINES` lines, :data:`MAX_BATCH_BYTES` bytes; the excess is counted and reported
as one "N lines dropped" line), which keeps a reply under the control socket's message bound however
much a handler prints. A task's lines travel back with its ``Done``/``Failed`` reply; lines printed
outside a task (model load, between tasks) go with ``Ready`` or the next reply, marked as not the task's.

**Attribution** is the runtime's, never the worker's: a line carries only whether it was printed during
the task; the runtime adds the workflow and function of the pool that owns the worker and the
invocation of the task it sent. Function code therefore cannot put a line into another function's or
another invocation's log, whatever it prints or however it tampers with its own process.

**Keep** (:class:`LogStore`, in the runtime): the last ``ring`` lines of each function in memory, and
JSON lines files ``<dir>/<workflow>/<function>.log`` rotated at ``file_bytes`` keeping ``keep_files``
old ones, made 0600 in 0700 directories owned by the runtime (sandboxed workers run as other uids and
cannot read them).
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import select
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

import msgspec

from ..errors import ConfigError

MAX_LINE = 8 * 1024
MAX_BATCH_LINES = 1000
# A reply is one SOCK_SEQPACKET message, which the kernel bounds by the socket's send buffer (212992
# bytes by default on Linux): a batch stays well under it, tracebacks and outputs' references included.
MAX_BATCH_BYTES = 128 * 1024
STREAMS = ("stdout", "stderr", "log")
_CUT = " ...[line cut at {n} bytes]"


class LogLine(msgspec.Struct, array_like=True):
    """One captured line as a worker sends it: no workflow, function or invocation (the runtime adds them)."""

    t: float  # time.time() when captured
    stream: str  # stdout | stderr | log
    level: str  # the record's level name for "log"; "" otherwise
    text: str
    task: bool  # printed while a task ran (so it is that task's invocation's)


def _cut(text: str) -> str:
    raw = text.encode("utf-8", "backslashreplace")
    if len(raw) <= MAX_LINE:
        return text
    return raw[:MAX_LINE].decode("utf-8", "ignore") + _CUT.format(n=MAX_LINE)


def _flush() -> None:
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except (OSError, ValueError, AttributeError):
            pass


class _Batch:
    """Lines waiting to go to the runtime, bounded in lines and bytes."""

    def __init__(self) -> None:
        self.lines: list[LogLine] = []
        self.nbytes = 0
        self.dropped = 0

    def add(self, line: LogLine) -> None:
        n = len(line.text.encode("utf-8", "surrogatepass")) + 16
        if len(self.lines) >= MAX_BATCH_LINES - 1 or self.nbytes + n > MAX_BATCH_BYTES:
            self.dropped += 1  # one slot stays free for the "dropped" line
            return
        self.lines.append(line)
        self.nbytes += n


class _Records(logging.Handler):
    def __init__(self, cap: Capture) -> None:
        super().__init__(logging.NOTSET)
        self.cap = cap

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = f"{record.name}: {record.getMessage()}"
            if record.exc_info:
                text += "\n" + "".join(logging.Formatter().formatException(record.exc_info))
        except Exception:  # noqa: BLE001 - a bad format string must not fail the handler's call
            text = f"{record.name}: {record.msg!r} (unformattable arguments)"
        self.cap.add_record(text.splitlines() or [""], record.levelname, record.created)


class Capture:
    """A worker's stdout, stderr (file descriptors 1 and 2) and log records, batched for the runtime.

    ``begin()`` before a task, ``take()`` after it (and before ``Ready``): the lines since the last
    ``take``. Reading the pipes happens under one lock, by the reader thread while data flows and by
    ``take`` until the pipes are empty, so everything the process wrote to fd 1/2 before ``take`` is in
    its batch; a handler that prints nothing costs one poll of both pipes at its start and one at its
    end (none at the start of a chain's next function: :meth:`resume`), and nothing else.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._batch = _Batch()
        self._in_task = False
        self._partial: dict[int, bytearray] = {}
        self._skip: dict[int, bool] = {}  # the rest of a cut line is dropped up to its newline
        self._unfinished = False  # read since the last drain: a partial line or a skip may be pending
        self._fds: dict[int, str] = {}
        self._thread: threading.Thread | None = None
        self._ready = select.poll()
        self.console = -1  # the worker's own stderr before install: for the worker's fatal errors only

    def fatal(self, text: str) -> None:
        """Write to the worker's original stderr (what started the runtime sees), not the function's log."""
        fd = self.console if self.console >= 0 else 2
        try:
            os.write(fd, text.encode("utf-8", "backslashreplace"))
        except OSError:
            pass

    def install(self, level: int = logging.INFO) -> None:
        """Point fds 1 and 2 at pipes read here, and add a handler on the root logger (worker only)."""
        self.console = os.dup(2)  # not inherited (close-on-exec)
        for target, stream in ((1, "stdout"), (2, "stderr")):
            r, w = os.pipe()
            os.dup2(w, target)
            os.close(w)
            os.set_blocking(r, False)
            self._fds[r] = stream
            self._partial[r] = bytearray()
            self._skip[r] = False
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                      errors="backslashreplace", line_buffering=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                      errors="backslashreplace", line_buffering=True)
        for fd in self._fds:
            self._ready.register(fd, select.POLLIN)
        root = logging.getLogger()
        root.addHandler(_Records(self))
        root.setLevel(level)
        self._thread = threading.Thread(target=self._reader, name="gfaas-log-reader", daemon=True)
        self._thread.start()

    def pipe_fds(self) -> list[int]:
        """The read ends of the pipes behind fds 1 and 2 (the worker's own; kept across a uid drop)."""
        return list(self._fds)

    def add(self, stream: str, text: str, level: str = "", t: float | None = None) -> None:
        with self._lock:
            self._batch.add(LogLine(t or time.time(), stream, level, _cut(text), self._in_task))

    def add_record(self, parts: list[str], level: str, t: float) -> None:
        """A log record's lines, after what the process printed before it (pipes read first)."""
        _flush()
        with self._lock:
            for fd in self._fds:
                self._read_fd(fd)
            for part in parts:
                self._batch.add(LogLine(t, "log", level, _cut(part), self._in_task))

    def begin(self) -> None:
        """A task starts: lines from now on are its own (what came before is not)."""
        with self._lock:
            # One poll finds what is readable. A task that printed nothing costs this one system call
            # and no more: nothing is left of a line from before (_unfinished) to end.
            ready = self._ready.poll(0) if self._fds else ()
            if ready or self._unfinished:
                self._drain_ready(ready)
            self._in_task = True

    def resume(self) -> None:
        """:meth:`begin` right after a :meth:`take` (a chain's next function): that take emptied the
        pipes a moment ago, so this one skips their system call."""
        with self._lock:
            self._in_task = True

    def take(self) -> list[LogLine]:
        """The lines since the last take (pipes drained; an unterminated line ends here)."""
        _flush()  # outside the lock: a flush into a full pipe waits for the reader thread, which takes it
        with self._lock:  # the drain and the batch under one hold: a take runs after every task
            ready = self._ready.poll(0) if self._fds else ()
            if ready or self._unfinished:
                self._drain_ready(ready)
            if not self._batch.lines and not self._batch.dropped:  # the usual task: it printed nothing
                self._in_task = False
                return []
            batch, self._batch = self._batch, _Batch()
            in_task, self._in_task = self._in_task, False
        lines = batch.lines
        if batch.dropped:  # the task's when a task ran (most of a flood is), else no invocation's
            lines.append(LogLine(time.time(), "stderr", "", f"[gfaas] {batch.dropped} lines dropped (over the "
                                 f"{MAX_BATCH_LINES} lines / {MAX_BATCH_BYTES} bytes of one batch)", in_task))
        return lines

    # -- the pipes
    def _drain_ready(self, ready: list[tuple[int, int]] | tuple[()]) -> None:
        """Under the lock: read the pipes ``ready`` (what the caller's poll found readable), then end any
        unterminated line, read now or left by the reader thread."""
        readable = {fd for fd, _ in ready}
        for fd in self._fds:
            if fd in readable:
                self._read_fd(fd)
            if self._partial[fd]:
                self._line(fd, bytes(self._partial[fd]))
                self._partial[fd].clear()
            self._skip[fd] = False
        self._unfinished = False

    def _reader(self) -> None:
        # no_new_privs is a thread's own: the sandbox sets it on the thread that drops privileges, so
        # this one sets it itself (nothing it could ever start may gain privileges by exec).
        from .sandbox import _PR_SET_NO_NEW_PRIVS, _prctl

        try:
            _prctl(_PR_SET_NO_NEW_PRIVS, 1)
        except OSError:
            pass
        poll = select.poll()
        for fd in self._fds:
            poll.register(fd, select.POLLIN)
        while True:
            try:
                poll.poll()
            except InterruptedError:
                continue
            with self._lock:
                for fd in self._fds:
                    self._read_fd(fd)

    def _read_fd(self, fd: int) -> None:
        """Read what is in the pipe now (under the lock) and cut it into lines."""
        while True:
            try:
                data = os.read(fd, 1 << 16)
            except BlockingIOError:
                return
            if not data:
                return
            self._unfinished = True  # perhaps a line without its newline yet, or the rest of a cut one
            buf = self._partial[fd]
            buf += data
            if b"\n" in data:
                *lines, rest = bytes(buf).split(b"\n")
                buf[:] = rest
                for raw in lines:
                    if self._skip[fd]:
                        self._skip[fd] = False
                        continue
                    self._line(fd, raw)
            if len(buf) > MAX_LINE:  # a huge line without a newline: keep its head, drop the rest
                if not self._skip[fd]:
                    self._line(fd, bytes(buf))
                    self._skip[fd] = True
                buf.clear()

    def _line(self, fd: int, raw: bytes) -> None:
        if self._batch.dropped or len(self._batch.lines) >= MAX_BATCH_LINES - 1:
            self._batch.dropped += 1  # counted without decoding: 10 MB of prints cost little
            return
        text = raw[:MAX_LINE].decode("utf-8", "backslashreplace").rstrip("\r")
        if len(raw) > MAX_LINE:
            text += _CUT.format(n=MAX_LINE)
        self._batch.add(LogLine(time.time(), self._fds[fd], "", text, self._in_task))


# ---- the runtime's side ----------------------------------------------------------------------------
def _record(workflow: str, version: str, function: str, invocation: str, line: LogLine, seq: int) -> dict[str, Any]:
    # A worker is function code: what it sends is checked like input (a NaN time would make bad JSON).
    stream = line.stream if line.stream in STREAMS else "stdout"
    t = float(line.t) if math.isfinite(line.t) else time.time()
    return {"seq": seq, "time": t, "workflow": workflow, "version": version, "function": function,
            "invocation": invocation, "stream": stream, "level": str(line.level)[:16], "text": _cut(str(line.text))}


def _private_dir(path: str) -> None:
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not os.path.isdir(path) or os.path.islink(path) or st.st_uid != os.geteuid():
        raise ConfigError(f"log directory {path} is not a directory of this user (uid {os.geteuid()}); "
                          "pick another log_dir")
    os.chmod(path, 0o700)


class LogStore:
    """The runtime's logs: per function, the last ``ring`` lines (at most ``ring_bytes`` of text) in
    memory, plus rotated JSON lines files."""

    def __init__(self, directory: str, *, ring: int = 10_000, ring_bytes: int = 4 << 20, file_bytes: int = 4 << 20,
                 keep_files: int = 3) -> None:
        if ring < 1 or ring_bytes < 1 or file_bytes < 1 or keep_files < 0:
            raise ConfigError("LogStore: ring, ring_bytes and file_bytes must be >= 1 and keep_files >= 0")
        self.dir = directory
        self.ring, self.ring_bytes, self.file_bytes, self.keep_files = ring, ring_bytes, file_bytes, keep_files
        self._held: dict[tuple[str, str], int] = {}  # text bytes (characters) each ring holds
        _private_dir(directory)
        self._lock = threading.Lock()
        self._seq = 0
        self._rings: dict[tuple[str, str], deque[dict[str, Any]]] = {}
        self._files: dict[tuple[str, str], tuple[int, int]] = {}  # -> (fd, size)

    def add(self, workflow: str, function: str, invocation: str, lines: Iterable[LogLine],
            version: str = "") -> list[dict[str, Any]]:
        """Keep a worker's lines: those marked ``task`` are ``invocation``'s, the others no invocation's."""
        lines = list(lines)
        if not lines:
            return []
        for name in (workflow, function):  # spec names never are; a path must not come from one that is
            if not name or "/" in name or name.startswith(".") or "\0" in name:
                raise ConfigError(f"log name {name!r} cannot name a file; workflow and function names are "
                                  "lower-case letters, digits, '_' and '-'")
        key = (workflow, function)
        with self._lock:
            recs = []
            for line in lines:
                self._seq += 1
                recs.append(_record(workflow, version, function, invocation if line.task else "", line, self._seq))
            ring = self._rings.get(key)
            if ring is None:
                ring = self._rings[key] = deque()
            held = self._held.get(key, 0)
            for r in recs:
                ring.append(r)
                held += len(r["text"]) + 64
            while ring and (len(ring) > self.ring or held > self.ring_bytes):
                held -= len(ring.popleft()["text"]) + 64
            self._held[key] = held
            try:
                self._write(key, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs).encode())
            except OSError as exc:  # a full disk loses file lines, never the invocation
                logging.getLogger("gfaas.runtime").warning("could not write the log of %s/%s: %s",
                                                           workflow, function, exc)
        return recs

    def _path(self, key: tuple[str, str]) -> str:
        return os.path.join(self.dir, key[0], f"{key[1]}.log")

    def _write(self, key: tuple[str, str], data: bytes) -> None:
        fd, size = self._files.get(key, (-1, 0))
        if fd >= 0 and size + len(data) > self.file_bytes and size > 0:
            os.close(fd)
            fd = -1
            self._rotate(self._path(key))
        if fd < 0:
            d = os.path.join(self.dir, key[0])
            _private_dir(d)
            fd = os.open(self._path(key), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            os.fchmod(fd, 0o600)
            size = os.fstat(fd).st_size
        os.write(fd, data)
        self._files[key] = (fd, size + len(data))

    def _rotate(self, path: str) -> None:
        for k in range(self.keep_files, 0, -1):
            src = path if k == 1 else f"{path}.{k - 1}"
            if os.path.exists(src):
                os.replace(src, f"{path}.{k}")
        if self.keep_files == 0:
            os.unlink(path)

    def known(self, workflow: str) -> bool:
        with self._lock:
            return any(w == workflow for w, _ in self._rings)

    def read(self, workflow: str, function: str | None = None, invocation: str | None = None,
             since: float | None = None, after: int | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        """The last ``limit`` kept lines of ``workflow`` that match, oldest first."""
        with self._lock:
            rings = [r for (w, f), r in self._rings.items() if w == workflow and function in (None, f)]
            out = [r for ring in rings for r in ring
                   if (invocation is None or r["invocation"] == invocation) and (since is None or r["time"] >= since)
                   and (after is None or r["seq"] > after)]
        out.sort(key=lambda r: r["seq"])
        return out[-limit:] if limit > 0 else []

    def close(self) -> None:
        with self._lock:
            for fd, _ in self._files.values():
                os.close(fd)
            self._files.clear()


def failure_lines(recs: list[dict[str, Any]], invocation: str, n: int = 50) -> tuple[str, ...]:
    """The last ``n`` lines an invocation's failing function printed, as ``stream: text``."""
    mine = [r for r in recs if r["invocation"] == invocation]
    return tuple(f"{r['stream']}: {r['text']}" for r in mine[-n:])
