"""Code packages: the handlers (and model files) a workflow brings along, checked and stored by content.

A package arrives as a tar (optionally gzip-compressed) or zip archive: ``gfaas deploy SPEC --code DIR``
packs a directory with :func:`pack_dir`. The archive's bytes come from a client, so :func:`read_archive`
accepts only what a package of Python modules and model files needs:

- regular files and directories: no symbolic or hard links, devices or FIFOs;
- relative paths that stay inside the package: no absolute paths, no ``..``, no empty or ``.`` parts,
  no NUL or control characters, each name at most 255 bytes, each path at most 1,024;
- each path once; at most ``max_files`` entries (files and directories together: a directory costs
  the server as much as a file to check and store, so an archive of 400,000 empty directories is
  refused at its 2,001st entry, not taken apart for a minute) and ``max_bytes`` in all, counted while
  reading, so a compressed archive that expands past its declared sizes is refused all the same. A
  zip says how many entries it holds before any is parsed: one over the limit is refused at once.

Anything else raises :class:`~gfaas.errors.CodePackageError` naming the member and the rule, before
anything is written. The package's identity is the SHA-256 of a canonical manifest (each path, its
executable bit and its content's SHA-256, in path order), so the same files give the same digest
whatever the archive format, member order or timestamps. :class:`CodeStore` writes a package once
under ``<root>/<workflow>/<digest>/`` (a temporary directory renamed into place, so a reader never sees
half a package). Files are read-only. With a tenant group (the sandbox's gid of the workflow) the tree
belongs to the runtime's user and that group, readable by the group only: the tenant's workers can
import it but neither change it nor make it writable, and no other tenant can read it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import logging
import os
import shutil
import stat
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

from ..errors import CodePackageError

log = logging.getLogger("gfaas.runtime")

MAX_BYTES = 64 * 1024 * 1024  # a package of handlers and a small model; larger models belong in storage
MAX_FILES = 2000
_NAME_MAX, _PATH_MAX = 255, 1024


@dataclass(frozen=True)
class Package:
    """A checked package in memory: ``files`` maps each relative path to ``(bytes, executable)``."""

    files: dict[str, tuple[bytes, bool]]
    digest: str

    @property
    def nbytes(self) -> int:
        return sum(len(d) for d, _ in self.files.values())


def check_path(name: str) -> str:
    """The normalised relative path of an archive member, or :class:`CodePackageError`."""
    if not name or "\x00" in name or any(ord(c) < 32 or c == "\x7f" for c in name):
        raise CodePackageError(f"package member {name!r}: names may not be empty or hold control characters")
    if "\\" in name:
        raise CodePackageError(f"package member {name!r}: use '/' as the path separator")
    p = PurePosixPath(name)
    if p.is_absolute():
        raise CodePackageError(f"package member {name!r} is an absolute path; archive paths relative to the "
                               "package root")
    parts = [x for x in name.rstrip("/").split("/")]
    if any(x in ("", ".", "..") for x in parts):
        raise CodePackageError(f"package member {name!r} has an empty, '.' or '..' part; a package's files must "
                               "stay inside it")
    if any(len(x.encode()) > _NAME_MAX for x in parts) or len(name.encode()) > _PATH_MAX:
        raise CodePackageError(f"package member {name[:80]!r}...: a name is longer than {_NAME_MAX} bytes or the "
                               f"path longer than {_PATH_MAX}")
    return "/".join(parts)


class _Budget:
    """Counts files and bytes while reading, whatever the archive declares."""

    def __init__(self, max_bytes: int, max_files: int) -> None:
        self.max_bytes, self.max_files = max_bytes, max_files
        self.bytes = self.files = 0

    def file(self, name: str) -> None:
        """Count one entry, a file or a directory."""
        self.files += 1
        if self.files > self.max_files:
            raise CodePackageError(f"the package holds more than {self.max_files} entries, files and directories "
                                   f"together (at {name!r}); ship fewer files or raise the limit")

    def read(self, name: str, stream: IO[bytes] | None) -> bytes:
        if stream is None:
            raise CodePackageError(f"package member {name!r} cannot be read")
        out = bytearray()
        while True:
            chunk = stream.read(1 << 20)
            if not chunk:
                return bytes(out)
            out += chunk
            self.bytes += len(chunk)
            if self.bytes > self.max_bytes:
                raise CodePackageError(f"the package expands to more than {self.max_bytes:,} bytes (at {name!r}); "
                                       "keep large models out of the code package")


def _tar_members(data: bytes, budget: _Budget) -> Iterator[tuple[str, bytes | None, bool]]:
    try:
        tf = tarfile.open(fileobj=io.BytesIO(data), mode="r:*")  # noqa: SIM115 - the with below closes it
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise CodePackageError(f"the package is not a readable tar archive ({exc})") from None
    with tf:
        try:
            for m in tf:
                name = check_path(m.name)
                if m.isdir():
                    budget.file(name)
                    yield name, None, False
                elif m.isreg():
                    budget.file(name)
                    yield name, budget.read(name, tf.extractfile(m)), bool(m.mode & 0o111)
                else:
                    kind = "a symbolic link" if m.issym() else "a hard link" if m.islnk() else "a special file"
                    raise CodePackageError(f"package member {m.name!r} is {kind}; a package holds regular files "
                                           "and directories only")
        except (tarfile.TarError, EOFError, OSError, zlib_error()) as exc:
            raise CodePackageError(f"the package's tar archive is damaged ({exc})") from None


def zlib_error() -> type[Exception]:
    import zlib

    return zlib.error


def _zip_entries(data: bytes) -> int | None:
    """The entry count a zip's end-of-central-directory record declares (None: no record found; 0xFFFF
    means a zip64 archive or at least that many)."""
    at = data.rfind(b"PK\x05\x06", max(0, len(data) - 22 - 0xFFFF))
    if at < 0 or at + 22 > len(data):
        return None
    return int.from_bytes(data[at + 10:at + 12], "little")


def _zip_members(data: bytes, budget: _Budget) -> Iterator[tuple[str, bytes | None, bool]]:
    declared = _zip_entries(data)
    if declared is not None and declared > budget.max_files:
        raise CodePackageError(f"the package's zip archive declares {declared:,} entries, over the limit of "
                               f"{budget.max_files} files and directories; ship fewer files or raise the limit")
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, OSError) as exc:
        raise CodePackageError(f"the package is not a readable zip archive ({exc})") from None
    with zf:
        for info in zf.infolist():
            name = check_path(info.filename)
            mode = info.external_attr >> 16  # Unix mode when the archiver recorded one; type bits may be 0
            if stat.S_IFMT(mode) not in (0, stat.S_IFREG, stat.S_IFDIR):
                raise CodePackageError(f"package member {info.filename!r} is a link or special file; a package "
                                       "holds regular files and directories only")
            if info.is_dir():
                budget.file(name)
                yield name, None, False
                continue
            budget.file(name)
            try:
                with zf.open(info) as f:
                    yield name, budget.read(name, f), bool(mode & 0o111)
            except (zipfile.BadZipFile, OSError, zlib_error(), NotImplementedError) as exc:
                raise CodePackageError(f"package member {info.filename!r} cannot be read ({exc})") from None


def read_archive(data: bytes, *, max_bytes: int = MAX_BYTES, max_files: int = MAX_FILES) -> Package:
    """Check an archive (tar, tar.gz or zip, told apart by content) and return its files."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise CodePackageError(f"a package is the bytes of an archive, not a {type(data).__name__}")
    data = bytes(data)
    if len(data) > max_bytes:
        raise CodePackageError(f"the package archive is {len(data):,} bytes, over the {max_bytes:,}-byte limit")
    budget = _Budget(max_bytes, max_files)
    members = _zip_members(data, budget) if data[:4] == b"PK\x03\x04" else _tar_members(data, budget)
    files: dict[str, tuple[bytes, bool]] = {}
    dirs: set[str] = set()
    for name, content, executable in members:
        if name in files or (content is not None and name in dirs):
            raise CodePackageError(f"package member {name!r} appears twice; each path once")
        if content is None:
            dirs.add(name)
            continue
        if any(p in files for p in _parents(name)):
            raise CodePackageError(f"package member {name!r} lies under a file of the same package")
        files[name] = (content, executable)
    if not files:
        raise CodePackageError("the package holds no files; pack the directory with the handler modules")
    return Package(files, digest(files))


