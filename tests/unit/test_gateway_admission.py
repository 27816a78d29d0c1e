"""Admission without touching the runtime and waiting without a thread (issue 23, item 2).

``gfaas.policy.admission.AdaptiveLimit`` by exact scenarios and hypothesis properties; the gateway with a
runtime that calls back: a request over the limit is answered 429 with ``Retry-After`` and never reaches
``submit``; a waiting request never calls the blocking ``result``; the place frees when the invocation ends."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_gateway import (  # pytest puts this directory on sys.path
    AUTH,
    TOKEN,
    FakeRuntime,
    _Inv,
    metric,
    parse_metrics,
)

from gfaas.errors import ConfigError
from gfaas.policy.admission import AdaptiveLimit, Admission
from gfaas.runtime.gateway import create_app
from gfaas.runtime.gateway.admission import Admissions
from gfaas.runtime.gateway.limits import GatewayLimits
from gfaas.runtime.result import InvocationResult


def test_the_limit_admits_up_to_itself_then_queues_then_refuses_with_a_retry_after() -> None:
    lim = AdaptiveLimit(initial=4, min_limit=4, max_limit=4, max_waiting=2)
    assert all(lim.admit(0.0).ok for _ in range(4))
    assert lim.admit(0.0).wait and lim.admit(0.0, waiting=1).wait  # the caller queues them
    no = lim.admit(0.0, waiting=2)
    assert not no.ok and not no.wait and no.retry_after_s >= 1 and "max_waiting=2" in no.reason
    assert not lim.release()  # no room until one finishes
    lim.finished(0.5, 0.5)
    assert lim.admit(0.6, waiting=1).wait  # a newcomer does not pass the one waiting
    assert lim.release() and lim.in_flight == 4


def test_retry_after_counts_the_clients_already_told_to_come_back() -> None:
    """A full queue drains at the completion rate; the clients refused before and told to return
    later are ahead of one refused now, so its Retry-After covers them too (a refusal answered
    uncounted, as the server's protocol first asks, promises nothing); once their time is past they
    no longer count."""
    lim = AdaptiveLimit(initial=2, min_limit=2, max_limit=2, max_waiting=2, rate_window_s=1.0)
    for k in range(20):  # 10 completions a second
        assert lim.admit(k / 10).ok
        lim.finished(k / 10 + 0.05, 0.05)
    assert lim.admit(2.0).ok and lim.admit(2.0).ok  # full: 2 in flight, 2 waiting (the caller's)
    looks = [lim.refusal(2.0, waiting=2, count=False) for _ in range(3)]
    assert [a.retry_after_s for a in looks if a] == [1.0] * 3 and lim.deferred(2.0) == 0 and lim.refused == 0
    # each counted refusal is one more client due back (after the whole seconds it was told)
    after = [lim.admit(2.0, waiting=2).retry_after_s for _ in range(12)]
    # excess = in flight + waiting - limit + 1 + deferred = 3 + k, at 10/s: at least 1 s
    assert after == [1.0] * 8 + [1.1, 1.2, 1.3, 1.4]
    assert lim.refused == 12 and lim.deferred(2.0) == 12
    assert "12 refused clients are due back before you" in lim.admit(2.5, waiting=2).reason  # due at 3.5
    # 8 were told 1 s (due at 3.0), 4 were told 2 s (1.1-1.4 s, in whole seconds: due at 4.0)
    assert lim.deferred(2.99) == 13 and lim.deferred(3.0) == 5
    lim.count_refusal(3.0, Admission(False, 0.2))  # a refusal made elsewhere: counted, due in a whole second
    assert lim.refused == 14 and lim.deferred(3.0) == 6 and lim.deferred(3.5) == 5 and lim.deferred(4.0) == 0


def test_a_request_that_cannot_finish_before_its_timeout_is_refused_at_once() -> None:
    lim = AdaptiveLimit(initial=1000, min_limit=4, max_limit=1000, rate_window_s=1.0)
    for k in range(20):  # 10 completions a second for 2 s, 0.1 s each
        assert lim.admit(k / 10).ok
        lim.finished(k / 10 + 0.05, 0.1)
    no = lim.admit(2.0, timeout_s=2.0, waiting=50)  # 50 ahead at 10/s: ~5 s
    assert not no.ok and not no.wait and "after its timeout of 2 s" in no.reason
    assert lim.admit(2.0, timeout_s=10.0, waiting=50).wait


def test_no_deadline_refusal_before_the_completion_rate_is_known() -> None:
    """At start-up the first completions trickle in while many are in flight: a rate counted then
    would predict waits far too long (a gateway test refused the 31st of 32 clients that way)."""
    lim = AdaptiveLimit(initial=64, rate_window_s=2.0)
    for _ in range(30):
        assert lim.admit(0.0).ok
    lim.finished(0.5, 0.5)
    assert lim.admit(0.6, timeout_s=60.0).ok


def test_rising_latency_shrinks_the_limit_and_the_baseline_grows_it_back() -> None:
    lim = AdaptiveLimit(initial=100, min_limit=4, max_limit=1000)
    t = 0.0
    for _ in range(200):  # the baseline: 10 ms
        t += 0.01
        lim.admit(t)
        lim.finished(t, 0.01)
    high = lim.limit
    for _ in range(50):  # queueing: 10x the baseline
        t += 0.1
        lim.admit(t)
        lim.finished(t, 0.1)
    assert lim.limit < 0.5 * high
    low = lim.limit
    for _ in range(300):
        t += 0.01
        lim.admit(t)
        lim.finished(t, 0.01)
    assert lim.limit > low


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="min_limit"):
        AdaptiveLimit(initial=2, min_limit=4)
    with pytest.raises(ConfigError, match="tolerance"):
        AdaptiveLimit(tolerance=0.5)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.floats(0, 2, allow_nan=False), st.none() | st.floats(0.001, 5)),
                max_size=200))
def test_properties_limit_bounds_and_in_flight_accounting(ops: list[tuple[bool, float, float | None]]) -> None:
    lim = AdaptiveLimit(initial=8, min_limit=2, max_limit=64)
    t, held = 0.0, 0
    for take, dt, latency in ops:
        t += dt
        if take:
            held += lim.admit(t).ok or lim.release()
        elif held:
            lim.finished(t, latency)
            held -= 1
        assert lim.in_flight == held <= max(lim.min_limit, int(lim.limit)) + 0
        assert lim.min_limit <= lim.limit <= lim.max_limit


class CallbackRuntime(FakeRuntime):
    """The fake runtime plus ``add_done_callback``, as LocalRuntime has it."""

    def __init__(self) -> None:
        super().__init__()
        self.callbacks: dict[str, list[Callable[[InvocationResult], None]]] = {}

    def add_done_callback(self, invocation_id: str, callback: Callable[[InvocationResult], None]) -> None:
        inv = self._inv(invocation_id)
        with self.lock:
            if not inv.done.is_set():
                self.callbacks.setdefault(inv.id, []).append(callback)
                return
        assert inv.result is not None
        callback(inv.result)

    def _finish(self, inv: _Inv) -> None:
        super()._finish(inv)
        with self.lock:
            cbs = self.callbacks.pop(inv.id, [])
        for cb in cbs:
            assert inv.result is not None
            cb(inv.result)


def _app(rt: CallbackRuntime, limit: int, max_waiting: int = 0, hold: bool = False) -> Any:
    """(``hold``: off by default here, since every request of one ASGI test client is one connection.)"""
    app = create_app(rt, token=TOKEN, sweep_interval_s=3600, limits=GatewayLimits(hold_refused=hold))
    app.state.gateway.admissions = Admissions(rt.workflows, initial=limit, min_limit=limit, max_limit=limit,
                                              max_waiting=max_waiting)
    return app


def test_over_the_limit_is_429_without_a_submit_and_the_place_frees_when_the_invocation_ends() -> None:
    rt = CallbackRuntime()
    rt.deploy("name: held\ninputs: [x]\nkind: hold\n")
    app = _app(rt, 2)

    async def go() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw",
                                     headers=AUTH) as c:
            url = "/v1/workflows/held/invocations"
            a = [await c.post(url, json={"seed": 1}, params={"mode": "async"}) for _ in range(2)]
            assert [r.status_code for r in a] == [202, 202]
            refused = await c.post(url, json={"seed": 1}, params={"mode": "async"})
            assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
            assert refused.json()["error"] == "overloaded" and "limit now is 2" in refused.json()["message"]
            assert rt.submits == 2  # the refusal never reached the runtime
            adm = app.state.gateway.admissions
            assert adm.describe()["held"]["in_flight"] == 2  # held until the invocations end
            bad = await c.post(url, json={"seed": "x"}, params={"mode": "async"})  # never reaches the runtime
            assert bad.status_code == 429  # still full: the bad request was refused before its body was read
            await asyncio.to_thread(rt.release)
            await asyncio.sleep(0.05)  # the callbacks hop onto the loop
            assert adm.describe()["held"]["in_flight"] == 0
            bad = await c.post(url, json={"seed": "x"}, params={"mode": "async"})
            assert bad.status_code == 422 and adm.describe()["held"]["in_flight"] == 0  # its place was freed
            again = await c.post(url, json={"seed": 1}, params={"mode": "async"})
            assert again.status_code == 202 and rt.submits == 3

    asyncio.run(go())


def test_waiting_requests_hold_no_thread_and_each_wakes_with_its_own_result() -> None:
    rt = CallbackRuntime()
    rt.deploy("name: held\ninputs: [x]\nkind: hold\n")
    app = _app(rt, 64, max_waiting=64)

    async def go() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw",
                                     headers=AUTH) as c:
            tasks = [asyncio.create_task(c.post("/v1/workflows/held/invocations", json={"seed": k},
                                                params={"timeout": 30})) for k in range(24)]
            while rt.submits < 24:
                await asyncio.sleep(0.01)
            before = threading.active_count()
            await asyncio.sleep(0.2)
            assert not rt.waiting.is_set()  # nobody blocked in the runtime's result()
            assert threading.active_count() <= before
            await asyncio.to_thread(rt.release)
            answers = await asyncio.gather(*tasks)
        assert [r.status_code for r in answers] == [200] * 24
        ids = {r.json()["invocation_id"] for r in answers}
        assert len(ids) == 24  # each request got its own invocation's result

    asyncio.run(go())


def test_over_the_limit_requests_wait_without_a_thread_and_are_admitted_one_per_completion() -> None:
    rt = CallbackRuntime()
    rt.deploy("name: held\ninputs: [x]\nkind: hold\n")
    app = _app(rt, 1, max_waiting=2)

    async def go() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw",
                                     headers=AUTH) as c:
            url = "/v1/workflows/held/invocations"
            first = asyncio.create_task(c.post(url, json={"seed": 1}, params={"timeout": 30}))
            while rt.submits < 1:
                await asyncio.sleep(0.01)
            queued = [asyncio.create_task(c.post(url, json={"seed": 2}, params={"timeout": 30}))]
            await asyncio.sleep(0.1)
            short = await c.post(url, json={"seed": 3}, params={"timeout": 0.2})  # a wait that ends unadmitted
            assert short.status_code == 429 and "within 0.2 s" in short.json()["message"]
            queued.append(asyncio.create_task(c.post(url, json={"seed": 2}, params={"timeout": 30})))
            await asyncio.sleep(0.1)
            adm = app.state.gateway.admissions
            assert adm.describe()["held"]["waiting"] == 2 and rt.submits == 1  # waiting, not submitted
            assert not adm.idle()  # what gfaas serve's collector asks before a full collection (gcpause)
            full = await c.post(url, json={"seed": 3}, params={"timeout": 30})
            assert full.status_code == 429 and "max_waiting=2" in full.json()["message"]
            await asyncio.to_thread(rt.release)  # the first ends: exactly one waiter is admitted
            assert (await first).status_code == 200
            while rt.submits < 2:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)
            assert rt.submits == 2 and adm.describe()["held"]["waiting"] == 1
            for _ in range(2):
                await asyncio.to_thread(rt.release)
                await asyncio.sleep(0.1)
            assert [(await q).status_code for q in queued] == [200, 200]
            assert adm.idle()
            assert adm.describe()["held"] | {} == {"limit": 1, "in_flight": 0, "waiting": 0, "admitted": 3,
                                                   "refused": 1}

    asyncio.run(go())


@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_both_http_parsers_bound_the_header_block_and_serve(parser: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gateway uses httptools where installed and falls back to h11: each keeps the 16 KiB header
    bound and serves a normal request."""
    import socket

    from gfaas.runtime.gateway import protocol, serve

    if parser == "h11":
        monkeypatch.setattr(protocol, "_httptools", lambda: None)
    elif protocol._httptools() is None:
        pytest.skip("httptools is not installed")
    rt = CallbackRuntime()
    rt.deploy("name: d\ninputs: [x]\nkind: double\n")
    with serve(rt, token=TOKEN, sweep_interval_s=3600, access_log=False) as gw:
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * (20 * 1024) + b"\r\n")
            got = b""
            while chunk := s.recv(4096):
                got += chunk
        assert got.split(b" ")[1] in (b"400", b"431"), got[:80]
        r = httpx.post(f"{gw.url}/v1/workflows/d/invocations", json={"seed": 2}, headers=AUTH)
        assert r.status_code == 200 and r.json()["status"] == "done"


