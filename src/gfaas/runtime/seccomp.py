"""A seccomp filter for sandboxed workers: no page merging behind the runtime's back (issue 37, row 3).

KSM merges identical pages of every process that marked them mergeable, and a write to a merged page
takes measurably longer (copy on write): a process that marks guessed pages mergeable while a burst
runs learns which of them another process holds. The node's merge controller grants KSM to one
sharing domain at a time and audits for foreign mergeable processes, but an audit comes after the
fact. So a sandboxed worker (and every process it starts: filters are inherited) is refused, by the
kernel, ``prctl(PR_SET_MEMORY_MERGE)`` always (gfaas never makes a whole process mergeable) and
``madvise(MADV_MERGEABLE)`` unless its runtime hints pages itself (``RuntimeConfig.dedup`` of
``merge`` or ``on``, for ``ctx.merge``; the model load's hint happens before the filter). Taking hints
back (``MADV_UNMERGEABLE``) stays allowed.

The filter is classic BPF over ``seccomp_data``: the architecture, the call number, the low 32 bits
of the one argument that matters (the kernel reads both as ``int``). Calls of another ABI than the
native one (i386 ``int 0x80`` or x32 on x86-64), which a 64-bit Python never makes, are refused
outright, so the numbers cannot be dodged. It is installed with ``SECCOMP_FILTER_FLAG_TSYNC``, so the
threads the model load started are bound too.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

__all__ = ["MADV_MERGEABLE", "PR_SET_MEMORY_MERGE", "deny_merging", "filter_program"]

MADV_MERGEABLE = 12
PR_SET_MEMORY_MERGE = 67
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_X32_BIT = 0x40000000
# BPF opcodes: load a word at an absolute offset of seccomp_data; jump if equal / greater or equal; return
_LD_ABS, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06
_OFF_NR, _OFF_ARCH, _OFF_ARGS = 0, 4, 16

# machine -> (AUDIT_ARCH_*, madvise, prctl, seccomp)
_ARCHES = {
    "x86_64": (0xC000003E, 28, 157, 317),
    "aarch64": (0xC00000B7, 233, 167, 277),
}


def filter_program(machine: str, *, allow_madvise_mergeable: bool) -> list[tuple[int, int, int, int]]:
    """The filter as ``(code, jt, jf, k)`` instructions for ``machine`` (``platform.machine()``)."""
    arch, madvise, prctl, _ = _ARCHES[machine]
    deny = _RET_ERRNO | errno.EPERM
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
        (_JEQ, 0 if allow_madvise_mergeable else 1, 0, MADV_MERGEABLE),  # 10: -> 11 or 12
        (_RET, 0, 0, _RET_ALLOW),                                  # 11
        (_RET, 0, 0, deny),                                        # 12
    ]


def deny_merging(*, allow_madvise_mergeable: bool) -> None:
    """Install the filter on every thread of this process (and so of its future children). Needs
    ``no_new_privs`` (the sandbox sets it first) or CAP_SYS_ADMIN. ``OSError`` if the kernel refuses:
    a worker never runs a task without it; on an architecture the filter does not know, it says so."""
    machine = platform.machine()
    if machine not in _ARCHES:
        raise OSError(errno.ENOSYS, f"no page-merging seccomp filter for {machine!r} (x86_64 and aarch64 have one)")
    prog = filter_program(machine, allow_madvise_mergeable=allow_madvise_mergeable)
    raw = b"".join(struct.pack("=HBBI", *ins) for ins in prog)
    buf = ctypes.create_string_buffer(raw, len(raw))

    class _Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = _Fprog(len(prog), ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    rc = libc.syscall(ctypes.c_long(_ARCHES[machine][3]), ctypes.c_long(_SECCOMP_SET_MODE_FILTER),
                      ctypes.c_long(_SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(fprog))
    if rc != 0:
        err = ctypes.get_errno() if rc < 0 else errno.EBUSY
        why = f"thread {rc} could not be synchronised" if rc > 0 else os.strerror(err)
        raise OSError(err, f"installing the page-merging seccomp filter failed: {why}")