def top_level_modules(package: Package) -> set[str]:
    """The importable top-level names a package provides: ``x`` for ``x.py`` or a folder ``x/``."""
    out = set()
    for name in package.files:
        first = name.split("/", 1)[0]
        if "/" in name:
            out.add(first)
        elif first.endswith(".py"):
            out.add(first[:-3])
    return out


def check_handlers_in(spec: Any, package: Package) -> None:
    """Every handler of ``spec`` names a module of ``package`` (the workers import from it alone)."""
    tops = top_level_modules(package)
    for f in spec.functions:
        module = f.handler.partition(":")[0]
        if module.split(".")[0] not in tops:
            raise CodePackageError(f"function {f.name!r}: handler {f.handler!r} names module {module!r}, which the "
                                   f"code package does not hold (its top-level modules: {sorted(tops) or 'none'}); "
                                   "put the module in the package or fix the handler")


def check_model_file(fn: Any, package: Package | None) -> None:
    """``model: {file: PATH}`` of function ``fn`` is an ONNX model in ``package`` whose feeds gfaas can
    give (read, never run: its workers load it, inside the sandbox)."""
    where = f"function {fn.name!r}: model file {fn.model_file!r}"
    if package is None:
        raise CodePackageError(f"{where}: a model file comes in the workflow's code package; deploy with one "
                               "(gfaas deploy SPEC --code DIR)")
    if fn.model_file not in package.files:
        raise CodePackageError(f"{where} is not in the code package; ship it there (package paths are relative "
                               "to the package root)")
    from ..errors import ConfigError
    from ..models.files import inspect

    try:
        inspect(package.files[fn.model_file][0], where)
    except ConfigError as exc:
        raise CodePackageError(str(exc)) from None


