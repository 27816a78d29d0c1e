"""gfaas.dedup.shared: the content-addressed store of read-only mappings (naming by hash, modes, atomic
publish, domains, cleaning, the torch path)."""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import stat
import threading
from pathlib import Path

import numpy as np
import pytest

from gfaas.dedup import shared
from gfaas.dedup.shared import SharedBuffer, clear_store, load_shared, publish_bytes, store_usage
from gfaas.errors import ConfigError, DedupError, DependencyMissing


def _file(p: Path, data: bytes) -> Path:
    p.write_bytes(data)
    return p


def _listing(d: Path) -> list[str]:
    return sorted(f.name for f in d.iterdir())


def test_load_shared_maps_the_content_under_its_sha256(tmp_path: Path) -> None:
    """The mapping holds the file's bytes, named by their SHA-256, file 0444 in 0700 directories."""
    data = os.urandom(3 * 4096 + 17)
    store = tmp_path / "store"
    with load_shared(_file(tmp_path / "w.bin", data), store_dir=store) as buf:
        digest = hashlib.sha256(data).hexdigest()
        assert buf.digest == digest and buf.nbytes == len(data)
        assert buf.path == store / "default" / digest
        assert bytes(buf.view) == data
        assert stat.S_IMODE(buf.path.stat().st_mode) == 0o444
        assert stat.S_IMODE(store.stat().st_mode) == 0o700
        assert stat.S_IMODE((store / "default").stat().st_mode) == 0o700
        assert _listing(store / "default") == [digest]  # no temporary file left


def test_view_is_read_only(tmp_path: Path) -> None:
    """Neither the memoryview nor arrays made from it can be written."""
    with load_shared(_file(tmp_path / "w.bin", b"\1" * 8192), store_dir=tmp_path / "s") as buf:
        assert buf.view.readonly
        with pytest.raises(TypeError):
            buf.view[0] = 2  # type: ignore[index]
        arr = np.frombuffer(buf.view, np.uint8)
        assert not arr.flags.writeable
        with pytest.raises(ValueError):
            arr[0] = 2
        del arr


def test_identity_is_the_content_never_the_name(tmp_path: Path) -> None:
    """Same bytes under different names share one store file; the same name with other bytes does not; a
    source file named like a digest gets the digest of its content."""
    a, b = os.urandom(5000), os.urandom(5000)
    store = tmp_path / "s"
    x = load_shared(_file(tmp_path / "x.bin", a), store_dir=store)
    y = load_shared(_file(tmp_path / "y.bin", a), store_dir=store)
    assert x.path == y.path and x.path.stat().st_ino == y.path.stat().st_ino
    z = load_shared(_file(tmp_path / "x.bin", b), store_dir=store)  # same name, new content
    assert z.digest == hashlib.sha256(b).hexdigest() != x.digest
    liar = _file(tmp_path / hashlib.sha256(a).hexdigest(), b)
    assert load_shared(liar, store_dir=store).digest == z.digest
    assert store_usage(store) == {"default": {"files": 2, "bytes": 10000}}


def test_concurrent_publishers_all_map_one_file(tmp_path: Path) -> None:
    """Eight threads publishing the same 4 MiB at once end with one store file, one inode, no temp files."""
    data = os.urandom(4 << 20)
    store = tmp_path / "s"
    barrier = threading.Barrier(8)
    paths: list[Path] = []

    def go() -> None:
        barrier.wait()
        paths.append(publish_bytes(memoryview(data), store_dir=store))

    threads = [threading.Thread(target=go) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(paths)) == 1 and len(paths) == 8
    assert _listing(store / "default") == [hashlib.sha256(data).hexdigest()]