@pytest.mark.parametrize("hold", [True, False])
def test_a_connection_that_retries_at_once_is_held_until_its_retry_after(hold: bool) -> None:
    """Refused (429, Retry-After: 1), a connection that sends again at once is not looked at before the
    second is up, and is then refused again if still over the limit; another connection is answered
    at once meanwhile. With ``hold_refused`` off, the retry is answered at once."""
    import time

    rt = CallbackRuntime()
    rt.deploy("name: held\ninputs: [x]\nkind: hold\n")
    app = _app(rt, 1, hold=hold)

    async def go() -> None:
        def client(port: int) -> httpx.AsyncClient:
            return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=("10.0.0.1", port)),
                                     base_url="http://gw", headers=AUTH)

        url = "/v1/workflows/held/invocations"
        async with client(1) as first, client(2) as eager, client(3) as other:
            running = asyncio.create_task(first.post(url, json={"seed": 1}, params={"timeout": 30}))
            while rt.submits < 1:
                await asyncio.sleep(0.01)
            r = await eager.post(url, json={"seed": 2}, params={"timeout": 0})
            assert r.status_code == 429 and r.headers["retry-after"] == "1"
            t0 = time.monotonic()
            again = asyncio.create_task(eager.post(url, json={"seed": 2}, params={"timeout": 0}))
            await asyncio.sleep(0.3)
            assert again.done() is not hold  # held: no answer yet
            t1 = time.monotonic()
            assert (await other.post(url, json={"seed": 3}, params={"timeout": 0})).status_code == 429
            assert time.monotonic() - t1 < 0.3  # another connection is answered at once
            assert (await again).status_code == 429
            waited = time.monotonic() - t0
            assert (0.9 <= waited < 3.0) if hold else waited < 0.5, waited
            await asyncio.to_thread(rt.release)
            assert (await running).status_code == 200
            assert rt.submits == 1  # the refused were never submitted

    asyncio.run(go())


