"""Code packages come from clients: each archive attack is refused before anything is written, and
what is stored is read-only and readable by its tenant's group only (gfaas.runtime.codepkg)."""

from __future__ import annotations

import io
import os
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest

from gfaas.errors import CodePackageError, SpecError
from gfaas.runtime.codepkg import CodeStore, pack_dir, read_archive

HANDLER = b"def double(ctx, inputs):\n    return {'y': ctx.get(inputs['x']) * 2}\n"


def tar_of(members: list[tarfile.TarInfo | tuple[str, bytes]], mode: str = "w:gz") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tf:
        for m in members:
            if isinstance(m, tuple):
                info = tarfile.TarInfo(m[0])
                info.size = len(m[1])
                tf.addfile(info, io.BytesIO(m[1]))
            else:
                tf.addfile(m)
    return buf.getvalue()


def zip_of(members: list[tuple[str, bytes]], links: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members:
            zf.writestr(name, data)
        for name, target in (links or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, target)
    return buf.getvalue()


def test_tar_and_zip_of_the_same_files_are_one_package() -> None:
    files = [("mypkg/__init__.py", b""), ("mypkg/handlers.py", HANDLER)]
    a, b = read_archive(tar_of(files)), read_archive(zip_of(list(reversed(files))))
    assert a.digest == b.digest and set(a.files) == {"mypkg/__init__.py", "mypkg/handlers.py"}
    assert a.files["mypkg/handlers.py"] == (HANDLER, False)
    c = read_archive(tar_of([files[0], ("mypkg/handlers.py", HANDLER + b"#")]))
    assert c.digest != a.digest  # one byte more: another package


@pytest.mark.parametrize(("name", "rule"), [
    ("../evil.py", "'..' part"),
    ("mypkg/../../evil.py", "'..' part"),
    ("/etc/cron.d/evil", "absolute path"),
    ("mypkg//x.py", "empty, '.' or '..' part"),
    ("./x.py", "'.'"),
    ("a\x01b.py", "control characters"),
    ("dir\\x.py", "'/' as the path separator"),
    ("x" * 300 + ".py", "longer than 255"),
])
def test_paths_that_leave_the_package_are_refused(name: str, rule: str) -> None:
    for data in (tar_of([(name, b"x")], "w"), zip_of([(name, b"x")])):
        with pytest.raises(CodePackageError, match=rule.replace("(", r"\(").replace(")", r"\)")
                           .replace(".", r"\.").replace("'", "'")):
            read_archive(data)


def test_links_and_special_files_are_refused() -> None:
    sym = tarfile.TarInfo("mypkg/passwd")
    sym.type, sym.linkname = tarfile.SYMTYPE, "/etc/passwd"
    hard = tarfile.TarInfo("mypkg/hard")
    hard.type, hard.linkname = tarfile.LNKTYPE, "mypkg/handlers.py"
    fifo = tarfile.TarInfo("mypkg/fifo")
    fifo.type = tarfile.FIFOTYPE
    dev = tarfile.TarInfo("mypkg/sda")
    dev.type = tarfile.BLKTYPE
    for m, kind in ((sym, "a symbolic link"), (hard, "a hard link"), (fifo, "a special file"), (dev, "a special file")):
        with pytest.raises(CodePackageError, match=f"is {kind}; a package holds regular files"):
            read_archive(tar_of([("mypkg/handlers.py", HANDLER), m]))
    with pytest.raises(CodePackageError, match="'mypkg/link' is a link or special file"):
        read_archive(zip_of([("mypkg/handlers.py", HANDLER)], links={"mypkg/link": "/etc/shadow"}))


def test_limits_hold_whatever_the_archive_declares() -> None:
    bomb = zip_of([("big.bin", b"\0" * (3 << 20))])  # compresses to a few KiB
    assert len(bomb) < 64 << 10
    with pytest.raises(CodePackageError, match="expands to more than 1,048,576 bytes"):
        read_archive(bomb, max_bytes=1 << 20)
    gz = tar_of([("big.bin", b"\0" * (3 << 20))])
    with pytest.raises(CodePackageError, match="expands to more than"):
        read_archive(gz, max_bytes=1 << 20)
    many = tar_of([(f"m{k}.py", b"") for k in range(11)])
    with pytest.raises(CodePackageError, match="more than 10 entries"):
        read_archive(many, max_files=10)
    with pytest.raises(CodePackageError, match="over the 100-byte limit"):
        read_archive(b"x" * 101, max_bytes=100)


def _dirs_tar(n: int) -> bytes:
    members: list[tarfile.TarInfo | tuple[str, bytes]] = [("h.py", HANDLER)]
    for k in range(n):
        d = tarfile.TarInfo(f"d{k}")
        d.type, d.mode = tarfile.DIRTYPE, 0o755
        members.append(d)
    return tar_of(members)


def test_directories_count_as_entries_and_a_zip_s_declared_count_is_checked_first() -> None:
    """Issue 37 row 9: 400,000 empty directories (a 1.9 MB tar.gz) took a minute of the gateway's CPU
    and were accepted, as directories were not counted. Now every entry counts: 3,000 directories are
    refused at the 2,001st entry, in well under a second; a zip that declares more entries than the
    limit is refused before its central directory is parsed; a package of 2 files and 8 directories
    under a limit of 10 is taken."""
    import time

    t = time.perf_counter()
    with pytest.raises(CodePackageError, match="more than 2000 entries, files and directories"):
        read_archive(_dirs_tar(3000))
    assert time.perf_counter() - t < 5.0
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("h.py", HANDLER)
        for k in range(2100):
            zf.writestr(f"d{k}/", b"")
    with pytest.raises(CodePackageError, match="declares 2,101 entries"):
        read_archive(buf.getvalue())
    ok = tar_of([("h.py", HANDLER), ("pkg/m.py", b"")] + [_dir(f"pkg{k}") for k in range(8)])
    assert sorted(read_archive(ok, max_files=10).files) == ["h.py", "pkg/m.py"]
    with pytest.raises(CodePackageError, match="more than 9 entries"):
        read_archive(ok, max_files=9)


def _dir(name: str) -> tarfile.TarInfo:
    d = tarfile.TarInfo(name)
    d.type, d.mode = tarfile.DIRTYPE, 0o755
    return d


@pytest.mark.parametrize(("data", "why"), [
    (b"", "not a readable tar archive"),
    (b"print('hello')\n", "not a readable tar archive"),
    (b"PK\x03\x04garbage", "not a readable zip archive"),
])
def test_what_is_not_an_archive_is_refused(data: bytes, why: str) -> None:
    with pytest.raises(CodePackageError, match=why):
        read_archive(data)


def test_duplicates_empty_packages_and_files_under_files_are_refused() -> None:
    with pytest.raises(CodePackageError, match="appears twice"):
        read_archive(tar_of([("a.py", b"1"), ("a.py", b"2")]))
    with pytest.raises(CodePackageError, match="lies under a file"):
        read_archive(tar_of([("a", b"1"), ("a/b.py", b"2")]))
    with pytest.raises(CodePackageError, match="holds no files"):
        d = tarfile.TarInfo("empty")
        d.type = tarfile.DIRTYPE
        read_archive(tar_of([d]))
    assert issubclass(CodePackageError, SpecError)  # the gateway answers 400


def test_pack_dir_is_deterministic_and_skips_caches(tmp_path: Path) -> None:
    (tmp_path / "mypkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "mypkg" / "handlers.py").write_bytes(HANDLER)
    (tmp_path / "mypkg" / "__pycache__" / "handlers.cpython-311.pyc").write_bytes(b"junk")
    one = pack_dir(tmp_path)
    os.utime(tmp_path / "mypkg" / "handlers.py", (1, 1))
    assert pack_dir(tmp_path) == one  # timestamps do not enter the archive
    assert set(read_archive(one).files) == {"mypkg/handlers.py"}
    (tmp_path / "mypkg" / "link.py").symlink_to("/etc/passwd")
    with pytest.raises(CodePackageError, match="link.py is a link or special file"):
        pack_dir(tmp_path)
    with pytest.raises(CodePackageError, match="is not a directory"):
        pack_dir(tmp_path / "missing")


def test_the_store_writes_once_read_only(tmp_path: Path) -> None:
    store = CodeStore(tmp_path / "code")
    pkg = read_archive(tar_of([("mypkg/__init__.py", b""), ("mypkg/handlers.py", HANDLER)]))
    got = store.put("wf", pkg)
    assert got.path == tmp_path / "code" / "wf" / pkg.digest and got.files == 2
    f = got.path / "mypkg" / "handlers.py"
    assert f.read_bytes() == HANDLER and stat.S_IMODE(f.stat().st_mode) == 0o444
    assert stat.S_IMODE((got.path / "mypkg").stat().st_mode) == 0o555
    assert store.put("wf", pkg).path == got.path  # the same content: the same directory, not rewritten
    assert [p.name for p in (tmp_path / "code" / "wf").iterdir()] == [pkg.digest]  # no temporary left behind
    store.remove("wf")
    assert not (tmp_path / "code" / "wf").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand files to another group")
def test_a_tenants_package_is_readable_by_its_group_only(tmp_path: Path) -> None:
    store = CodeStore(tmp_path / "code")
    got = store.put("wf", read_archive(tar_of([("m.py", HANDLER)])), group=54321)
    for p in (got.path.parent, got.path, got.path / "m.py"):
        st = p.stat()
        assert st.st_gid == 54321 and st.st_uid == os.geteuid(), p  # the tenant cannot chmod what it does not own
        assert stat.S_IMODE(st.st_mode) & 0o007 == 0, p  # nothing for other tenants
    assert stat.S_IMODE((got.path / "m.py").stat().st_mode) == 0o440