def _parents(name: str) -> list[str]:
    parts = name.split("/")
    return ["/".join(parts[:k]) for k in range(1, len(parts))]


def digest(files: dict[str, tuple[bytes, bool]]) -> str:
    """SHA-256 of the canonical manifest: path, executable bit and content hash of each file, in path order."""
    h = hashlib.sha256(b"gfaas-code-v1\n")
    for name in sorted(files):
        content, executable = files[name]
        h.update(f"{name}\0{int(executable)}\0{hashlib.sha256(content).hexdigest()}\n".encode())
    return h.hexdigest()


def pack_dir(path: str | os.PathLike[str], *, max_bytes: int = MAX_BYTES, max_files: int = MAX_FILES,
             extra: dict[str, bytes] | None = None) -> bytes:
    """A directory as a gzip-compressed tar of its regular files (sorted, zeroed timestamps and owners,
    so the same files give the same bytes). Links and special files are refused, as the server would;
    ``__pycache__`` folders and ``.pyc`` files are left out. ``extra``: more files by archive path
    (``gfaas deploy`` adds the spec as ``workflow.yaml``), in place of the directory's own."""
    root = Path(path)
    if not root.is_dir():
        raise CodePackageError(f"--code {str(path)!r} is not a directory; give the folder holding the handler modules")
    buf = io.BytesIO()
    budget = _Budget(max_bytes, max_files)
    extra = extra or {}
    # mtime 0 in the gzip header too: the same files, the same bytes
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name in sorted(extra):
            budget.file(name)
            info = tarfile.TarInfo(check_path(name))
            info.size, info.mode = len(extra[name]), 0o644
            tf.addfile(info, io.BytesIO(extra[name]))
        for p in sorted(root.rglob("*")):
            rel = p.relative_to(root).as_posix()
            if "__pycache__" in p.parts or p.suffix == ".pyc" or rel in extra:
                continue
            st = p.lstat()
            if stat.S_ISDIR(st.st_mode):
                continue
            if not stat.S_ISREG(st.st_mode):
                raise CodePackageError(f"{p} is a link or special file; a code package holds regular files only")
            budget.file(rel)
            with open(p, "rb") as f:
                data = budget.read(rel, f)
            info = tarfile.TarInfo(check_path(rel))
            info.size, info.mode = len(data), 0o755 if st.st_mode & 0o111 else 0o644
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@dataclass(frozen=True)
class StoredPackage:
    workflow: str
    digest: str
    path: Path  # the package root: what workers put first on sys.path
    nbytes: int
    files: int