@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_the_servers_protocol_holds_an_early_retry_before_parsing_it(parser: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Served for real, the early retry of a refused connection is held by the server's protocol (its
    reading paused), not by a coroutine in the guard: with the guard's own hold made to fail, the retry
    still waits its second and is answered 429, while another connection is answered at once."""
    import socket
    import time

    from gfaas.runtime.gateway import guard, protocol, serve

    if parser == "h11":
        monkeypatch.setattr(protocol, "_httptools", lambda: None)
    elif protocol._httptools() is None:
        pytest.skip("httptools is not installed")

    async def no_guard_hold(_: float) -> None:
        raise AssertionError("the guard held a request the protocol should have held")

    monkeypatch.setattr(guard.Guard, "_hold", staticmethod(no_guard_hold))
    rt = CallbackRuntime()
    rt.deploy("name: held\ninputs: [x]\nkind: hold\n")
    request = (b"POST /v1/workflows/held/invocations?mode=async HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
               + TOKEN.encode() + b"\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n{\"seed\":1}")

    def answer(s: socket.socket) -> bytes:
        got = b""
        while b"\r\n\r\n" not in got or not got.endswith(b"}"):
            chunk = s.recv(65536)
            assert chunk, got
            got += chunk
        return got.split(b" ", 2)[1]

    with serve(rt, token=TOKEN, sweep_interval_s=3600, access_log=False) as gw:
        gw.app.state.gateway.admissions = Admissions(rt.workflows, initial=1, min_limit=1, max_limit=1, max_waiting=0)
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as first, \
                socket.create_connection(("127.0.0.1", gw.port), timeout=10) as eager, \
                socket.create_connection(("127.0.0.1", gw.port), timeout=10) as other:
            first.sendall(request)
            assert answer(first) == b"202"  # takes the only place
            eager.sendall(request)
            assert answer(eager) == b"429"
            t0 = time.monotonic()
            eager.sendall(request)  # at once: held
            other.sendall(request)
            assert answer(other) == b"429" and time.monotonic() - t0 < 0.5  # answered meanwhile
            assert answer(eager) == b"429"
            assert 0.9 <= time.monotonic() - t0 < 3.0
        rt.release()


def test_refusals_are_answered_in_front_of_fastapis_own_middleware() -> None:
    """The guard is the application's outermost layer: a 401 or a 429 is answered without FastAPI's
    middleware stack ever being built, let alone run; an admitted request goes through it."""
    rt = CallbackRuntime()
    rt.deploy("name: held\ninputs: [x]\nkind: hold\n")
    app = _app(rt, 1)

    async def go() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c:
            url = "/v1/workflows/held/invocations"
            assert (await c.post(url, json={"seed": 1})).status_code == 401
            assert app.middleware_stack is None
            assert (await c.post(url, json={"seed": 1}, params={"mode": "async"}, headers=AUTH)).status_code == 202
            assert app.middleware_stack is not None  # an asynchronous invocation goes to its route
            app.middleware_stack = None
            assert (await c.post(url, json={"seed": 1}, params={"mode": "async"}, headers=AUTH)).status_code == 429
            assert app.middleware_stack is None  # the limit is full: refused in front
            await asyncio.to_thread(rt.release)

    asyncio.run(go())


def _read_answer(f: Any) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response from a socket's file (status, headers, body by Content-Length)."""
    status = int(f.readline().split(b" ", 2)[1])
    headers: dict[str, str] = {}
    while (line := f.readline()) not in (b"\r\n", b""):
        k, v = line.decode("latin-1").split(":", 1)
        headers[k.strip().lower()] = v.strip()
    return status, headers, f.read(int(headers.get("content-length", "0")))


