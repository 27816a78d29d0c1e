"""A seccomp filter for sandboxed workers: no page merging behind the runtime's back (issue 37, row 3).

KSM merges identical pages of every process that marked them mergeable, and a write to a merged page
takes measurably longer (copy on write): a process that marks guessed pages mergeable while a burst
runs learns which of them another process holds. The node's merge controller grants KSM to one
sharing domain at a time and audits for foreign mergeable processes, but an audit comes after the
fact. So a sandboxed worker (and every process it starts: filters are inherited) is refused, by the
kernel, ``prctl(PR_SET_MEMORY_MERGE)`` always (gfaas never makes a whole process mergeable), and
``madvise(MADV_MERGEABLE)`` is decided outside it: refused when its runtime hints no pages
(``RuntimeConfig.dedup`` ``off`` or ``shared``), else *supervised* (``SECCOMP_RET_USER_NOTIF``): the
call waits while the runtime (:mod:`.merge_supervisor`) checks that the caller is the worker itself,
not a process it started, and registers the hint with the node's merge controller, which refuses it
while another sharing domain holds KSM; only then does the kernel carry the call out. So no page is
marked mergeable that the controller has not admitted for the domain merging now. (The model load's
hint happens before the filter, and is relayed as before.) Taking hints back (``MADV_UNMERGEABLE``)
stays allowed.

The filter is classic BPF over ``seccomp_data``: the architecture, the call number, the low 32 bits
of the one argument that matters (the kernel reads both as ``int``). Calls of another ABI than the
native one (i386 ``int 0x80`` or x32 on x86-64), which a 64-bit Python never makes, are refused
outright, so the numbers cannot be dodged. It is installed with ``SECCOMP_FILTER_FLAG_TSYNC``, so the
threads the model load started are bound too.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import platform
import struct

__all__ = ["MADV_MERGEABLE", "PR_SET_MEMORY_MERGE", "Notification", "deny_merging", "filter_program",
           "receive", "respond"]

MADV_MERGEABLE = 12
PR_SET_MEMORY_MERGE = 67
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1
_SECCOMP_FILTER_FLAG_NEW_LISTENER = 8
_SECCOMP_FILTER_FLAG_TSYNC_ESRCH = 16  # with NEW_LISTENER, TSYNC reports a failure as ESRCH
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_USER_NOTIF = 0x7FC00000
_NOTIF_RECV, _NOTIF_SEND = 0xC0502100, 0xC0182101  # SECCOMP_IOCTL_NOTIF_{RECV,SEND}
_NOTIF_SIZE, _RESP_SIZE = 80, 24  # struct seccomp_notif, struct seccomp_notif_resp
_FLAG_CONTINUE = 1  # SECCOMP_USER_NOTIF_FLAG_CONTINUE: the kernel runs the call as asked
_X32_BIT = 0x40000000
# BPF opcodes: load a word at an absolute offset of seccomp_data; jump if equal / greater or equal; return
_LD_ABS, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06
_OFF_NR, _OFF_ARCH, _OFF_ARGS = 0, 4, 16

# machine -> (AUDIT_ARCH_*, madvise, prctl, seccomp)
_ARCHES = {
    "x86_64": (0xC000003E, 28, 157, 317),
    "aarch64": (0xC00000B7, 233, 167, 277),
}


MADVISE_RULES = ("deny", "notify", "allow")


def filter_program(machine: str, *, madvise_mergeable: str) -> list[tuple[int, int, int, int]]:
    """The filter as ``(code, jt, jf, k)`` instructions for ``machine`` (``platform.machine()``);
    ``madvise_mergeable``: ``deny``, ``notify`` (the supervisor decides) or ``allow``."""
    arch, madvise, prctl, _ = _ARCHES[machine]
    deny = _RET_ERRNO | errno.EPERM
    jump = {"allow": 0, "deny": 1, "notify": 2}[madvise_mergeable]
    return [
        (_LD_ABS, 0, 0, _OFF_ARCH),                                # 0
        (_JEQ, 1, 0, arch),                                        # 1: native ABI -> 3
        (_RET, 0, 0, deny),                                        # 2: another ABI: refused
        (_LD_ABS, 0, 0, _OFF_NR),                                  # 3
        (_JGE, 7, 0, _X32_BIT),                                    # 4: x32 numbering -> 12
        (_JEQ, 0, 2, prctl),                                       # 5: prctl -> 6, else -> 8
        (_LD_ABS, 0, 0, _OFF_ARGS),                                # 6: option
        (_JEQ, 4, 3, PR_SET_MEMORY_MERGE),                         # 7: -> 12 : -> 11
        (_JEQ, 0, 2, madvise),                                     # 8: madvise -> 9, else -> 11
        (_LD_ABS, 0, 0, _OFF_ARGS + 2 * 8),                        # 9: advice
        (_JEQ, jump, 0, MADV_MERGEABLE),                           # 10: -> 11, 12 or 13
        (_RET, 0, 0, _RET_ALLOW),                                  # 11
        (_RET, 0, 0, deny),                                        # 12
        (_RET, 0, 0, _RET_USER_NOTIF),                             # 13
    ]


def deny_merging(*, madvise_mergeable: str) -> int | None:
    """Install the filter on every thread of this process (and so of its future children); returns
    the listener descriptor with ``madvise_mergeable="notify"`` (hand it to the supervisor), else
    None. Needs ``no_new_privs`` (the sandbox sets it first) or CAP_SYS_ADMIN. ``OSError`` if the
    kernel refuses: a worker never runs a task without it; on an architecture the filter does not
    know, it says so."""
    machine = platform.machine()
    if machine not in _ARCHES:
        raise OSError(errno.ENOSYS, f"no page-merging seccomp filter for {machine!r} (x86_64 and aarch64 have one)")
    if madvise_mergeable not in MADVISE_RULES:
        raise ValueError(f"madvise_mergeable={madvise_mergeable!r}: one of {MADVISE_RULES}")
    prog = filter_program(machine, madvise_mergeable=madvise_mergeable)
    raw = b"".join(struct.pack("=HBBI", *ins) for ins in prog)
    buf = ctypes.create_string_buffer(raw, len(raw))

    class _Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = _Fprog(len(prog), ctypes.addressof(buf))
    libc = _libc()
    notify = madvise_mergeable == "notify"
    flags = _SECCOMP_FILTER_FLAG_TSYNC | (_SECCOMP_FILTER_FLAG_NEW_LISTENER | _SECCOMP_FILTER_FLAG_TSYNC_ESRCH
                                          if notify else 0)
    rc = libc.syscall(ctypes.c_long(_ARCHES[machine][3]), ctypes.c_long(_SECCOMP_SET_MODE_FILTER),
                      ctypes.c_long(flags), ctypes.byref(fprog))
    if rc < 0 or (rc != 0 and not notify):
        err = ctypes.get_errno() if rc < 0 else errno.EBUSY
        why = f"thread {rc} could not be synchronised" if rc > 0 else os.strerror(err)
        raise OSError(err, f"installing the page-merging seccomp filter failed: {why}")
    return int(rc) if notify else None


class Notification:
    """One supervised call: its ``id`` (for :func:`respond`), the calling thread's ``tid`` and the
    call's ``nr`` and ``args``."""

    __slots__ = ("args", "id", "nr", "tid")

    def __init__(self, raw: bytes) -> None:
        self.id, self.tid, _ = struct.unpack_from("=QII", raw, 0)
        self.nr, _arch = struct.unpack_from("=iI", raw, 16)
        self.args = struct.unpack_from("=6Q", raw, 32)