def test_losing_publisher_uses_the_winners_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When another process links the digest first (between our check and our link), our link fails and we
    map the winner's inode: never a second copy, never a replaced file."""
    data = os.urandom(9000)
    store = tmp_path / "s"
    digest = hashlib.sha256(data).hexdigest()
    real_link = os.link
    winner: list[int] = []

    def racing_link(src: str, dst: str) -> None:
        other = Path(dst).with_name(".other.tmp")
        other.write_bytes(data)
        real_link(other, dst)  # the other process wins the race
        other.unlink()
        winner.append(Path(dst).stat().st_ino)
        real_link(src, dst)  # ours: FileExistsError

    monkeypatch.setattr(shared.os, "link", racing_link)
    buf = load_shared(_file(tmp_path / "w.bin", data), store_dir=store)
    assert buf.path.stat().st_ino == winner[0]
    assert bytes(buf.view) == data
    assert _listing(store / "default") == [digest]


def test_content_changing_while_published_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """If the bytes written differ from the bytes hashed (the file changed in between), nothing is published
    and DedupError says to retry."""
    src = _file(tmp_path / "w.bin", b"a" * 100)
    monkeypatch.setattr(shared, "_digest_file", lambda p: hashlib.sha256(b"b" * 100).hexdigest())
    with pytest.raises(DedupError, match="content changed while it was published.*retry"):
        load_shared(src, store_dir=tmp_path / "s")
    assert _listing(tmp_path / "s" / "default") == []


@pytest.mark.parametrize("bad", ["", ".", "..", "../x", "a/b", ".hidden", "x" * 65, "sp ace", "é", 3, None])
def test_bad_domain_names_are_refused(tmp_path: Path, bad: object) -> None:
    """Domain names are 1-64 of [A-Za-z0-9_.-], not starting with '.': the error names the value and the fix."""
    src = _file(tmp_path / "w.bin", b"x")
    with pytest.raises(ConfigError, match=r"sharing domain .* is not a valid name.*e\.g\. domain=") as e:
        load_shared(src, domain=bad, store_dir=tmp_path / "s")  # type: ignore[arg-type]
    assert repr(bad) in str(e.value)
    assert not (tmp_path / "x").exists() and not (tmp_path.parent / "x").exists()


def test_domains_never_share_files(tmp_path: Path) -> None:
    """The same content in two domains is two files in two 0700 directories."""
    src = _file(tmp_path / "w.bin", b"z" * 4096)
    store = tmp_path / "s"
    a = load_shared(src, domain="tenant-a", store_dir=store)
    b = load_shared(src, domain="tenant_b.1", store_dir=store)
    assert a.digest == b.digest and a.path != b.path
    assert a.path.parent.name == "tenant-a" and b.path.parent.name == "tenant_b.1"
    assert store_usage(store) == {"tenant-a": {"files": 1, "bytes": 4096}, "tenant_b.1": {"files": 1, "bytes": 4096}}


def test_store_open_to_others_or_a_symlink_is_refused(tmp_path: Path) -> None:
    """A store directory that group/others can enter, or a symlink, is refused with the fix."""
    src = _file(tmp_path / "w.bin", b"x")
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    os.chmod(loose, 0o755)
    with pytest.raises(ConfigError, match=r"mode 0755, open to group or others; run chmod 700"):
        load_shared(src, store_dir=loose)
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(ConfigError, match="is a symlink"):
        load_shared(src, store_dir=tmp_path / "link")


def test_clear_store_removes_files_and_mappings_stay_valid(tmp_path: Path) -> None:
    """clear_store returns the bytes removed (one domain or all); a buffer mapped before stays readable."""
    store = tmp_path / "s"
    keep = load_shared(_file(tmp_path / "a", b"a" * 1000), domain="d1", store_dir=store)
    load_shared(_file(tmp_path / "b", b"b" * 300), domain="d2", store_dir=store)
    load_shared(_file(tmp_path / "c", b"c" * 20), domain="d2", store_dir=store)
    assert clear_store(store, domain="d2") == 320
    assert store_usage(store) == {"d1": {"files": 1, "bytes": 1000}}
    assert clear_store(store) == 1000
    assert store_usage(store) == {}
    assert bytes(keep.view) == b"a" * 1000
    assert clear_store(tmp_path / "never-made") == 0


