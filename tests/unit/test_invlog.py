"""The invocation journal: O(1) per open and end, crash-safe mid-write and at every step of a compaction."""

from __future__ import annotations

import json
import os

import pytest

from gfaas.dataplane.auth import Registry, token_hash
from gfaas.dataplane.invlog import InvocationLog

KEY = b"k" * 32


def opened(log: InvocationLog, reg: Registry, n: int) -> list[str]:
    ids = []
    for _ in range(n):
        inv = reg.open("wf", ["f", "g"])
        log.opened(inv, reg)
        ids.append(inv.id)
    return ids


def ended(log: InvocationLog, reg: Registry, ids: list[str]) -> None:
    for i in ids:
        reg.end(i)
    log.ended(ids, reg)


def view(reg: Registry) -> dict[str, dict[str, str]]:
    return {inv.id: inv.hashes for inv in reg.invocations()}


def test_a_reload_has_the_open_invocations_and_their_token_hashes_only(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Opens and ends replay to the open invocations; their tokens authenticate; no token is on disk."""
    path = str(tmp_path / "invocations.journal")
    log, reg = InvocationLog(path), Registry(KEY)
    log.rewrite(reg)
    ids = opened(log, reg, 5)
    tokens = {i: dict(reg.get(i).tokens) for i in ids}
    ended(log, reg, ids[1:3])
    reg2 = InvocationLog(path).load(KEY)
    assert view(reg2) == view(reg) and sorted(view(reg2)) == sorted(ids[:1] + ids[3:])
    assert reg2.authenticate(tokens[ids[4]]["g"]) == (reg2.get(ids[4]), "g")
    with open(path) as fh:
        text = fh.read()
    assert all(t not in text for toks in tokens.values() for t in toks.values())
    assert token_hash(KEY, tokens[ids[0]]["f"]) in text
    assert os.stat(path).st_mode & 0o777 == 0o600
    log.close()


def test_an_open_and_an_end_append_the_same_bytes_however_many_are_open(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The cost of one open + end does not grow with the invocations open (the JSON registry was
    rewritten whole each time: O(open))."""
    path = str(tmp_path / "j")
    log, reg = InvocationLog(path, compact_min=10**9), Registry(KEY)
    log.rewrite(reg)

    def pair() -> int:
        before = os.path.getsize(path)
        ended(log, reg, opened(log, reg, 1))
        return os.path.getsize(path) - before

    alone = pair()
    opened(log, reg, 1000)
    assert pair() == alone < 400
    log.close()


def test_a_line_cut_short_by_a_crash_loses_nothing_before_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A daemon killed in the middle of a write leaves a partial last line: a reload keeps every record
    before it, and the rewritten file takes appends again."""
    path = str(tmp_path / "j")
    log, reg = InvocationLog(path), Registry(KEY)
    log.rewrite(reg)
    ids = opened(log, reg, 3)
    ended(log, reg, ids[:1])
    want = view(reg)
    log.close()
    with open(path, "rb") as fh:
        whole = fh.read()
    extra = Registry(KEY).open("wf", ["f"])
    line = b'00000000 {"open":' + json.dumps(extra.to_json()).encode() + b"}\n"
    for cut in (5, 9, 30, len(line) - 1):  # torn inside the checksum, after it, in the JSON, before the newline
        with open(path, "wb") as fh:
            fh.write(whole + line[:cut])
        log2 = InvocationLog(path)
        assert view(log2.load(KEY)) == want
        with open(path, "rb") as fh:
            assert fh.read() != whole + line[:cut]  # rewritten: nothing is appended after the cut
        log2.close()
    with open(path, "wb") as fh:  # a whole line whose checksum does not match: the same
        fh.write(whole + line + whole)
    log3 = InvocationLog(path)
    reg3 = log3.load(KEY)
    assert view(reg3) == want
    more = opened(log3, reg3, 1)
    assert sorted(view(InvocationLog(path).load(KEY))) == sorted([*want, *more])
    log3.close()


def test_ends_compact_the_journal_once_they_outnumber_the_open_ones(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Records of ended invocations are dropped while running; the file stays O(open), not O(history)."""
    path = str(tmp_path / "j")
    log, reg = InvocationLog(path, compact_ratio=2.0, compact_min=50), Registry(KEY)
    log.rewrite(reg)
    keep = opened(log, reg, 10)
    sizes = []
    for _ in range(200):
        ended(log, reg, opened(log, reg, 1))
        sizes.append(log.records)
    assert log.compactions >= 5 and max(sizes) <= 10 + 52
    assert sorted(view(InvocationLog(path).load(KEY))) == sorted(keep)
    log.close()


@pytest.mark.parametrize("step", ["written", "synced", "renamed"])
def test_a_crash_at_any_step_of_compaction_loads_the_same_open_invocations(tmp_path, step: str) -> None:  # type: ignore[no-untyped-def]
    """A crash after writing, syncing or renaming the compacted file leaves a journal that replays to
    exactly the invocations open before it."""
    path = str(tmp_path / "j")
    log, reg = InvocationLog(path, compact_min=1), Registry(KEY)
    log.rewrite(reg)
    keep = opened(log, reg, 3)
    gone = opened(log, reg, 20)
    for i in gone:
        reg.end(i)

    def crash(name: str) -> None:
        if name == step:
            raise KeyboardInterrupt(f"crash after {name}")

    log._step = crash
    with pytest.raises(KeyboardInterrupt):
        log.ended(gone, reg)
    assert sorted(view(InvocationLog(path).load(KEY))) == sorted(keep)
    assert not os.path.exists(path + ".new")  # the reload's rewrite cleared the temporary file


def test_the_registry_of_earlier_versions_is_taken_over_and_removed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Without a journal, invocations.json (earlier versions) is read, plain tokens hashed, and removed."""
    legacy = tmp_path / "invocations.json"
    legacy.write_text(json.dumps([{"id": "ab" * 16, "workflow": "wf", "functions": ["f"], "tokens": {"f": "cd" * 16}}]))
    os.chmod(legacy, 0o600)
    log = InvocationLog(str(tmp_path / "invocations.journal"))
    reg = log.load(KEY, str(legacy))
    assert reg.authenticate("cd" * 16)[0].id == "ab" * 16
    assert not legacy.exists() and "cd" * 16 not in (tmp_path / "invocations.journal").read_text()
    assert len(InvocationLog(log.path).load(KEY, str(legacy))) == 1
    log.close()


def test_a_failed_append_is_an_error_naming_the_file_and_the_next_record_rewrites_it(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A write that fails part-way (a full disk) raises CapacityError with the path and fix; the next
    record rewrites the file rather than appending after the torn line."""
    from gfaas.errors import CapacityError

    path = str(tmp_path / "j")
    log, reg = InvocationLog(path), Registry(KEY)
    log.rewrite(reg)
    first = opened(log, reg, 1)
    real = os.write

    def half(fd: int, data: bytes) -> int:
        real(fd, bytes(data[:10]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", half)
    inv = reg.open("wf", ["f"])
    with pytest.raises(CapacityError, match=f"cannot record open invocations in {path} \\(No space left on device\\);"
                                            " free space on its file system"):
        log.opened(inv, reg)
    reg.end(inv.id)
    monkeypatch.setattr(os, "write", real)
    second = opened(log, reg, 1)
    assert sorted(view(InvocationLog(path).load(KEY))) == sorted(first + second)
    log.close()
