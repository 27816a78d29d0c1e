"""The merge supervisor against the real kernel: seccomp user notification needs no root.

A forked child installs the worker's filter in supervised mode and hands its listener over, as a
sandboxed worker does with its Ready; the supervisor answers each ``madvise(MADV_MERGEABLE)`` with
``decide`` for the child's own calls and refuses every call of a process the child forked.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import socket
import time

import pytest

from gfaas.runtime.merge_supervisor import MergeSupervisor, thread_group

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"), reason="no filter for this CPU")


def _child(sock: socket.socket) -> None:
    """In the forked child: the filter, the listener to the parent, then three marks; reports errnos."""
    from gfaas.runtime.seccomp import deny_merging

    libc = ctypes.CDLL(None, use_errno=True)
    try:
        libc.prctl(38, 1, 0, 0, 0)  # no_new_privs, as the sandbox sets it
        listener = deny_merging(madvise_mergeable="notify")
        assert listener is not None
        socket.send_fds(sock, [b"ready"], [listener])
        os.close(listener)
        sock.recv(1)  # the parent watches it now
        region = mmap.mmap(-1, 64 << 12)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(region))

        def mark(pages: int) -> int:
            ok = libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(pages << 12), 12) == 0
            return 0 if ok else ctypes.get_errno()

        first, second = mark(16), mark(64)  # decide: yes to 16 pages, no to 64
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(w, bytes([mark(16)]))
            os._exit(0)
        os.waitpid(pid, 0)
        grandchild = os.read(r, 1)[0]
        sock.send(bytes([first, second, grandchild]))
    finally:
        os._exit(0)


def test_only_the_workers_own_calls_that_decide_allows_go_through() -> None:
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        parent.close()
        _child(child)
    child.close()
    sup = MergeSupervisor()
    asked: list[int] = []
    try:
        _, fds, _, _ = socket.recv_fds(parent, 16, 1)
        sup.watch(fds[0], pid, lambda nbytes: asked.append(nbytes) is None and nbytes <= 16 << 12)
        assert sup.watching(pid)
        parent.send(b"g")
        parent.settimeout(30)
        first, second, grandchild = parent.recv(3)
        assert (first, second, grandchild) == (0, 1, 1)  # allowed; EPERM by decide; EPERM: not the worker
        assert asked == [16 << 12, 64 << 12]  # the grandchild's call never reached decide
        assert [(p, allowed) for p, _, allowed in sup.answered] == [(pid, True), (pid, False), (pid, False)]
    finally:
        os.waitpid(pid, 0)
        deadline = time.monotonic() + 5
        while sup.watching(pid) and time.monotonic() < deadline:  # every process under the filter exited
            time.sleep(0.01)
        assert not sup.watching(pid)
        sup.close()
        parent.close()


def test_thread_group_names_the_process_of_a_thread() -> None:
    assert thread_group(os.getpid()) == os.getpid()
    assert thread_group(2**22 + 12345) is None
