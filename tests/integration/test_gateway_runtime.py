"""The HTTP gateway in front of the real local runtime: a thousand invocations from 32 concurrent
clients, each answered exactly once with its own result, and the error paths end to end."""

from __future__ import annotations

import os
import re
import threading
from collections import Counter
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from test_runtime_local import FAIL, SEQ  # pytest puts this directory on sys.path

from gfaas import GatewayClient, NotFound, Overloaded, SpecError, serve_gateway
from gfaas.runtime.gateway import GatewayLimits
from gfaas.runtime.local import LocalRuntime, RuntimeConfig

N_INVOCATIONS = 1000
CONCURRENCY = 32
TOKEN = "integration-test-token-0123456789"
AUTH = {"authorization": f"Bearer {TOKEN}"}
RT_HANDLERS = GatewayLimits(handler_packages=("rt_handlers",))  # tests/support/rt_handlers.py


@pytest.fixture(scope="module")
def gateway() -> Iterator[tuple[LocalRuntime, str]]:
    mp = pytest.MonkeyPatch()
    support = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "support"))
    mp.syspath_prepend(support)
    mp.setenv("PYTHONPATH", support)
    rt = LocalRuntime(RuntimeConfig(workers_per_function=2, max_queue=4096, node_capacity_bytes=256 << 20))
    try:
        with serve_gateway(rt, access_log=False, max_body_bytes=1 << 20, token=TOKEN, limits=RT_HANDLERS) as gw:
            with GatewayClient(gw.url, token=TOKEN) as c:
                c.deploy(SEQ)
                c.deploy(FAIL)
            yield rt, gw.url
    finally:
        rt.close()
        mp.undo()