def test_the_servers_protocol_refuses_before_it_builds_the_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """Served for real with httptools, an invocation the limit refuses is answered by the protocol as its
    headers arrive: the guard never runs for it, the answer is the guard's own 429 (body, Retry-After),
    it is counted once and its client held; the rest of its body, however it arrives and however long,
    is skipped, and the next request on the connection is served. Without a token it is the guard's 401."""
    import json
    import socket

    from gfaas.runtime.gateway import guard, protocol, serve

    if protocol._httptools() is None:
        pytest.skip("httptools is not installed")
    seen: list[tuple[str, str]] = []
    real_call = guard.Guard.__call__

    async def spy(self: Any, scope: Any, receive: Any, send: Any) -> None:
        seen.append((scope.get("method", ""), scope.get("path", "")))
        await real_call(self, scope, receive, send)

    monkeypatch.setattr(guard.Guard, "__call__", spy)
    rt = CallbackRuntime()
    rt.deploy("name: held\ninputs: [x]\nkind: hold\n")

    def request(body: bytes, auth: bool = True, length: int | None = None) -> bytes:
        return (b"POST /v1/workflows/held/invocations?timeout=30 HTTP/1.1\r\nHost: x\r\n"
                + (b"Authorization: Bearer " + TOKEN.encode() + b"\r\n" if auth else b"")
                + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (len(body) if length is None else length)
                + body)

    health = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with serve(rt, token=TOKEN, sweep_interval_s=3600, access_log=False) as gw:
        state = gw.app.state.gateway
        state.admissions = Admissions(rt.workflows, initial=1, min_limit=1, max_limit=1, max_waiting=0)
        assert httpx.post(f"{gw.url}/v1/workflows/held/invocations", params={"mode": "async"}, json={"seed": 1},
                          headers=AUTH).status_code == 202  # takes the only place
        seen.clear()
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
            f = s.makefile("rb")
            s.sendall(request(b'{"seed": 2}'))
            status, headers, body = _read_answer(f)
            assert (status, headers["retry-after"], headers["content-type"]) == (429, "1", "application/json")
            doc = json.loads(body)
            assert doc["error"] == "overloaded" and doc["retry_after_s"] == 1
            assert "'held' takes no more invocations now" in doc["message"] and "limit now is 1" in doc["message"]
            assert seen == []  # the guard never saw it
            assert tuple(s.getsockname()) in state.held_clients  # its client held, as the guard holds it
            s.sendall(request(b'{"seed": 2}') + health)  # back at once, with a request pipelined after it
            t0 = time.monotonic()
            assert _read_answer(f)[0] == 429 and time.monotonic() - t0 >= 0.9  # held until its Retry-After
            assert _read_answer(f)[0] == 200  # the body was skipped, the next request parsed
            assert ("GET", "/healthz") in seen and ("POST", "/v1/workflows/held/invocations") not in seen
            assert state.admissions.describe()["held"]["refused"] == 2
            assert metric(parse_metrics(httpx.get(f"{gw.url}/metrics", headers=AUTH).text),
                          "gfaas_invocations_rejected_total", workflow="held", reason="admission") == 2
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
            f = s.makefile("rb")
            big = b'{"seed": 3, "pad": "' + b"x" * (100 << 10) + b'"}'  # more than a header block may be
            s.sendall(request(b"", length=len(big)))  # the headers alone: refused at once
            assert _read_answer(f)[0] == 429
            del state.held_clients[tuple(s.getsockname())]  # (as with hold_refused off: read at once)
            s.sendall(big[:10])
            time.sleep(0.05)
            s.sendall(big[10:])  # the rest of the body: not taken for a header block (16 KiB at most)
            time.sleep(0.05)
            s.sendall(health)  # then the next request
            assert _read_answer(f)[0] == 200
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
            s.sendall(request(b'{"seed": 4}', auth=False))
            assert _read_answer(s.makefile("rb"))[0] == 401  # authentication first: the guard answers
        assert ("POST", "/v1/workflows/held/invocations") in seen

        broke: list[str] = []

        def broken(scope: Any) -> Any:
            broke.append(scope["path"])
            raise RuntimeError("a bug in the early check")

        # the server's protocol class (made by bounded(), below httptools's) holds the check it calls
        served = [c for base in protocol._EarlyRefusal.__subclasses__() for c in base.__subclasses__()
                  if vars(c).get("refuse") is not None]
        for c in served:
            monkeypatch.setattr(c, "refuse", staticmethod(broken))
        seen.clear()
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
            s.sendall(request(b'{"seed": 5}'))
            assert _read_answer(s.makefile("rb"))[0] == 429  # a bug there: the guard answers instead
        assert broke == ["/v1/workflows/held/invocations"] and seen == [("POST", "/v1/workflows/held/invocations")]
        assert state.admissions.describe()["held"]["refused"] == 4
        rt.release()


