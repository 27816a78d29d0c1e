"""Handlers that act as hostile function code (tests/security/test_sandbox.py, issue 14 row 1).

Each probe tries one way for a function to reach what is not its own and reports 1 if the kernel
refused it, 0 if it got through; the test asserts which ones must be refused.
"""

from __future__ import annotations

import glob
import os
import socket
import tempfile
from typing import Any

import numpy as np


def _refused(action: Any) -> int:
    try:
        action()
    except PermissionError:
        return 1
    except OSError as exc:  # EPERM from a syscall that is not a file access
        return 1 if exc.errno in (1, 13) else 0
    return 0


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(64)


def _connect(path: str) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.connect(path)
    finally:
        s.close()


def probe(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """Try to read the node's state and tokens, the daemon's and another tenant's process, and root."""
    p = ctx.params
    state, daemon, victim = str(p["state_dir"]), int(p["daemon_pid"]), int(p["victim_pid"])
    ctx.get(inputs["x"])
    # The victim's private HOME (sandbox.py makes one per worker); none to find without the sandbox.
    homes = glob.glob(os.path.join(tempfile.gettempdir(), f"gfaas-home-{int(p['victim_uid'])}-*"))
    out = {
        "state_list": _refused(lambda: os.listdir(state)),
        "admin_token": _refused(lambda: _read(os.path.join(state, "admin.token"))),
        "registry": _refused(lambda: _read(os.path.join(state, "invocations.journal"))),
        "daemon_socket": _refused(lambda: _connect(str(p["socket_path"]))),
        "daemon_environ": _refused(lambda: _read(f"/proc/{daemon}/environ")),
        "daemon_mem": _refused(lambda: _read(f"/proc/{daemon}/mem")),
        "daemon_fds": _refused(lambda: os.listdir(f"/proc/{daemon}/fd")),
        "victim_environ": _refused(lambda: _read(f"/proc/{victim}/environ")),
        "victim_signal": _refused(lambda: os.kill(victim, 0)),
        "become_root": _refused(lambda: os.setuid(0)),
        "victim_home": _refused(lambda: [os.listdir(h) for h in homes]) if homes else 0,
    }
    return {"y": np.array([os.getuid(), os.getgid()], dtype=np.int64),
            **{k: np.int64(v) for k, v in out.items()}}


PROBES = ("state_list", "admin_token", "registry", "daemon_socket", "daemon_environ", "daemon_mem",
          "daemon_fds", "victim_environ", "victim_signal", "become_root", "victim_home")


def whoami(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    ctx.get(inputs["x"])
    if os.getuid() != 0:  # sandboxed: libraries cache under HOME on a first call (torch, Triton)
        os.makedirs(os.path.join(os.environ["HOME"], ".cache", "kernels"), exist_ok=True)
    return {"y": np.array([os.getuid(), os.getpid()], dtype=np.int64)}


# ---- issue 23: a worker's long-lived daemon connection, bound per task -------------------------------
_LINGER: dict[str, Any] = {}


def _tokens_in_reach() -> list[str]:
    """Every function token this process could find: in live Task messages and in its callers' frames."""
    import gc
    import sys

    gc.unfreeze()  # frozen start-up objects (gcpause) are left out of get_objects(): look at them too
    try:
        found = [getattr(o, "token", "") for o in gc.get_objects() if type(o).__name__ == "Task"]
    finally:
        gc.freeze()
    f: Any = sys._getframe()
    while f is not None:
        for v in f.f_locals.values():
            if type(v).__name__ == "Task":
                found.append(getattr(v, "token", ""))
        f = f.f_back
    return [t for t in found if t]


def _daemon_socket() -> socket.socket:
    """The daemon connection this task uses (function code can reach anything in its process)."""
    import gc

    gc.unfreeze()  # the worker froze its start-up heap (gcpause), which get_objects() leaves out
    try:
        socks = [o._ch.sock for o in gc.get_objects()
                 if type(o).__name__ == "Client" and getattr(getattr(o, "_ch", None), "sock", None) is not None]
    finally:
        gc.freeze()
    return socks[-1]


def _get_after_the_task(fd: int, ref: str, pause_s: float) -> None:
    """Once the task has ended (its invocation still open), read its input again on a copy of the
    connection it used: 'Located' if that worked, else the error's class."""
    import time

    from gfaas.dataplane import protocol as P
    from gfaas.dataplane.ids import DataRef

    time.sleep(pause_s)
    s = socket.socket(fileno=fd)
    try:
        s.send(P.encode(P.Get(DataRef.parse(ref).id)))
        reply = P.decode_reply(s.recv(P.MAX_FRAME))
        _LINGER["after"] = reply.code if isinstance(reply, P.Error) else type(reply).__name__
    except Exception as exc:  # noqa: BLE001 - reported to the test
        _LINGER["after"] = type(exc).__name__
    finally:
        s.close()


def linger(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """First call: remember its input's reference, the connection and any token it can find, and leave
    a thread that reads the input again after the task ended. Second call (another invocation): report
    what that read got, what reading the first invocation's input under this task's credentials gets,
    whether any token ever reached this process, and whether both tasks used the same connection."""
    import threading

    from gfaas.errors import AccessDenied

    ctx.get(inputs["x"])
    sock = _daemon_socket()
    ino = os.fstat(sock.fileno()).st_ino
    tokens = _tokens_in_reach()
    first = _LINGER.get("first")
    if first is None:
        _LINGER["first"] = {"ref": inputs["x"], "ino": ino, "tokens": tokens}
        threading.Thread(target=_get_after_the_task, args=(os.dup(sock.fileno()), inputs["x"],
                                                           float(ctx.params["pause_s"])), daemon=True).start()
        report = {"after_task": -1.0, "cross": -1.0, "token_seen": -1.0, "same_conn": -1.0}
    else:
        try:
            ctx.get(first["ref"])
            cross = 1.0
        except AccessDenied:
            cross = 0.0
        after = _LINGER.get("after")
        report = {"after_task": 0.0 if after == "AuthenticationError" else 1.0 if after == "Located" else 2.0,
                  "cross": cross, "token_seen": float(bool(first["tokens"] or tokens)),
                  "same_conn": float(ino == first["ino"])}
    return {"y": np.zeros(1), **{k: np.float64(v) for k, v in report.items()}}


def sleep_then_read(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """Keep the invocation open for a while before reading its input (so the input stays alive)."""
    import time

    time.sleep(float(ctx.params["seconds"]))
    return {"y": np.asarray(ctx.get(inputs["x"])).copy()}


def _control_socket() -> Any:
    """The worker's own socket to the runtime (its ``sys.argv[1]``, forked or spawned)."""
    import socket
    import sys

    return socket.socket(fileno=os.dup(int(sys.argv[1])))


def forge_reply(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """Send the runtime a Done of its own making before the real one: ``params.forge`` says what it holds
    (a value for an output the spec does not declare, one over the size a reply may carry, an object
    dtype, a size that does not match its shape, or nothing for an output someone reads)."""
    from gfaas.runtime.worker import Done, Value, _enc

    kind = ctx.params["forge"]
    secret = {"secret": Value("<f8", [1], np.zeros(1).tobytes())}
    if kind.startswith("next"):  # a chained reply (Done.next): in a task with no chain, or a bad one in a chain
        nxt = Done(ctx.invocation, {}, {}, 0.0, 0.0, 0.0, 0.0, 0.0, values=secret)
        done = Done(ctx.invocation, {}, {}, 0.0, 0.0, 0.0, 0.0, 0.0,
                    values={"y": Value("<f8", [1], np.zeros(1).tobytes())}, next=nxt)
    elif kind == "lost":  # no value and no reference for y, which a reader elsewhere needs
        done = Done(ctx.invocation, {}, {}, 0.0, 0.0, 0.0, 0.0, 0.0)
    elif kind == "lost-failed":  # no y, and a made-up failure of its chained reader g
        from gfaas.runtime.worker import Failed

        done = Done(ctx.invocation, {}, {}, 0.0, 0.0, 0.0, 0.0, 0.0,
                    next=Failed(ctx.invocation, "ValueError", "function 'g': made up by f", ""))
    else:
        bad = {"undeclared": secret,
               "oversized": {"y": Value("|u1", [100_000], bytes(100_000))},
               "object": {"y": Value("|O", [1], bytes(8))},
               "short": {"y": Value("<f8", [4], bytes(8))}}[kind]
        done = Done(ctx.invocation, {}, {}, 0.0, 0.0, 0.0, 0.0, 0.0, values=bad)
    sock = _control_socket()
    sock.send(_enc.encode(done))
    sock.close()
    return {"y": np.zeros(1)}


def ask_as(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """Ask the runtime to bind this worker's daemon connection to the credentials of another function
    of its own invocation (``params.as``), one its task does not run; report 1.0 if granted, else 0.0."""
    from gfaas.runtime.worker import DataReady, NeedData, _dec, _enc

    sock = _control_socket()
    sock.send(_enc.encode(NeedData(ctx.invocation, str(ctx.params["as"]))))
    rep = _dec.decode(sock.recv(1 << 20))
    sock.close()
    return {"y": np.float64(1.0 if isinstance(rep, DataReady) and rep.ok else 0.0)}


def ask_for_another(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """Ask the runtime to bind this worker's daemon connection to another invocation's credentials
    (``params.other``), and report what it answered: 1.0 if granted, 0.0 if refused."""
    from gfaas.runtime.worker import DataReady, NeedData, _dec, _enc

    sock = _control_socket()
    sock.send(_enc.encode(NeedData(str(ctx.params["other"]))))
    rep = _dec.decode(sock.recv(1 << 20))
    sock.close()
    granted = isinstance(rep, DataReady) and rep.ok
    return {"y": np.float64(1.0 if granted else 0.0)}


# ---- issue 36: what a worker's root phase may leave behind ------------------------------------------
FORGED = "gfaas.gateway INFO forged: tenant became admin"


def descriptors(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """Count this process's open descriptors by kind, those that are the runtime's own stderr
    (``params``: its device and inode), and write a forged log line into every descriptor that is
    not a socket: only its own captured output may take it."""
    import stat

    ctx.get(inputs["x"])
    theirs = (int(ctx.params["stderr_dev"]), int(ctx.params["stderr_ino"]))
    counts = {"fds": 0, "files": 0, "runtime_stderr": 0, "other": 0}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            st = os.fstat(fd)
        except OSError:  # the listing's own descriptor
            continue
        counts["fds"] += 1
        if (st.st_dev, st.st_ino) == theirs:
            counts["runtime_stderr"] += 1
        if stat.S_ISREG(st.st_mode):
            counts["files"] += 1
        elif not (stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode) or os.path.realpath(f"/proc/self/fd/{fd}")
                  == "/dev/null"):
            counts["other"] += 1
        if not stat.S_ISSOCK(st.st_mode):
            try:
                os.write(fd, (FORGED + "\n").encode())
            except OSError:
                pass
    return {"y": np.array([os.getuid()], dtype=np.int64), **{k: np.int64(v) for k, v in counts.items()}}


# ---- issue 37 row 7: a control channel put out of step ------------------------------------------------
def desync(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """When its input's first element is not 0, write ``params.send`` to the worker's own socket to
    the runtime before the real reply: ``garbage`` (bytes no message decodes from), ``ready`` (a
    Ready, the start-up message) or ``stop`` (a message with no logs). Returns the worker's pid."""
    from gfaas.runtime.worker import Ready, Stop, _enc

    if float(np.asarray(ctx.get(inputs["x"])).ravel()[0]) != 0.0:
        payload = {"garbage": b"\xc1\xc1\xc1\xc1", "ready": _enc.encode(Ready(os.getpid(), 0.0)),
                   "stop": _enc.encode(Stop())}[str(ctx.params["send"])]
        sock = _control_socket()
        sock.send(payload)
        sock.close()
    return {"y": np.float64(os.getpid())}


def mark_mergeable(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """Issue 37 row 3: mark guessed pages mergeable behind the runtime's back, from the worker itself
    and from a child it forks, and make the whole process mergeable; 1 where the kernel refused."""
    import ctypes
    import mmap

    ctx.get(inputs["x"])
    libc = ctypes.CDLL(None, use_errno=True)
    region = mmap.mmap(-1, 2048 * 4096)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(region))

    def madvise() -> None:
        if libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(2048 * 4096), 12) != 0:
            raise OSError(ctypes.get_errno(), "madvise(MADV_MERGEABLE)")

    def prctl() -> None:
        if libc.prctl(67, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_MEMORY_MERGE)")

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # a process the runtime never registered
        os.write(w, bytes([_refused(madvise)]))
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(r, 1)[0]
    os.close(r)
    os.close(w)
    return {"y": np.zeros(1), "madvise": np.float64(_refused(madvise)), "prctl": np.float64(_refused(prctl)),
            "child_madvise": np.float64(child), "merge_hint": np.float64(ctx.merge(np.ones(1 << 20)))}