def test_a_thousand_invocations_from_32_clients_none_lost_or_duplicated(gateway: tuple[LocalRuntime, str]) -> None:
    """Each request carries its own input (k); each answer must be -2k under its own invocation ID,
    every ID distinct, and the gateway's counter must have seen exactly these invocations."""
    rt, url = gateway
    answers: dict[int, tuple[str, float]] = {}
    errors: list[str] = []
    lock = threading.Lock()
    before = _done_count(url)

    def client(ks: list[int]) -> None:
        with GatewayClient(url, timeout=120, token=TOKEN) as c:
            for k in ks:
                try:
                    res = c.invoke("seq", {"x": np.array([float(k)])})
                    assert res.ok, res.error
                    with lock:
                        assert k not in answers
                        answers[k] = (res.invocation_id, float(res.outputs["out"][0]))
                except Exception as exc:  # noqa: BLE001 - collected and reported below
                    with lock:
                        errors.append(f"k={k}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=client, args=(list(range(i, N_INVOCATIONS, CONCURRENCY)),))
               for i in range(CONCURRENCY)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors[:5]
    assert sorted(answers) == list(range(N_INVOCATIONS))
    assert all(v == -2.0 * k for k, (_, v) in answers.items())
    ids = Counter(inv for inv, _ in answers.values())
    assert len(ids) == N_INVOCATIONS and ids.most_common(1)[0][1] == 1
    assert _done_count(url) - before == N_INVOCATIONS


def _done_count(url: str) -> float:
    text = httpx.get(f"{url}/metrics", headers=AUTH).text
    m = re.search(r'^gfaas_invocations_total\{[^}]*status="done"[^}]*workflow="seq"[^}]*\} (\S+)$', text, re.M) or \
        re.search(r'^gfaas_invocations_total\{[^}]*workflow="seq"[^}]*status="done"[^}]*\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def test_error_paths_through_the_real_runtime(gateway: tuple[LocalRuntime, str]) -> None:
    _, url = gateway
    with GatewayClient(url, token=TOKEN) as c:
        with pytest.raises(NotFound, match="no workflow 'nope'"):
            c.invoke("nope", {"x": np.zeros(1)})
        with pytest.raises(SpecError, match="cycle|depends"):
            c.deploy("name: loop\ninputs: {x: null}\noutputs: {o: a.y}\nfunctions:\n"
                     "  - {name: a, kind: cpu, handler: 'rt_handlers:double', inputs: {x: b.y}, outputs: {y: null}}\n"
                     "  - {name: b, kind: cpu, handler: 'rt_handlers:double', inputs: {x: a.y}, outputs: {y: null}}\n")
        assert c.deploy(SEQ) == "seq"  # the same spec again: a no-op, not a new version
        with pytest.raises(SpecError, match=r"missing \['x'\]|takes inputs"):
            c.invoke("seq", {"y": np.zeros(1)})
        with pytest.raises(NotFound):
            c.result("0" * 32)
        failed = c.invoke("failing", {"x": np.array([-1.0])})
        assert failed.status == "failed" and "negative input at 0" in (failed.error or "")
        ok = c.invoke("failing", {"x": np.array([1.0])})  # the failure stayed in its invocation
        assert ok.ok and float(ok.outputs["out"][0]) == 2.0
    r = httpx.post(f"{url}/v1/workflows/seq/invocations", content=b"{not json", headers={"content-type":
                                                                                          "application/json", **AUTH})
    assert r.status_code in (400, 422) and "error" in r.json()
    big = {"inputs": {"x": {"dtype": "uint8", "shape": [2 << 20], "data_b64": "A" * (3 << 20)}}}
    r = httpx.post(f"{url}/v1/workflows/seq/invocations", json=big, headers=AUTH)
    assert r.status_code == 413 and r.json()["error"] == "payload_too_large"
    r = httpx.get(f"{url}/v1/invocations/..%2Fetc/result", headers=AUTH)
    assert r.status_code in (404, 422)


def test_a_full_queue_is_429_with_retry_after(rt_handlers: str) -> None:
    """max_queue=1 and a slow function: with one running and one waiting, the next request is a
    429 with Retry-After (Overloaded in the client); the two accepted ones still finish."""
    from test_runtime_local import wait_for

    slow = ("name: slowpoke\ninputs: {x: null}\noutputs: {o: s.y}\nfunctions:\n"
            "  - {name: s, kind: cpu, handler: 'rt_handlers:slow', params: {seconds: 0.5}, inputs: {x: input.x},"
            " outputs: {y: null}}\n")
    with LocalRuntime(RuntimeConfig(executor="inproc", max_queue=1)) as rt, \
            serve_gateway(rt, access_log=False, token=TOKEN, limits=RT_HANDLERS) as gw, \
            GatewayClient(gw.url, token=TOKEN) as c:
        c.deploy(slow)
        first = c.submit("slowpoke", {"x": np.array([1.0])})
        wait_for(lambda: c.status(first) == "running", what="the first request to start")
        second = c.submit("slowpoke", {"x": np.array([2.0])})
        with pytest.raises(Overloaded, match="max_queue"):
            c.submit("slowpoke", {"x": np.array([3.0])})
        from gfaas.runtime.wire import encode_array

        r = httpx.post(f"{gw.url}/v1/workflows/slowpoke/invocations", params={"mode": "async"},
                       json={"inputs": {"x": encode_array(np.array([4.0]))}}, headers=AUTH)
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1, r.text
        assert [float(c.result(i, timeout=30).outputs["o"][0]) for i in (first, second)] == [1.0, 2.0]


@pytest.mark.parametrize("on_loop", [True, False])
def test_the_server_steps_invocations_on_its_event_loop_and_gives_the_replies_back(on_loop: bool) -> None:
    """With ``replies_on_loop`` (the default) the workers' replies are handled on the server's event
    loop thread while it serves (HTTP and embedded calls alike complete), and on the runtime's own
    thread again once it stopped; off, they never leave that thread."""
    from gfaas.workflows.tiny import SPEC, expected_total

    body = {"n": np.asarray(256, dtype=np.int64)}
    with LocalRuntime(RuntimeConfig()) as rt:
        rt.deploy(SPEC)
        loop = rt.invoker.reply_loop
        assert rt.invoke("tiny", body, timeout=60).ok
        assert loop._thread.name == "gfaas-invoker"
        polled: list[str] = []  # the server polls the replies after each chunk it reads, when it drives them
        poll = rt.poll_replies
        rt.poll_replies = lambda: (polled.append(threading.current_thread().name), poll())[1]  # type: ignore[method-assign]
        with serve_gateway(rt, access_log=False, token=TOKEN, limits=GatewayLimits(replies_on_loop=on_loop)) as gw:
            driver = loop._thread.name
            with GatewayClient(gw.url, token=TOKEN) as c:
                over_http = [float(c.invoke("tiny", body).outputs["total"]) for _ in range(20)]
            embedded = rt.invoke("tiny", body, timeout=60)  # from this thread, replies handled by the server's
        after = rt.invoke("tiny", body, timeout=60)
        assert loop._thread.name == "gfaas-invoker" and loop._thread.is_alive()
    assert driver == (f"gfaas-gateway-{gw.port}" if on_loop else "gfaas-invoker")
    assert set(polled) == ({f"gfaas-gateway-{gw.port}"} if on_loop else set()) and len(polled) >= 20 * on_loop
    assert over_http == [expected_total(256)] * 20
    assert embedded.ok and after.ok