@given(st.integers(1, 8), st.integers(0, 12), st.integers(0, 4), st.integers(0, 6),
       st.one_of(st.none(), st.floats(0.001, 5.0)), st.integers(0, 40))
@settings(max_examples=200, deadline=None)
def test_properties_refusal_is_admits_refusal_without_taking_a_place(
        limit: int, in_flight: int, max_waiting: int, waiting: int, timeout_s: float | None, done: int) -> None:
    """``refusal`` answers exactly the refusals ``admit`` answers, with the same Retry-After, and
    never admits: what it changes is the refusal count and the returns it asked for (with
    ``count=False`` neither)."""
    import copy

    lim = AdaptiveLimit(initial=limit, min_limit=limit, max_limit=limit, max_waiting=max_waiting)
    for k in range(done):  # a completion rate and latencies to predict waits from
        lim.finished(k * 0.05, 0.2, 0.1)
    lim.in_flight = in_flight
    twin = copy.deepcopy(lim)
    now = done * 0.05
    asked = lim.refusal(now, timeout_s, waiting, count=False)  # a look that counts nothing
    assert lim.refused == twin.refused and lim.deferred(now) == 0
    r, a = lim.refusal(now, timeout_s, waiting), twin.admit(now, timeout_s, waiting)
    assert asked == r
    if a.ok or a.wait:
        assert r is None and lim.refused == twin.refused
    else:
        assert r == a and lim.refused == twin.refused and lim.deferred(now) == twin.deferred(now) == 1
    assert (lim.in_flight, lim.admitted) == (in_flight, 0)