def receive(listener: int) -> Notification:
    """The next supervised call on ``listener`` (blocks; poll the descriptor first). ``OSError``
    (ENOENT) when the caller went away meanwhile."""
    buf = ctypes.create_string_buffer(_NOTIF_SIZE)
    if _libc().ioctl(listener, ctypes.c_ulong(_NOTIF_RECV), buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp notification: {os.strerror(err)}")
    return Notification(buf.raw)


def respond(listener: int, n: Notification, allow: bool) -> None:
    """Let the kernel carry the call out as asked, or fail it with EPERM. A caller that went away
    meanwhile (ENOENT) is no error."""
    raw = struct.pack("=QqiI", n.id, 0, 0 if allow else -errno.EPERM, _FLAG_CONTINUE if allow else 0)
    buf = ctypes.create_string_buffer(raw, _RESP_SIZE)
    if _libc().ioctl(listener, ctypes.c_ulong(_NOTIF_SEND), buf) != 0:
        err = ctypes.get_errno()
        if err != errno.ENOENT:
            raise OSError(err, f"seccomp notification answer: {os.strerror(err)}")


@functools.cache
def _libc() -> ctypes.CDLL:  # once per process: the supervisor asks for it on every notification
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ioctl.restype = ctypes.c_int
    libc.syscall.restype = ctypes.c_long
    return libc
