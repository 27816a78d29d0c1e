"""Worker starts by fork from a template process (a zygote, after SOCK, ATC'18).

A fresh ``python`` that imports numpy, onnxruntime, msgspec and gfaas before it can take a task costs
a quarter of a second or more; most of it is imports every worker repeats. So the runtime keeps one
**template** process per kind of worker (its thread count; torch preloaded or not): it has imported
what every worker imports and holds nothing of any tenant (no spec, no model, no token, no daemon
connection). A new worker is a ``fork()`` of it, which shares the imported modules' pages
copy-on-write and then runs exactly what a spawned worker runs (:func:`gfaas.runtime.worker.serve_fd`):
Init from the runtime, the function's model, the uid drop, the function's code, Ready.

Both kinds of start use an isolated interpreter started in ``/`` (:mod:`gfaas.pyexec`), so a module
planted in the directory the gateway was started from is never imported (as root, in the phase
before the uid drop).

The template is the runtime's child; the workers it forks are the template's children. The runtime
follows each one through a pidfd (exit, kill) and asks the template for its exit status, which the
template reaps. The template exits when the runtime closes its control socket; its workers live on
until the runtime closes theirs.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence

import msgspec

from ..errors import FunctionFailed
from ..pyexec import module_argv, search_path
from .sandbox import WORKER_ENV, Identity, worker_env

log = logging.getLogger("gfaas.runtime")

__all__ = ["PRELOAD", "ForkServer", "ForkedProcess", "template_env"]

# Imported by the template, hence by every worker before its fork: what every worker needs, nothing a
# tenant brings. onnxruntime (and onnx) only where installed; torch only in the template of GPU workers.
PRELOAD = ("numpy", "numpy.random", "msgspec", "gfaas.runtime.worker", "gfaas.dataplane.client", "gfaas.models",
           "gfaas.models.files", "gfaas.models.runtime", "onnx", "onnxruntime", "redis",
           # imported by a sandboxed worker before its uid drop, and by shared (dedup) model loading
           "encodings.idna", "stringprep", "unicodedata", "gfaas.dedup.shared", "gfaas.dedup.ort",
           "gfaas.dedup.hint", "gfaas.dedup.regions")
_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
_MAX_FRAME = 1 << 20


class _Fork(msgspec.Struct, tag=True):
    env: dict[str, str]


class _Status(msgspec.Struct, tag=True):
    pid: int


class _Forked(msgspec.Struct, tag=True):
    pid: int


class _Exited(msgspec.Struct, tag=True):
    pid: int
    status: int | None  # os.waitstatus_to_exitcode; None: still running (or not the template's)


class _Refused(msgspec.Struct, tag=True):
    message: str


_enc = msgspec.msgpack.Encoder()
_dec_req = msgspec.msgpack.Decoder(_Fork | _Status)
_dec_rep = msgspec.msgpack.Decoder(_Forked | _Exited | _Refused)


def template_env(env: Mapping[str, str], threads: int) -> dict[str, str]:
    """The template's environment: only what a sandboxed worker may see (no credential of the
    operator's shell enters the memory every worker shares; a worker gets its own environment after
    the fork), bundled libraries' telemetry off, and its workers' BLAS thread count (the pools start
    at import, so it is the template's)."""
    out = worker_env(env, Identity(0, 0))
    if "LD_LIBRARY_PATH" in env:
        out["LD_LIBRARY_PATH"] = env["LD_LIBRARY_PATH"]
    out.update(WORKER_ENV)
    out.update({var: str(threads) for var in _THREAD_VARS})
    return out


class ForkedProcess:
    """A worker forked by a template, with the part of ``subprocess.Popen`` the runtime uses: ``pid``,
    ``poll``, ``wait``, ``kill``, ``returncode``. A pidfd follows it, so a reused pid is never signalled."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._server = server
        # The pidfd lives as long as this object: closing it on exit would race a second thread's
        # poll() (its select() on a closed, perhaps already reused, descriptor).
        self._pidfd = os.pidfd_open(pid)
        self._lock = threading.Lock()

    def _gone(self, timeout: float | None) -> bool:
        """Whether it exited, waiting up to ``timeout`` seconds (None: for ever)."""
        return bool(select.select([self._pidfd], [], [], timeout)[0])

    def poll(self) -> int | None:
        if self.returncode is None and self._gone(0):
            self._finish()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not self._gone(timeout):
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
            self._finish()
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _finish(self) -> None:
        with self._lock:  # the template reports an exit status once: ask once, whichever thread asks
            if self.returncode is None:
                status = self._server.status(self.pid)
                self.returncode = status if status is not None else -1  # -1: the template could not say

    def __del__(self) -> None:
        fd = getattr(self, "_pidfd", -1)
        if fd >= 0:
            self._pidfd = -1
            os.close(fd)


class ForkServer:
    """The runtime's end of one template process (started on first use, again if it died)."""

    def __init__(self, env: Mapping[str, str], preload: Sequence[str] = PRELOAD, start_timeout: float = 120.0) -> None:
        self._env = dict(env)
        self._preload = tuple(preload)
        self._timeout = start_timeout
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self.started = 0  # templates started (1 unless one died)
        self.template_s = 0.0  # how long the last template took to preload

    def _ensure(self) -> socket.socket:  # under self._lock
        if self._proc is not None and self._proc.poll() is None and self._sock is not None:
            return self._sock
        self._close_locked()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        t0 = time.monotonic()
        try:
            self._proc = subprocess.Popen(module_argv("gfaas.runtime.forkserver", str(theirs.fileno()), *self._preload),
                                          pass_fds=(theirs.fileno(),), env=self._env, cwd="/",
                                          stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        ours.settimeout(self._timeout)
        try:
            hello = ours.recv(64)
        except (TimeoutError, OSError) as exc:
            hello = repr(exc).encode()
        if hello != b"ready":
            ours.close()
            self._proc.kill()
            self._proc.wait()
            self._proc = None
            raise FunctionFailed(f"the worker template process did not start ({hello[:60]!r}); "
                                 "set RuntimeConfig(fork_server=False) to start each worker afresh")
        ours.settimeout(None)
        self._sock = ours
        self.started += 1
        self.template_s = time.monotonic() - t0
        return ours

    def warm(self) -> None:
        """Start the template in the background (a fork waits for it; a failed start is raised there)."""
        def run() -> None:
            try:
                with self._lock:
                    self._ensure()
            except Exception as exc:  # noqa: BLE001 - the next fork tries again and raises it
                log.warning("the worker template did not start in the background: %s", exc)

        threading.Thread(target=run, name="gfaas-template", daemon=True).start()

    def ready(self, timeout: float) -> None:
        """Wait until the template is up (starting it if need be), at most ``timeout`` seconds."""
        if not self._lock.acquire(timeout=timeout):
            raise FunctionFailed(f"the worker template did not start within {timeout:g} s")
        try:
            self._ensure()
        finally:
            self._lock.release()

    def _ask(self, msg: _Fork | _Status, fds: Sequence[int] = ()) -> tuple[_Forked | _Exited | _Refused, float]:
        """The template's reply, and how long this call waited for a template to start (0: it was up)."""
        with self._lock:
            started = self.started
            sock = self._ensure()
            waited = self.template_s if self.started != started else 0.0
            try:
                if fds:
                    socket.send_fds(sock, [_enc.encode(msg)], list(fds))
                else:
                    sock.send(_enc.encode(msg))
                data = sock.recv(_MAX_FRAME)
            except OSError as exc:
                self._close_locked()
                raise FunctionFailed(f"the worker template process is gone ({exc})") from None
            if not data:
                self._close_locked()
                raise FunctionFailed("the worker template process exited")
            return _dec_rep.decode(data), waited

    def fork(self, env: Mapping[str, str], sock_fd: int) -> tuple[ForkedProcess, float]:
        """A new worker process serving the socket ``sock_fd`` (a copy is sent to it) with environment
        ``env``; and the seconds this call spent starting the template first (0 when it was up)."""
        rep, waited = self._ask(_Fork(dict(env)), [sock_fd])
        if isinstance(rep, _Refused):
            raise FunctionFailed(f"the worker template could not fork: {rep.message}")
        assert isinstance(rep, _Forked)
        return ForkedProcess(self, rep.pid), waited

    def status(self, pid: int) -> int | None:
        """The exit code of a worker this template forked, once it exited (None if unknown)."""
        try:
            rep, _ = self._ask(_Status(pid))
        except FunctionFailed:
            return None
        return rep.status if isinstance(rep, _Exited) else None

    def _close_locked(self) -> None:
        if self._sock is not None:
            self._sock.close()  # the template exits when it reads the end
            self._sock = None
        if self._proc is not None:
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def close(self) -> None:
        with self._lock:
            self._close_locked()


# ---- the template process -------------------------------------------------------------------------
def _reap(done: dict[int, int]) -> None:
    """Collect every exited child's status (no zombie stays behind), keeping the latest 4096."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        done[pid] = os.waitstatus_to_exitcode(status)
        if len(done) > 4096:
            del done[next(iter(done))]


def _child(ctl: socket.socket, fd: int, env: Mapping[str, str]) -> int:
    """In the forked worker: keep only stdio and the worker's socket, take the worker's environment,
    then serve exactly as a spawned worker does."""
    ctl.close()
    os.closerange(3, fd)
    os.closerange(fd + 1, os.sysconf("SC_OPEN_MAX") if os.sysconf("SC_OPEN_MAX") > 0 else 65536)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the worker's own children are its to wait for
    sys.argv[:] = [sys.argv[0], str(fd)]  # as a spawned worker's (python -m ...worker_main FD)
    os.environ.clear()
    os.environ.update(env)
    # The template's sys.path is the runtime's PYTHONPATH when it started; this worker's may differ.
    sys.path[:0] = [p for p in search_path(dict(env)) if p not in sys.path]
    if "numpy" in sys.modules:  # the legacy global generator would repeat the template's stream in every worker
        np = sys.modules["numpy"]
        # 256 bits of entropy as a key: seed() without one builds a SeedSequence, 30 ms on a first call.
        np.random.seed(np.frombuffer(os.urandom(32), dtype=np.uint32))
    from .worker import serve_fd

    return serve_fd(fd)


def main(argv: list[str]) -> int:
    """The template: ``argv`` is its control socket's descriptor, then the modules to preload."""
    import gc
    import importlib

    ctl = socket.socket(fileno=int(argv[0]))
    os.chdir("/")
    for name in argv[1:]:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional package (onnxruntime, torch, redis) that is not installed
            pass
    # Imported objects move out of the collector's generations: a worker's collections then do not
    # touch (and copy) the pages it shares with the template.
    gc.freeze()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the runtime's to handle; it closes ctl
    done: dict[int, int] = {}
    # Reap each worker as it exits: a dead worker must not linger as a zombie until the next request.
    signal.signal(signal.SIGCHLD, lambda _sig, _frame: _reap(done))
    ctl.send(b"ready")
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(ctl, _MAX_FRAME, 1)
        except InterruptedError:
            continue
        if not data:
            return 0  # the runtime closed the control socket: its workers live on until it closes theirs
        _reap(done)
        try:
            req = _dec_req.decode(data)
        except msgspec.DecodeError as exc:
            for f in fds:
                os.close(f)
            ctl.send(_enc.encode(_Refused(f"bad request: {exc}")))
            continue
        if isinstance(req, _Status):
            if req.pid not in done:
                try:  # it exited (the runtime's pidfd said so) but was not collected yet
                    pid, status = os.waitpid(req.pid, os.WNOHANG)
                    if pid:
                        done[pid] = os.waitstatus_to_exitcode(status)
                except ChildProcessError:
                    pass
            ctl.send(_enc.encode(_Exited(req.pid, done.pop(req.pid, None))))
            continue
        if len(fds) != 1:
            for f in fds:
                os.close(f)
            ctl.send(_enc.encode(_Refused(f"a fork needs one socket, got {len(fds)} descriptors")))
            continue
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(fds[0])
            ctl.send(_enc.encode(_Refused(str(exc))))
            continue
        if pid == 0:
            return _child(ctl, fds[0], req.env)
        os.close(fds[0])
        ctl.send(_enc.encode(_Forked(pid)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