def test_a_waiter_that_leaves_as_its_place_comes_gives_it_back_and_one_that_expires_leaves_the_queue() -> None:
    """One future and one timer per waiter (no wait_for over a shield): a waiter cancelled (its client
    left) after a place was handed to it gives the place back, instead of holding it for ever; one
    whose time is up is refused and leaves the queue; ``wait_until`` never cancels what it waits for."""
    from gfaas.runtime.gateway.admission import wait_until

    async def go() -> None:
        adm = Admissions(lambda: ["w"], initial=1, min_limit=1, max_limit=1, max_waiting=4)
        first, lim = await adm.enter("w", 10, 10)
        assert first.ok
        leaving = asyncio.create_task(adm.enter("w", 10, 10))
        await asyncio.sleep(0)
        assert adm.describe()["w"]["waiting"] == 1
        adm.finished(lim, 0.01)  # the place goes to the waiter (on the loop, soon)
        await asyncio.sleep(0)  # handed over; the waiter has not run since
        leaving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leaving
        assert adm.describe()["w"] | {} == {"limit": 1, "in_flight": 0, "waiting": 0, "admitted": 2, "refused": 0}
        again, lim = await adm.enter("w", 10, 10)  # the place is free: admitted at once
        assert again.ok
        t0 = time.monotonic()
        late, _ = await adm.enter("w", 0.05, 10)
        assert not late.ok and "no place came free within 0.05 s" in late.reason and time.monotonic() - t0 < 1
        assert adm.describe()["w"]["waiting"] == 0 and adm.describe()["w"]["in_flight"] == 1

        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        assert not await wait_until(fut, 0.01) and not fut.cancelled()
        loop.call_later(0.01, fut.set_result, 7)
        assert await wait_until(fut, 5) and fut.result() == 7

    asyncio.run(go())


