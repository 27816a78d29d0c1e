"""Function logs on the process executor (runtime.logs): every way a handler can print is captured and
attributed to its invocation, output is bounded, a failure carries its traceback and last lines, and the
files rotate."""

from __future__ import annotations

import json
import os
import socket
import stat
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from gfaas.runtime.local import LocalRuntime, RuntimeConfig
from gfaas.runtime.logs import MAX_BATCH_BYTES, MAX_BATCH_LINES, MAX_LINE, LogStore
from gfaas.runtime.worker import MAX_MSG, Failed, LogLine, _enc

pytestmark = pytest.mark.timeout(120)

H = "log_handlers"


def spec(name: str, handler: str, extra_outputs: str = "", params: str = "{}") -> str:
    return f"""
name: {name}
inputs: {{x: null}}
outputs: {{out: f.y}}
functions:
  - {{name: f, kind: cpu, handler: "{H}:{handler}", params: {params}, inputs: {{x: input.x}},
      outputs: {{y: null{extra_outputs}}}}}
"""


@pytest.fixture
def log_handlers(rt_handlers: str) -> str:
    return H  # the same support directory is on PYTHONPATH


@pytest.fixture
def rt(log_handlers: str, tmp_path: Any) -> Iterator[LocalRuntime]:
    with LocalRuntime(RuntimeConfig(log_dir=str(tmp_path / "logs"), sandbox="none")) as r:
        yield r


def texts(recs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(r["stream"], r["text"]) for r in recs]


def test_every_path_is_captured_and_attributed_to_its_invocation(rt: LocalRuntime) -> None:
    rt.deploy(spec("chat", "chatty"))
    a = rt.invoke("chat", {"x": np.array([1.0])}, timeout=60)
    b = rt.invoke("chat", {"x": np.array([2.0])}, timeout=60)
    assert a.ok and b.ok, (a.error, b.error)
    for res, tag in ((a, 1), (b, 2)):
        got = texts(rt.logs("chat", invocation=res.invocation_id))
        # stdout lines: print, fd 1, the child process, the unterminated line (ends with the task)
        assert sorted(t for s, t in got if s == "stdout") == sorted(
            [f"print {tag}", f"fd1 {tag}", f"child {tag}", "no newline"])
        assert sorted(t for s, t in got if s == "stderr") == [f"fd2 {tag}", f"stderr {tag}"]
        assert [t for s, t in got if s == "log"] == [f"userfn: record {tag}"]
    recs = rt.logs("chat", invocation=a.invocation_id)
    assert {(r["workflow"], r["function"], r["version"]) for r in recs} == {("chat", "f", "1")}
    assert [r["level"] for r in recs if r["stream"] == "log"] == ["WARNING"]
    # The module's print at import time is no invocation's.
    assert ("stdout", "loading log_handlers") in texts(rt.logs("chat", invocation=""))
    # Filters: function, limit, and after= (the follow cursor)
    everything = rt.logs("chat")
    assert rt.logs("chat", function="f") == everything
    assert rt.logs("chat", function="nope") == []
    assert rt.logs("chat", limit=2) == everything[-2:]
    assert rt.logs("chat", after=everything[-3]["seq"]) == everything[-2:]
    assert [r["seq"] for r in everything] == sorted(r["seq"] for r in everything)


def test_a_failed_invocation_carries_its_traceback_and_last_lines(rt: LocalRuntime) -> None:
    rt.deploy(spec("bad", "fail_loudly"))
    res = rt.invoke("bad", {"x": np.array([-1.0])}, timeout=60)
    assert res.status == "failed"
    assert res.failure is not None and res.failure.function == "f" and res.failure.error == "ValueError"
    assert "Traceback" in res.failure.trace and "this input is not good" in res.failure.trace
    assert 'raise ValueError("this input is not good")' in res.failure.trace  # the handler's own frame
    assert res.failure.logs == ("stdout: about to fail", "log: userfn: bad input [-1.0]")
    # and in the gateway's JSON document, both ways
    from gfaas.runtime.wire import result_document, result_from_document

    doc = json.loads(json.dumps(result_document(res)))
    assert doc["failure"]["logs"] == list(res.failure.logs)
    assert result_from_document(doc).failure == res.failure