class CodeStore:
    """Packages by workflow and digest under ``root`` (one directory per package, written once)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o711)  # tenants may pass through to their own package, never list others'

    def path(self, workflow: str, digest_hex: str) -> Path:
        return self.root / workflow / digest_hex

    def put(self, workflow: str, package: Package, group: int | None = None) -> StoredPackage:
        """Write ``package`` for ``workflow`` unless it is there already. ``group``: the tenant's gid
        (its workers read the package through the group; others get nothing); ``None``: readable by all."""
        wf_dir = self.root / workflow
        wf_dir.mkdir(mode=0o700, exist_ok=True)
        fmode, xmode, dmode = (0o440, 0o550, 0o550) if group is not None else (0o444, 0o555, 0o555)
        final = wf_dir / package.digest
        if not final.exists():
            tmp = Path(tempfile.mkdtemp(prefix=".incoming-", dir=wf_dir))
            try:
                for name, (content, executable) in package.files.items():
                    target = tmp.joinpath(*name.split("/"))
                    target.parent.mkdir(parents=True, exist_ok=True)
                    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                    with os.fdopen(fd, "wb") as f:
                        f.write(content)
                    os.chmod(target, xmode if executable else fmode)
                for d in sorted({p for p in tmp.rglob("*") if p.is_dir()} | {tmp}, reverse=True):
                    os.chmod(d, dmode)
                if group is not None:
                    _chgrp_tree(tmp, group)
                os.rename(tmp, final)
            except FileExistsError:  # another deploy of the same package won the race: same content
                shutil.rmtree(tmp, ignore_errors=True)
            except BaseException:
                remove_tree(tmp)
                raise
        if group is not None:
            os.chown(wf_dir, -1, group)
        os.chmod(wf_dir, 0o750 if group is not None else 0o755)
        log.info("code package %s of %s: %d files, %d bytes", package.digest[:12], workflow, len(package.files),
                 package.nbytes)
        return StoredPackage(workflow, package.digest, final, package.nbytes, len(package.files))

    def remove(self, workflow: str) -> None:
        """Delete every package of ``workflow`` (on undeploy of its last version)."""
        remove_tree(self.root / workflow)


def _chgrp_tree(top: Path, group: int) -> None:
    os.chown(top, -1, group)
    for p in top.rglob("*"):
        os.chown(p, -1, group, follow_symlinks=False)


def remove_tree(top: Path) -> None:
    """Remove a tree whose directories were made read-only (0555)."""
    if not top.exists():
        return
    for d in [top, *[p for p in top.rglob("*") if p.is_dir() and not p.is_symlink()]]:
        try:
            os.chmod(d, 0o700)
        except OSError:
            pass
    shutil.rmtree(top, ignore_errors=True)
