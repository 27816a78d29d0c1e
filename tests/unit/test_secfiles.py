"""gfaas.secfiles, the one owner of private directories and secret files: the pieces the callers'
attack tests (tests/security) do not reach."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gfaas.errors import ConfigError
from gfaas.secfiles import create_file, load_or_create, private_dir, read_private_file, replace_file


def test_read_refuses_a_file_over_its_limit_and_names_a_missing_one(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    create_file(path, b"x" * 101)
    assert read_private_file(path, "secret", limit=101) == b"x" * 101
    with pytest.raises(ConfigError, match=rf"secret {path} holds more than 100 bytes"):
        read_private_file(path, "secret", limit=100)
    gone = str(tmp_path / "gone")
    with pytest.raises(ConfigError, match=rf"cannot open the secret {gone}: it does not exist"):
        read_private_file(gone, "secret")
    with pytest.raises(FileNotFoundError):
        read_private_file(gone, "secret", must_exist=False)


def test_a_fifo_is_not_read(tmp_path: Path) -> None:
    """A FIFO planted at a secret's path is refused before any read (which would block)."""
    path = str(tmp_path / "fifo")
    os.mkfifo(path, 0o600)
    fd = os.open(path, os.O_RDWR)  # a writer end, so that opening it for reading does not block
    try:
        with pytest.raises(ConfigError, match=rf"secret {path} is not a regular file"):
            read_private_file(path, "secret")
    finally:
        os.close(fd)


def test_load_or_create_keeps_the_first_content(tmp_path: Path) -> None:
    path = str(tmp_path / "k")
    assert load_or_create(path, "key", b"first") == (b"first", True)
    assert load_or_create(path, "key", b"second") == (b"first", False)
    assert os.stat(path).st_mode & 0o777 == 0o600
    with pytest.raises(ConfigError, match=rf"cannot create the key {tmp_path}/none/k: No such file"):
        load_or_create(str(tmp_path / "none" / "k"), "key", b"x")


def test_replace_writes_over_a_planted_symlink_never_through_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (tmp_path / "f").symlink_to(victim)
    replace_file(str(tmp_path / "f"), b"new", sync=False)
    assert victim.read_bytes() == b"precious" and (tmp_path / "f").read_bytes() == b"new"
    assert not (tmp_path / "f").is_symlink() and sorted(os.listdir(tmp_path)) == ["f", "victim"]


def test_private_dir_creates_parents_0700_and_refuses_a_file(tmp_path: Path) -> None:
    d = tmp_path / "a" / "b"
    assert private_dir(str(d), "state directory") == str(d)
    assert (d.stat().st_mode & 0o777, d.parent.stat().st_mode & 0o777) == (0o700, 0o700)
    (tmp_path / "f").write_text("")
    with pytest.raises(ConfigError, match=rf"state directory {tmp_path}/f is not a directory; remove it"):
        private_dir(str(tmp_path / "f"), "state directory")