def test_a_place_freed_on_another_thread_wakes_the_waiting_loop_at_once() -> None:
    """``finished`` skips the loop's wake-up write only when it runs on the waiter's own loop; from a
    runtime thread it must still wake the loop, or the waiter sleeps until its timer (10 s here)."""

    async def go() -> None:
        adm = Admissions(lambda: ["w"], initial=1, min_limit=1, max_limit=1, max_waiting=4)
        first, lim = await adm.enter("w", 10, 10)
        waiter = asyncio.create_task(adm.enter("w", 10, 10))
        await asyncio.sleep(0)
        t0 = time.monotonic()
        threading.Timer(0.05, adm.finished, (lim, 0.01)).start()  # the loop sleeps in select meanwhile
        got, _ = await waiter
        assert got.ok and time.monotonic() - t0 < 2
        # and on the loop itself, the place is handed over within the next round
        second = asyncio.create_task(adm.enter("w", 10, 10))
        await asyncio.sleep(0)
        adm.finished(lim, 0.01)
        got, _ = await asyncio.wait_for(second, 2)
        assert got.ok and adm.describe()["w"]["in_flight"] == 1

    asyncio.run(go())


_QUERY_PARTS = st.sampled_from(["timeout=30", "timeout=0.5", "timeout=x", "timeout=", "mode=async", "mode=sync",
                                "outputs=digest", "timeout=7&timeout=9", "a=b", "", "timeout=1e3"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_QUERY_PARTS, max_size=3).map("&".join), min_size=1, max_size=40),
       st.sampled_from([60.0, 5.0]))
def test_the_wait_a_request_asks_for_is_the_same_whether_remembered_or_not(queries: list[str], default: float) -> None:
    """invoke_wait keeps its answers by query string: each is the uncached answer, asked once or again,
    and the table stays bounded."""
    from gfaas.runtime.gateway import admission as adm

    for q in queries + queries:
        scope = {"query_string": q.encode()}
        assert adm.invoke_wait(scope, default) == adm._invoke_wait(q.encode(), default), q
    for k in range(adm._WAITS_MAX + 5):
        adm.invoke_wait({"query_string": f"timeout={k}".encode()}, default)
    assert len(adm._WAITS) <= adm._WAITS_MAX


@pytest.mark.parametrize("query, want", [("", 60.0), ("timeout=30", 30.0), ("timeout=x", 60.0), ("mode=async", None),
                                         ("timeout=7&timeout=9", 9.0), ("timeout=2&mode=async", None)])
def test_the_wait_a_request_asks_for(query: str, want: float | None) -> None:
    from gfaas.runtime.gateway.admission import invoke_wait

    for _ in range(2):  # asked, then remembered
        assert invoke_wait({"query_string": query.encode()}, 60.0) == want
