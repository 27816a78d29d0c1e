"""Issue 22 item 4: one tenant's logs are never readable with another's credentials.

The gateway has one token (the operator's): the logs route needs it, and unlike any other route it is
refused outright (403) by a gateway served without authentication. In the runtime, log files are 0600
in 0700 directories of the runtime's uid, so a sandboxed function (another uid) cannot read another
workflow's log; the same probe without the sandbox reads it, which shows the probe can tell. Function
code cannot put lines into another function's or invocation's log, whatever it prints or does to its
own process. (A handler printing 10 MB stays bounded: tests/integration/test_runtime_logs.py.)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from gfaas.runtime.gateway import serve
from gfaas.runtime.local import LocalRuntime, RuntimeConfig

pytestmark = pytest.mark.timeout(120)

TOKEN = "logs-security-token-0123456789abcdef"
VICTIM = """
name: victim
inputs: {x: null}
outputs: {out: v.y}
functions:
  - {name: v, kind: cpu, handler: "log_handlers:chatty", inputs: {x: input.x}, outputs: {y: null}}
"""


def probe_spec(handler: str, params: dict[str, Any], extra: str = "") -> str:
    ps = ", ".join(f"{k}: {v!r}" for k, v in params.items())
    return f"""
name: intruder
inputs: {{x: null}}
outputs: {{out: a.y}}
functions:
  - {{name: a, kind: cpu, handler: "log_handlers:{handler}", params: {{{ps}}}, inputs: {{x: input.x}},
      outputs: {{y: null{extra}}}}}
