"""Content-addressed read-only mappings: every process that loads identical bytes maps the same file.

A store is ``<store_dir>/<domain>/<sha256 hex>``: directories 0700 (only this uid may change what a
digest names), files 0444. A file is published by writing a temporary file in the domain directory,
hashing what was written, and ``link``-ing it to its digest name: ``link`` never replaces, so when two
processes publish the same content at once one link wins and both map *that* inode (``rename`` would
let the loser's rename swap the file under the winner, leaving two copies in RAM). The name is always
computed by hashing content (never taken from a file name), so a file named by a digest holds exactly
those bytes as long as the directory is private.

Mappings are ``MAP_SHARED`` and read-only: the pages are the store file's page cache (``/dev/shm`` is
RAM), counted once however many processes map them. The store must be cleaned like any RAM pool
(:func:`clear_store`); removing a file that is still mapped is safe (the mapping keeps the inode).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import mmap
import os
import re
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

from .. import secfiles
from ..errors import ConfigError, DedupError, DependencyMissing

log = logging.getLogger("gfaas.dedup")

ENV = "GFAAS_SHARED_DIR"
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
# Letters, digits, '_', '.', '-'; not starting with '.' (temporary files and '.', '..' start so).
_DOMAIN = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}$")
_CHUNK = 1 << 20
SHM = Path("/dev/shm")


def default_store_dir() -> Path:
    """``$GFAAS_SHARED_DIR``, else ``/dev/shm/gfaas-shared-<uid>`` (RAM), else, where ``/dev/shm`` is
    missing or not writable, ``<tempdir>/gfaas-shared-<uid>`` (logged: there the page cache of the temp
    file system backs the mappings; still one copy for all processes, but it may be written to disk)."""
    env = os.environ.get(ENV)
    if env:
        return Path(env)
    name = f"gfaas-shared-{os.geteuid()}"
    if SHM.is_dir() and os.access(SHM, os.W_OK | os.X_OK):
        return SHM / name
    fallback = Path(tempfile.gettempdir()) / name
    log.warning("%s is missing or not writable; the shared store falls back to %s", SHM, fallback)
    return fallback


def check_domain(domain: object) -> str:
    """``domain`` if it is a valid sharing-domain name; :class:`ConfigError` naming it otherwise."""
    if not isinstance(domain, str) or not _DOMAIN.match(domain):
        raise ConfigError(f"sharing domain {domain!r} is not a valid name: use 1-64 letters, digits, '_', '.' or "
                          "'-', not starting with '.' (no '/'), e.g. domain='tenant-a'")
    return domain


def _store_root(store_dir: Path | None) -> Path:
    root = Path(store_dir) if store_dir is not None else default_store_dir()
    return Path(secfiles.private_dir(str(root), "shared store directory", deny=0o077))


def _domain_dir(store_dir: Path | None, domain: str) -> Path:
    check_domain(domain)
    root = _store_root(store_dir)
    return Path(secfiles.private_dir(str(root / domain), f"shared store domain {domain!r}", deny=0o077))


class SharedBuffer:
    """A read-only ``MAP_SHARED`` mapping of one store file.

    ``view`` is a read-only memoryview (``np.frombuffer(buf.view, dtype, count, offset)`` gives arrays
    over it without copying); ``digest`` the SHA-256 of the content, ``path`` the store file.
    ``close()`` unmaps; it raises :class:`DedupError` while arrays made from ``view`` still exist.
    """

    def __init__(self, path: Path, digest: str, nbytes: int) -> None:
        self.path = path
        self.digest = digest
        self.nbytes = nbytes
        self._map: mmap.mmap | None = None
        if nbytes:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                self._map = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
            finally:
                os.close(fd)
            self.view = memoryview(self._map)
        else:  # mmap cannot map zero bytes
            self.view = memoryview(b"")

    def __repr__(self) -> str:
        return f"SharedBuffer({self.digest[:12]}..., {self.nbytes} bytes, {str(self.path)!r})"

    @property
    def closed(self) -> bool:
        return self._map is None and self.nbytes > 0

    def close(self) -> None:
        if self._map is None:
            return
        try:
            self.view.release()
            self._map.close()
        except BufferError:
            self.view = memoryview(self._map)  # the release went through: give the caller a usable view back
            raise DedupError(f"shared buffer {self.path} is still in use by arrays made from its view (or a "
                             "session over it); drop them before close()") from None
        self._map = None

    def __enter__(self) -> SharedBuffer:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def _open_store_file(target: Path, digest: str) -> SharedBuffer:
    size = os.stat(target, follow_symlinks=False).st_size
    return SharedBuffer(target, digest, size)


def _publish(directory: Path, digest: str, write: Any) -> Path:
    """Publish into ``directory/<digest>`` what ``write(fileobj) -> hasher`` writes, unless it is there.

    The written bytes are hashed as they are written; a mismatch (the source changed under us) is a
    :class:`DedupError` and nothing is published."""
    target = directory / digest
    if target.exists():
        return target
    # Processes that start together all miss at once: the directory's lock lets one write the file
    # while the others wait and then find it, instead of each writing its own copy first.
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(dfd, fcntl.LOCK_EX)
        if target.exists():
            return target
        fd, tmp = tempfile.mkstemp(prefix=f".{digest[:16]}.", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                got = write(f)
            if got != digest:
                raise DedupError(f"content changed while it was published to the shared store (expected sha256 "
                                 f"{digest}, wrote {got}); retry once the file is no longer being written")
            os.chmod(tmp, 0o444)
            try:
                os.link(tmp, target)  # link, not rename: never replaces a file another store user made
            except FileExistsError:
                pass
        finally:
            Path(tmp).unlink(missing_ok=True)
    finally:
        os.close(dfd)  # releases the lock
    return target


def publish_bytes(data: memoryview | bytes | bytearray, *, domain: str = "default",
                  store_dir: Path | None = None) -> Path:
    """Publish ``data`` into the store (content-addressed, atomic, no-op if present); its store path."""
    view = memoryview(data).cast("B")
    directory = _domain_dir(store_dir, domain)
    digest = hashlib.sha256(view).hexdigest()

    def write(f: Any) -> str:
        h = hashlib.sha256()
        for i in range(0, len(view), _CHUNK):
            piece = view[i:i + _CHUNK]
            f.write(piece)
            h.update(piece)
        return h.hexdigest()

    return _publish(directory, digest, write)


def _digest_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def load_shared(path: str | os.PathLike[str], *, domain: str = "default", store_dir: Path | None = None) -> SharedBuffer:
    """Hash ``path``'s content (SHA-256, streamed), publish it into the store if absent, map the store file.

    Every process loading identical content (in the same ``domain`` and store) maps the same file, so
    the pages are in RAM once."""
    src = Path(path)
    directory = _domain_dir(store_dir, domain)
    try:
        digest = _digest_file(src)
    except OSError as exc:
        raise ConfigError(f"cannot read {str(src)!r} to load it shared: {exc.strerror or exc}; pass an existing, "
                          "readable file") from None

    def write(f: Any) -> str:
        h = hashlib.sha256()
        with open(src, "rb") as s:
            while piece := s.read(_CHUNK):
                f.write(piece)
                h.update(piece)
        return h.hexdigest()

    target = _publish(directory, digest, write)
    buf = _open_store_file(target, digest)
    log.debug("mapped %s (%d bytes) shared from %s", src, buf.nbytes, target)
    return buf


def clear_store(store_dir: Path | None = None, domain: str | None = None) -> int:
    """Remove the store's files (one ``domain``'s, or all); the bytes removed. Processes that still map
    a file keep their mapping; the RAM is freed when the last one unmaps."""
    root = Path(store_dir) if store_dir is not None else default_store_dir()
    if not root.is_dir():
        return 0
    root = _store_root(root)
    domains = [check_domain(domain)] if domain is not None else [d.name for d in root.iterdir() if d.is_dir()]
    removed = 0
    for d in domains:
        directory = root / d
        if not directory.is_dir():
            continue
        for f in directory.iterdir():
            try:
                removed += f.lstat().st_size
                f.unlink()
            except FileNotFoundError:
                pass
        try:
            directory.rmdir()
        except OSError:
            pass  # a file appeared meanwhile: keep the directory
    return removed


def store_usage(store_dir: Path | None = None) -> dict[str, dict[str, int]]:
    """Per domain: ``{"files": n, "bytes": b}`` of published content (temporary files not counted)."""
    root = Path(store_dir) if store_dir is not None else default_store_dir()
    out: dict[str, dict[str, int]] = {}
    if not root.is_dir():
        return out
    for d in sorted(root.iterdir()):
        if not d.is_dir():
            continue
        files = [f for f in d.iterdir() if _DIGEST.match(f.name)]
        out[d.name] = {"files": len(files), "bytes": sum(f.lstat().st_size for f in files)}
    return out


def load_shared_tensor(path: str | os.PathLike[str], dtype: Any = None, *, shape: tuple[int, ...] | None = None,
                       offset: int = 0, domain: str = "default", store_dir: Path | None = None) -> Any:
    """A CPU ``torch`` tensor over the shared read-only mapping of ``path`` (``dtype`` default uint8).

    The memory is mapped read-only and torch has no read-only tensors: an in-place write would fault
    the process (SIGSEGV), so ``clone()`` before writing. torch's warning about non-writable buffers
    says just that; it is expected here and suppressed.
    """
    try:
        import torch
    except ImportError as exc:
        raise DependencyMissing("load_shared_tensor needs torch; install the extra with: pip install "
                                "'gfaas[torch]'") from exc
    import warnings

    buf = load_shared(path, domain=domain, store_dir=store_dir)
    dt = dtype if dtype is not None else torch.uint8
    itemsize = torch.empty((), dtype=dt).element_size()
    count = -1 if shape is None else int(_prod(shape))
    if offset < 0 or offset % itemsize or (count >= 0 and offset + count * itemsize > buf.nbytes):
        raise ConfigError(f"offset {offset} / shape {shape} do not fit {buf.nbytes} bytes of {dt} in {path}; "
                          f"use an offset that is a multiple of {itemsize} and a shape inside the file")
    with warnings.catch_warnings():
        # "The given buffer is not writable": intended, the mapping is read-only and shared.
        warnings.filterwarnings("ignore", message=".*not writable.*", category=UserWarning)
        t = torch.frombuffer(buf.view, dtype=dt, count=count, offset=offset)
    if shape is not None:
        t = t.view(shape)
    return t


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n