def test_close_refuses_while_arrays_use_the_mapping(tmp_path: Path) -> None:
    """close() raises DedupError while an array made from the view exists, and works once it is gone."""
    buf = load_shared(_file(tmp_path / "w.bin", b"q" * 4096), store_dir=tmp_path / "s")
    arr = np.frombuffer(buf.view, np.uint8)
    with pytest.raises(DedupError, match="still in use by arrays.*drop them before close"):
        buf.close()
    assert bytes(buf.view[:2]) == b"qq"  # the refused close() left the buffer usable
    del arr
    buf.close()
    assert buf.closed
    buf.close()  # idempotent


def test_empty_and_missing_files(tmp_path: Path) -> None:
    """An empty file maps to an empty view; a missing file is a ConfigError naming it."""
    buf = load_shared(_file(tmp_path / "empty", b""), store_dir=tmp_path / "s")
    assert isinstance(buf, SharedBuffer) and buf.nbytes == 0 and bytes(buf.view) == b""
    assert buf.digest == hashlib.sha256(b"").hexdigest()
    with pytest.raises(ConfigError, match="cannot read '.*nope' to load it shared"):
        load_shared(tmp_path / "nope", store_dir=tmp_path / "s")


def test_default_store_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                           caplog: pytest.LogCaptureFixture) -> None:
    """$GFAAS_SHARED_DIR, else /dev/shm/gfaas-shared-<uid>, else the temp dir with a warning."""
    monkeypatch.setenv("GFAAS_SHARED_DIR", str(tmp_path / "env"))
    assert shared.default_store_dir() == tmp_path / "env"
    monkeypatch.delenv("GFAAS_SHARED_DIR")
    monkeypatch.setattr(shared, "SHM", tmp_path / "shm")
    (tmp_path / "shm").mkdir()
    assert shared.default_store_dir() == tmp_path / "shm" / f"gfaas-shared-{os.geteuid()}"
    monkeypatch.setattr(shared, "SHM", tmp_path / "no-shm")
    monkeypatch.setattr(shared.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    with caplog.at_level(logging.WARNING, "gfaas.dedup"):
        assert shared.default_store_dir() == tmp_path / "tmp" / f"gfaas-shared-{os.geteuid()}"
    assert "no-shm is missing or not writable; the shared store falls back to" in caplog.text


_HAS_TORCH = importlib.util.find_spec("torch") is not None


@pytest.mark.skipif(_HAS_TORCH, reason="torch is installed: the missing-dependency path cannot be reached")
def test_shared_tensor_without_torch_names_the_extra(tmp_path: Path) -> None:
    """Without torch, load_shared_tensor raises DependencyMissing naming the torch extra."""
    with pytest.raises(DependencyMissing, match=r"pip install 'gfaas\[torch\]'"):
        shared.load_shared_tensor(_file(tmp_path / "w.bin", b"\0" * 16), store_dir=tmp_path / "s")


@pytest.mark.skipif(not _HAS_TORCH, reason="torch is not installed (pip install 'gfaas[torch]')")
def test_shared_tensor_reads_the_mapping(tmp_path: Path) -> None:  # pragma: no cover - needs torch
    """A float32 tensor over the mapping equals the file's values, with no warning escaping."""
    import warnings

    import torch

    vals = np.arange(12, dtype=np.float32)
    src = _file(tmp_path / "w.bin", vals.tobytes())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = shared.load_shared_tensor(src, torch.float32, shape=(3, 4), store_dir=tmp_path / "s")
    assert t.shape == (3, 4) and t.dtype == torch.float32
    np.testing.assert_array_equal(t.numpy().ravel(), vals)
    with pytest.raises(ConfigError, match="do not fit"):
        shared.load_shared_tensor(src, torch.float32, shape=(4, 4), store_dir=tmp_path / "s")