"""


@pytest.fixture
def handlers(rt_handlers: str) -> str:
    return "log_handlers"


@pytest.fixture
def gateway(handlers: str, tmp_path: Any) -> Iterator[tuple[LocalRuntime, str]]:
    with LocalRuntime(RuntimeConfig(log_dir=str(tmp_path / "logs"), sandbox="none")) as rt:
        rt.deploy(VICTIM)
        assert rt.invoke("victim", {"x": np.array([1.0])}, timeout=60).ok
        with serve(rt, port=0, token=TOKEN, access_log=False) as gw:
            yield rt, gw.url


def test_the_logs_route_needs_the_token(gateway: tuple[LocalRuntime, str]) -> None:
    _, url = gateway
    path = f"{url}/v1/workflows/victim/logs"
    assert httpx.get(path).status_code == 401
    assert httpx.get(path, headers={"authorization": "Bearer " + "x" * 40}).status_code == 401
    assert httpx.get(path, headers={"authorization": TOKEN}).status_code == 401  # no scheme
    assert httpx.get(path + "?follow=true", headers={"authorization": "Bearer nope"}).status_code == 401
    ok = httpx.get(path, headers={"authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200 and "print 1" in ok.text
    assert ok.headers["content-type"].startswith("application/x-ndjson")


def test_a_gateway_without_authentication_serves_no_logs(gateway: tuple[LocalRuntime, str]) -> None:
    rt, _ = gateway
    with serve(rt, port=0, authenticate=False, access_log=False) as open_gw:
        assert httpx.get(f"{open_gw.url}/v1/workflows").status_code == 200  # other reads stay open on loopback
        r = httpx.get(f"{open_gw.url}/v1/workflows/victim/logs")
        assert r.status_code == 403 and "print" not in r.text
        assert httpx.get(f"{open_gw.url}/v1/workflows/victim/logs?follow=true").status_code == 403


def test_function_code_cannot_forge_another_function_s_or_invocation_s_lines(handlers: str, tmp_path: Any) -> None:
    with LocalRuntime(RuntimeConfig(log_dir=str(tmp_path / "logs"), sandbox="none")) as rt:
        rt.deploy(VICTIM)
        victim = rt.invoke("victim", {"x": np.array([1.0])}, timeout=60)
        before = rt.logs("victim")
        rt.deploy(probe_spec("forge", {"victim": victim.invocation_id}))
        res = rt.invoke("intruder", {"x": np.array([1.0])}, timeout=60)
        assert res.ok, res.error
        assert rt.logs("victim") == before  # nothing reached the victim's log
        mine = rt.logs("intruder")
        assert {(r["workflow"], r["function"]) for r in mine} == {("intruder", "a")}
        assert {r["invocation"] for r in mine} <= {res.invocation_id, ""}
        forged = [r for r in mine if '"forged"' in r["text"]]
        # printed, written to fd 2 and logged: kept as this invocation's text, not read as records
        assert [(r["stream"], r["invocation"]) for r in forged] == [
            ("stdout", res.invocation_id), ("stderr", res.invocation_id), ("log", res.invocation_id)]
        assert not rt.logs("intruder", invocation=victim.invocation_id)


@pytest.mark.root
def test_a_sandboxed_function_cannot_read_another_workflow_s_log_files(handlers: str, tmp_path: Any) -> None:
    outs = ", read: {shape: []}, listed: {shape: []}, safe: {shape: []}, threads: {shape: []}"
    victim_spec = VICTIM.replace("log_handlers:chatty", "log_handlers:say")  # no child process: python is root's
    for sandbox, expect in (("uid", 0.0), ("none", 1.0)):
        log_dir = tmp_path / sandbox
        with LocalRuntime(RuntimeConfig(log_dir=str(log_dir), sandbox=sandbox)) as rt:  # type: ignore[arg-type]
            rt.deploy(victim_spec)
            assert rt.invoke("victim", {"x": np.array([1.0])}, timeout=60).ok
            path = os.path.join(str(log_dir), "victim", "v.log")
            assert os.path.exists(path)
            rt.deploy(probe_spec("read_file", {"path": path}, outs))
            res = rt.invoke("intruder", {"x": np.array([1.0])}, timeout=60)
            assert res.ok, res.error
            assert (res.scalars["a.read"], res.scalars["a.listed"]) == (expect, expect), sandbox
            if sandbox == "uid":  # the log reader thread is no way back to root either
                assert res.scalars["a.threads"] >= 2 and res.scalars["a.safe"] == 1.0
            # nor its own: the files are the runtime's, not the tenant's
            own = os.path.join(str(log_dir), "intruder", "a.log")
            st = os.stat(own)
            assert st.st_uid == os.geteuid() and st.st_mode & 0o077 == 0


def test_what_a_worker_sends_is_checked(tmp_path: Any) -> None:
    """A worker is function code: a bad stream, a long level, a NaN time or an over-long line it sends
    over the control socket are kept as safe values, and the lines stay valid JSON."""
    import json
    import math

    from gfaas.runtime.logs import MAX_LINE, LogLine, LogStore

    store = LogStore(str(tmp_path / "logs"))
    (rec,) = store.add("wf", "fn", "inv", [LogLine(math.nan, "../../etc", "X" * 100, "t" * (MAX_LINE * 2), True)])
    assert rec["stream"] == "stdout" and len(rec["level"]) == 16 and math.isfinite(rec["time"])
    assert len(rec["text"].encode()) < MAX_LINE + 64
    store.close()
    (line,) = (tmp_path / "logs" / "wf" / "fn.log").read_text().splitlines()
    assert json.loads(line)["seq"] == rec["seq"]


def test_gfaas_logs_shows_a_function_s_terminal_escapes_escaped(gateway: tuple[LocalRuntime, str], monkeypatch: Any,
                                                                capsys: Any) -> None:
    """Issue 37 row 8: a function prints a window title, a clipboard write, an 8-bit clear screen, a
    carriage return and a right-to-left override. ``gfaas logs`` prints none of them raw (before: every
    one), shows each as a visible escape, and ``--json`` decodes to the text exactly as printed."""
    import json

    from log_handlers import ESCAPES  # type: ignore[import-not-found]

    from gfaas.cli import main

    rt, url = gateway
    rt.deploy(probe_spec("escapes", {}))
    res = rt.invoke("intruder", {"x": np.array([1.0])}, timeout=60)
    assert res.ok, res.error
    monkeypatch.setenv("GFAAS_GATEWAY_TOKEN", TOKEN)
    capsys.readouterr()
    assert main(["logs", "intruder", "--invocation", res.invocation_id, "--url", url]) == 0
    out = capsys.readouterr().out
    raw = {c for c in out if (ord(c) < 0x20 and c != "\n") or 0x7f <= ord(c) <= 0x9f or c in "\u202e\u202c"}
    assert not raw, raw
    # printed: one record, its carriage return escaped; logged: the log record's text splits there
    head, tail = ESCAPES.split("\r")
    shown_head = r"ok\x1b]0;pwned\x07 \x1b]52;c;ZWNobyBoaQ==\x07 \x9b2J "
    shown_tail = r"FAKE LINE \u202eevil\u202c"
    lines = out.splitlines()
    assert sum(line.endswith(" stdout: " + shown_head + r"\r" + shown_tail) for line in lines) == 1, lines
    assert sum(line.endswith(" log WARNING: userfn: record " + shown_head) for line in lines) == 1, lines
    assert sum(line.endswith(" log WARNING: " + shown_tail) for line in lines) == 1, lines
    assert main(["logs", "intruder", "--invocation", res.invocation_id, "--url", url, "--json"]) == 0
    out = capsys.readouterr().out
    assert not any(0x7f <= ord(c) <= 0x9f or c in "\u202e\u202c" for c in out)
    texts = [json.loads(x)["text"] for x in out.splitlines()]
    assert ESCAPES in texts and f"userfn: record {head}" in texts and tail in texts, texts