def test_ten_megabytes_of_output_stay_bounded(rt: LocalRuntime) -> None:
    rt.deploy(spec("loud", "flood"))
    res = rt.invoke("loud", {"x": np.array([0.0])}, timeout=60)
    assert res.ok, res.error
    recs = rt.logs("loud", invocation=res.invocation_id, limit=100_000)
    *kept, dropped = recs
    assert 0 < len(kept) <= MAX_BATCH_LINES and sum(len(r["text"]) + 16 for r in kept) <= MAX_BATCH_BYTES
    assert {r["text"] for r in kept} == {"z" * 1023}  # the first lines, whole; the rest counted
    assert dropped["text"].startswith(f"[gfaas] {10_001 - len(kept)} lines dropped"), dropped
    assert dropped["invocation"] == res.invocation_id
    # a worker that prints nothing next still works, and the next batch starts afresh
    assert rt.invoke("loud", {"x": np.array([0.0])}, timeout=60).ok


def test_one_long_line_is_cut_with_a_marker(rt: LocalRuntime) -> None:
    rt.logstore.add("w", "f", "i", [LogLine(1.0, "stdout", "", "x" * (3 * MAX_LINE), True)])
    (rec,) = rt.logstore.read("w")
    assert rec["text"].startswith("x" * MAX_LINE) and rec["text"].endswith(f"[line cut at {MAX_LINE} bytes]")


def test_a_full_batch_fits_one_socket_message() -> None:
    """The worst batch (every line at the bytes bound, 4-byte characters, the longest traceback) goes
    through a default SOCK_SEQPACKET pair as one message."""
    from gfaas.runtime.logs import _Batch

    batch = _Batch()
    for _ in range(MAX_BATCH_LINES * 2):
        batch.add(LogLine(time.time(), "stdout", "", "\U0001f600" * (MAX_LINE // 4), True))
    assert batch.dropped > 0 and batch.nbytes <= MAX_BATCH_BYTES
    many = _Batch()
    for _ in range(MAX_BATCH_LINES * 2):
        many.add(LogLine(time.time(), "stdout", "", "", True))
    for lines in (batch.lines, many.lines):
        msg = Failed("i" * 32, "ValueError", "m" * 8000, "t" * 8000, logs=lines)
        data = _enc.encode(msg)
        assert len(data) < MAX_MSG
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with a, b:
            a.send(data)
            assert b.recv(MAX_MSG) == data


def test_files_rotate_and_are_private(tmp_path: Any) -> None:
    store = LogStore(str(tmp_path / "logs"), file_bytes=2000, keep_files=2)
    for k in range(40):
        store.add("wf", "fn", f"inv{k}", [LogLine(float(k), "stdout", "", f"line {k:03d} " + "." * 80, True)])
    store.close()
    d = tmp_path / "logs" / "wf"
    names = sorted(os.listdir(d))
    assert names == ["fn.log", "fn.log.1", "fn.log.2"]
    for n in names:
        st = os.stat(d / n)
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_size <= 2000
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "logs").st_mode) == 0o700
    newest = [json.loads(x) for x in (d / "fn.log").read_text().splitlines()]
    assert newest[-1]["text"].startswith("line 039") and newest[-1]["invocation"] == "inv39"
    older = [json.loads(x) for x in (d / "fn.log.1").read_text().splitlines()]
    assert older[-1]["seq"] == newest[0]["seq"] - 1  # nothing lost between the newest two files
    # the memory ring holds the last `ring` lines
    small = LogStore(str(tmp_path / "ring"), ring=5)
    small.add("wf", "fn", "i", [LogLine(float(k), "stdout", "", str(k), True) for k in range(12)])
    assert [r["text"] for r in small.read("wf")] == ["7", "8", "9", "10", "11"]
    small.close()
    # and at most ring_bytes of text (10,000 lines of 8 KiB would otherwise be 80 MB per function)
    capped = LogStore(str(tmp_path / "capped"), ring=10_000, ring_bytes=100_000)
    for k in range(50):
        capped.add("wf", "fn", "i", [LogLine(float(k), "stdout", "", f"{k:02d}" + "y" * 8000, True)])
    kept = [r["text"][:2] for r in capped.read("wf")]
    assert kept == [f"{k:02d}" for k in range(50 - len(kept), 50)] and len(kept) == 100_000 // 8066
    capped.close()
