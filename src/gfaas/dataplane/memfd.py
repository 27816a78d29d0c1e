"""Sealed ``memfd`` files: the shared memory of the data plane, with sizes (and later writes) fixed.

Every segment, slab index and read log is a memfd created with ``MFD_ALLOW_SEALING`` and sealed at
once against shrinking and growing (``F_SEAL_SHRINK | F_SEAL_GROW``): whoever holds a descriptor,
even one reopened read-write through ``/proc/self/fd/N``, cannot ``ftruncate`` it, so no mapping of
it can ever fault with ``SIGBUS`` (issue 14, row 3). :func:`seal_writes` adds
``F_SEAL_FUTURE_WRITE`` when an object is sealed: from then on ``write(2)``, ``pwrite`` and new
``PROT_WRITE`` shared mappings fail with ``EPERM`` for everyone, while mappings made before (the
producer's and the daemon's) keep working; seals cannot be removed. The mode is ``0400``, so a
process of another uid cannot even reopen a descriptor it was passed read-only.
"""

from __future__ import annotations

import fcntl
import os

F_ADD_SEALS = getattr(fcntl, "F_ADD_SEALS", 1033)
F_GET_SEALS = getattr(fcntl, "F_GET_SEALS", 1034)
F_SEAL_SHRINK = getattr(fcntl, "F_SEAL_SHRINK", 0x0002)
F_SEAL_GROW = getattr(fcntl, "F_SEAL_GROW", 0x0004)
F_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x0010)  # Linux 5.1; missing in Python 3.11-3.13
SIZE_SEALS = F_SEAL_SHRINK | F_SEAL_GROW
MFD_ALLOW_SEALING = getattr(os, "MFD_ALLOW_SEALING", 0x0002)


def create(name: str, size: int) -> int:
    """A memfd of ``size`` bytes, size sealed, mode 0400; closes it again on any failure."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, F_ADD_SEALS, SIZE_SEALS)
        os.fchmod(fd, 0o400)
    except OSError:
        os.close(fd)
        raise
    return fd


def seal_writes(fd: int) -> None:
    """Add ``F_SEAL_FUTURE_WRITE``: no new writable mapping and no ``write(2)``, by anyone."""
    fcntl.fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE)


def seals(fd: int) -> int:
    return int(fcntl.fcntl(fd, F_GET_SEALS))
