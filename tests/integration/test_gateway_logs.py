"""Logs through the gateway: GET /v1/workflows/{name}/logs (plain and follow), GatewayClient.logs and
`gfaas logs`, on a real runtime behind an in-process gateway; a failed result's JSON carries the trace."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from gfaas.cli import main
from gfaas.cli_logs import format_record
from gfaas.errors import NotFound
from gfaas.runtime.client_http import GatewayClient
from gfaas.runtime.gateway import serve
from gfaas.runtime.local import LocalRuntime, RuntimeConfig

pytestmark = pytest.mark.timeout(120)

TOKEN = "logs-test-token-0123456789abcdef"
SPEC = """
name: chat
inputs: {x: null}
outputs: {out: g.y}
functions:
  - {name: f, kind: cpu, handler: "log_handlers:chatty", inputs: {x: input.x}, outputs: {y: null}}
  - {name: g, kind: cpu, handler: "log_handlers:fail_loudly", inputs: {x: f.y}, outputs: {y: null}}
"""


@pytest.fixture
def gateway(rt_handlers: str, tmp_path: Any) -> Iterator[tuple[LocalRuntime, str]]:
    with LocalRuntime(RuntimeConfig(log_dir=str(tmp_path / "logs"), sandbox="none")) as rt:
        rt.deploy(SPEC)
        with serve(rt, port=0, token=TOKEN, access_log=False) as gw:
            yield rt, gw.url


def test_route_client_and_cli_show_the_runtime_s_lines(gateway: tuple[LocalRuntime, str], monkeypatch: Any,
                                                        capsys: Any) -> None:
    rt, url = gateway
    with GatewayClient(url, token=TOKEN) as gw:
        res = gw.invoke("chat", {"x": np.array([7.0])}, timeout=60)
        # g failed: the result document carries its traceback and last lines
        assert res.status == "failed" and res.failure is not None and res.failure.function == "g"
        assert "this input is not good" in res.failure.trace
        assert res.failure.logs == ("stdout: about to fail", "log: userfn: bad input [8.0]")
        inv = res.invocation_id
        mine = gw.logs("chat", invocation=inv)
        assert mine == rt.logs("chat", invocation=inv) and len(mine) == 9
        assert {r["function"] for r in mine} == {"f", "g"}
        f_only = gw.logs("chat", function="f", invocation=inv)
        assert [r for r in mine if r["function"] == "f"] == f_only
        assert gw.logs("chat", limit=3) == rt.logs("chat")[-3:]
        with pytest.raises(NotFound):
            gw.logs("nosuch")

    monkeypatch.setenv("GFAAS_GATEWAY_TOKEN", TOKEN)
    capsys.readouterr()
    assert main(["logs", "chat", "--function", "f", "--invocation", inv, "--url", url]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [format_record(r) for r in f_only]
    assert any(line.endswith(f" f {inv} stdout: print 7") for line in out), out
    assert any(f" f {inv} log WARNING: userfn: record 7" in line for line in out), out
    assert main(["logs", "chat", "--function", "f", "--invocation", inv, "--url", url, "--json"]) == 0
    import json

    assert [json.loads(x) for x in capsys.readouterr().out.splitlines()] == f_only


def test_follow_sends_new_lines_as_they_come(gateway: tuple[LocalRuntime, str]) -> None:
    rt, url = gateway
    seen: list[dict[str, Any]] = []
    # Everything after the lines kept now: the invocation may well finish before the follower connects.
    last = max((r["seq"] for r in rt.logs("chat")), default=0)
    with GatewayClient(url, token=TOKEN) as gw:

        def follow() -> None:
            for rec in gw.follow_logs("chat", function="f", for_s=30, after=last):
                seen.append(rec)
                if rec["text"] == "print 3":
                    return  # leaving the stream ends the gateway's follower

        t = threading.Thread(target=follow)
        t.start()
        inv = rt.submit("chat", {"x": np.array([3.0])})
        rt.result(inv, timeout=60)
        t.join(30)
        assert not t.is_alive()
    # after=last: nothing older, then this invocation's lines (the import-time line came before: not sent)
    assert seen and all(r["invocation"] == inv and r["function"] == "f" for r in seen)
    assert [r["seq"] for r in seen] == sorted(r["seq"] for r in seen)


def test_cli_follow_reconnects_after_the_gateway_s_longest_wait(rt_handlers: str, tmp_path: Any, monkeypatch: Any,
                                                                capsys: Any) -> None:
    """The gateway ends a follow after max_timeout_s (1 s here); `gfaas logs --follow --for 3` goes on
    from the last line it printed: every line once, none twice."""
    import time

    with LocalRuntime(RuntimeConfig(log_dir=str(tmp_path / "logs"), sandbox="none")) as rt:
        rt.deploy(SPEC)
        with serve(rt, port=0, token=TOKEN, access_log=False, max_timeout_s=1.0, default_timeout_s=1.0) as gw:
            monkeypatch.setenv("GFAAS_GATEWAY_TOKEN", TOKEN)
            capsys.readouterr()
            t = threading.Thread(target=main, args=(["logs", "chat", "--function", "f", "--limit", "0", "--follow",
                                                      "--for", "3", "--url", gw.url],))
            t.start()
            time.sleep(0.3)
            first = rt.invoke("chat", {"x": np.array([1.0])}, timeout=60).invocation_id
            time.sleep(1.5)  # past the first connection's end
            second = rt.invoke("chat", {"x": np.array([2.0])}, timeout=60).invocation_id
            t.join(30)
            assert not t.is_alive()
    out = capsys.readouterr().out.splitlines()
    want = [format_record(r) for r in rt.logs("chat", function="f") if r["invocation"] in (first, second)]
    assert out == want and len(want) == 14
