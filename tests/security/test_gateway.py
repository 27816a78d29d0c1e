"""Issue 14, rows 4, 5, 12, 13 and 15, replayed against a real gateway in front of the real local runtime:
an open, unauthenticated deploy of any importable handler; uncapped specs, functions and workflows and
no undeploy; a YAML alias bomb, oversize and slow bodies, 1,000 slow clients and a log flood; deep
nesting and long chains; and an OpenAPI schema that disagreed with what the gateway accepts."""

from __future__ import annotations

import logging
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from gfaas import GatewayClient, NotFound
from gfaas.errors import ConfigError
from gfaas.runtime.gateway import GatewayLimits, create_app, serve
from gfaas.runtime.local import LocalRuntime, RuntimeConfig
from gfaas.runtime.wire import encode_array

SUPPORT = str(Path(__file__).resolve().parents[1] / "support")
TOKEN = "security-test-token-0123456789abcdef"
AUTH = {"authorization": f"Bearer {TOKEN}"}
LIMITS = GatewayLimits(handler_packages=("rt_handlers",), max_spec_bytes=4096, max_functions=4, max_workflows=3,
                       body_timeout_s=1.0, header_timeout_s=1.0)
YAML = {"content-type": "application/yaml", **AUTH}


def chain(name: str, n: int, handler: str = "rt_handlers:negate") -> str:
    fns = "".join(f"  - {{name: f{k}, kind: cpu, handler: '{handler}', inputs: {{x: {'input.x' if k == 0 else f'f{k - 1}.y'}}},"
                  f" outputs: {{y: null}}}}\n" for k in range(n))
    return f"name: {name}\ninputs: {{x: null}}\noutputs: {{o: f{n - 1}.y}}\nfunctions:\n{fns}"


def worker_pids() -> set[int]:
    """This process's live workers: children started afresh (gfaas.runtime.worker_main) and the
    children of its worker template (gfaas.runtime.forkserver), whose command line they share."""
    procs: dict[int, tuple[int, bytes]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z":
            procs[int(d.name)] = (int(fields[1]), cmd)
    me = os.getpid()
    templates = {p for p, (pp, cmd) in procs.items() if pp == me and b"gfaas.runtime.forkserver" in cmd}
    return {p for p, (pp, cmd) in procs.items()
            if (pp == me and b"gfaas.runtime.worker_main" in cmd) or pp in templates}


@pytest.fixture(scope="module")
def gateway() -> Iterator[tuple[LocalRuntime, Any]]:
    """One real runtime (worker processes) behind one real gateway on a free loopback port."""
    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(SUPPORT)
    mp.setenv("PYTHONPATH", SUPPORT)
    rt = LocalRuntime(RuntimeConfig(node_capacity_bytes=64 << 20))
    try:
        with serve(rt, token=TOKEN, limits=LIMITS, max_body_bytes=1 << 20, access_log=False) as gw:
            with GatewayClient(gw.url, token=TOKEN) as c:
                c.deploy(chain("steady", 1))
            yield rt, gw
    finally:
        rt.close()
        mp.undo()


def steady_still_serves(gw: Any) -> None:
    with GatewayClient(gw.url, token=TOKEN) as c:
        res = c.invoke("steady", {"x": np.array([1.5, -2.0])})
    assert res.ok and res.outputs["o"].tolist() == [-1.5, 2.0]


# ---------------------------------------------------------------- row 4: authentication, handlers, bind address


def test_row4_deploy_and_invoke_need_the_token(gateway: tuple[LocalRuntime, Any]) -> None:
    """No token or a wrong one is a 401 that says what to send; nothing is deployed; health stays open."""
    _, gw = gateway
    spec = chain("intruder", 1)
    for headers, words in (({}, "Authorization: Bearer TOKEN"), ({"authorization": "Bearer nope"}, "not this gateway's"),
                           ({"authorization": f"Basic {TOKEN}"}, "not this gateway's")):
        r = httpx.post(gw.url + "/v1/workflows", content=spec, headers={"content-type": "application/yaml", **headers})
        assert r.status_code == 401 and r.json()["error"] == "unauthorized" and words in r.json()["message"]
        assert r.headers["www-authenticate"].startswith("Bearer")
        r = httpx.post(gw.url + "/v1/workflows/steady/invocations", json={"seed": 1}, headers=headers)
        assert r.status_code == 401
    assert httpx.get(gw.url + "/metrics").status_code == 401
    assert httpx.get(gw.url + "/v1/workflows").status_code == 401
    assert httpx.get(gw.url + "/healthz").json() == {"status": "ok"}
    assert httpx.get(gw.url + "/openapi.json").status_code == 200
    assert httpx.get(gw.url + "/v1/workflows", headers=AUTH).json() == {"workflows": ["steady"]}


@pytest.mark.parametrize("handler, words", [
    ("os:system", "handler 'os:system' is not in an allowed package"),
    ("this:s", "handler 'this:s' is not in an allowed package"),
    ("rt_handlersx:double", "not in an allowed package"),
    ("rt_handlers:__builtins__", "no dunder attributes"),
    ("rt_handlers:np", "is not callable"),
])
def test_row4_handlers_only_from_allowed_packages(gateway: tuple[LocalRuntime, Any], handler: str, words: str) -> None:
    """A handler outside handler_packages is a 400 naming it and the knob, and its module is never imported."""
    _, gw = gateway
    had_this = "this" in sys.modules
    r = httpx.post(gw.url + "/v1/workflows", content=chain("evil", 1, handler), headers=YAML)
    assert r.status_code == 400 and words in r.json()["message"], r.text
    if "allowed package" in words:
        assert "handler_packages" in r.json()["message"] and "['rt_handlers']" in r.json()["message"]
    assert ("this" in sys.modules) == had_this  # `import this` prints the Zen: it must not have run
    assert httpx.get(gw.url + "/v1/workflows", headers=AUTH).json() == {"workflows": ["steady"]}


def test_row4_no_token_on_a_public_address_is_refused(gateway: tuple[LocalRuntime, Any]) -> None:
    """serve refuses 0.0.0.0 without authentication; with a token it starts and reports the real bind address."""
    rt, _ = gateway
    with pytest.raises(ConfigError, match="refusing to serve on 0.0.0.0 without authentication"):
        serve(rt, host="0.0.0.0", authenticate=False)
    with serve(rt, host="0.0.0.0", token=TOKEN, access_log=False) as gw:
        assert gw.bind == f"0.0.0.0:{gw.port}" and gw.url == f"http://127.0.0.1:{gw.port}"
        assert httpx.get(gw.url + "/v1/workflows").status_code == 401
    with serve(rt, authenticate=False, access_log=False) as gw:  # loopback without a token: a developer's choice
        assert gw.token is None and httpx.get(gw.url + "/v1/workflows").status_code == 200


def test_row4_gfaas_serve_prints_the_real_address_and_keeps_its_token_0600(tmp_path: Path) -> None:
    """`gfaas serve --host 0.0.0.0` says 0.0.0.0 and where the token is; the file is 0600 and works."""
    state = tmp_path / "gw"
    env = {**os.environ, "GFAAS_RUN_DIR": str(tmp_path)}
    p = subprocess.Popen([sys.executable, "-m", "gfaas", "serve", "--host", "0.0.0.0", "--port", "0", "--workflows",
                          "none", "--state-dir", str(state)], env=env, stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        deadline = time.monotonic() + 60
        while "listening" not in line and time.monotonic() < deadline:
            line = p.stderr.readline() if p.stderr else ""
            assert line or p.poll() is None, "gfaas serve exited"
        assert "gfaas gateway listening on 0.0.0.0:" in line and f"bearer token in {state}/gateway.token" in line
        token_file = state / "gateway.token"
        assert token_file.stat().st_mode & 0o777 == 0o600 and state.stat().st_mode & 0o777 == 0o700
        url = line.split("from this machine: ")[1].split(")")[0]
        assert httpx.get(url + "/v1/workflows").status_code == 401
        with GatewayClient(url, token_file=token_file) as c:
            assert c.workflows() == []
    finally:
        p.send_signal(signal.SIGINT)
        p.wait(30)


def test_row4_token_files_of_others_or_symlinks_are_refused(tmp_path: Path) -> None:
    """A token file open to others, or a symlink planted where it is made, is refused, never followed."""
    from gfaas.runtime.gateway import load_or_create_token, read_token_file

    loose = tmp_path / "loose"
    loose.write_text("x" * 32)
    loose.chmod(0o644)
    with pytest.raises(ConfigError, match=rf"gateway token file {loose} has mode 0644: group or others may read or change it; run chmod 600"):
        read_token_file(loose)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "gateway.token").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match=r"gateway token file .*gateway.token is a symlink \(to .*elsewhere'\); it is never followed"):
        load_or_create_token(state)
    assert not (tmp_path / "elsewhere").exists()
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o755)  # no one else may even enter it (stricter than the data plane's 0o022)
    with pytest.raises(ConfigError, match=rf"gateway state directory {open_dir} has mode 0755, open to group or"
                                          rf" others; run chmod 700 {open_dir}, or pick a directory of your own"):
        load_or_create_token(open_dir)


# ---------------------------------------------------------------- row 5: caps and undeploy


def test_row5_eight_functions_over_the_cap_start_no_worker(gateway: tuple[LocalRuntime, Any]) -> None:
    """The 860-byte spec with 8 functions is a 400 naming max_functions; no worker process starts."""
    _, gw = gateway
    before = worker_pids()
    r = httpx.post(gw.url + "/v1/workflows", content=chain("eight", 8), headers=YAML)
    assert r.status_code == 400 and "8 functions, more than this gateway's max_functions=4" in r.json()["message"]
    assert worker_pids() == before


def test_row5_spec_size_is_capped_before_reading(gateway: tuple[LocalRuntime, Any]) -> None:
    """A spec over max_spec_bytes is a 413 naming the knob, declared or streamed."""
    _, gw = gateway
    big = chain("big", 1) + "#" * 5000 + "\n"
    r = httpx.post(gw.url + "/v1/workflows", content=big, headers=YAML)
    assert r.status_code == 413 and "max_spec_bytes" in r.json()["message"] and "4096 bytes" in r.json()["message"]
    r = httpx.post(gw.url + "/v1/workflows", content=iter([big.encode()[:3000], big.encode()[3000:]]), headers=YAML)
    assert r.status_code == 413 and "max_spec_bytes" in r.json()["message"]


def test_row5_workflow_cap_then_undeploy_stops_the_workers(gateway: tuple[LocalRuntime, Any]) -> None:
    """Past max_workflows a deploy is a 409; DELETE stops the workflow's workers (their pids are gone),
    frees the slot, and leaves the other workflows serving."""
    rt, gw = gateway
    before = worker_pids()
    with GatewayClient(gw.url, token=TOKEN) as c:
        c.deploy(chain("two", 2))
        c.deploy(chain("three", 1))
        started = worker_pids() - before
        assert len(started) == 3
        r = httpx.post(gw.url + "/v1/workflows", content=chain("four", 1), headers=YAML)
        assert r.status_code == 409 and r.json()["error"] == "too_many_workflows"
        assert "max_workflows=3" in r.json()["message"] and "DELETE /v1/workflows/NAME" in r.json()["message"]
        assert c.invoke("two", {"x": np.array([1.0])}).outputs["o"].tolist() == [1.0]
        r = httpx.delete(gw.url + "/v1/workflows/two", headers=AUTH)
        assert (r.status_code, r.json()) == (200, {"workflow": "two", "status": "undeployed"})
        c.undeploy("three")
        deadline = time.monotonic() + 10
        while worker_pids() & started and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not worker_pids() & started
        with pytest.raises(NotFound, match="no workflow 'two'"):
            c.invoke("two", {"x": np.array([1.0])})
        with pytest.raises(NotFound):
            c.undeploy("two")
        assert c.workflows() == ["steady"]
        c.deploy(chain("two", 1))  # the name and the slot are free again
        c.undeploy("two")
    assert rt.workflows() == ["steady"]
    steady_still_serves(gw)


# ---------------------------------------------------------------- row 12: alias bomb, bodies, slow clients, logs

ALIAS_BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))


def test_row12_yaml_alias_bomb_is_refused_without_expanding(gateway: tuple[LocalRuntime, Any]) -> None:
    """The alias bomb is a 400 naming anchors and aliases, and the process's peak memory does not grow."""
    _, gw = gateway
    assert len(ALIAS_BOMB) < 600
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = httpx.post(gw.url + "/v1/workflows", content=ALIAS_BOMB, headers=YAML)
    assert r.status_code == 400 and "anchors and aliases are not accepted" in r.json()["message"]
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 32 * 1024  # KiB
    steady_still_serves(gw)


def test_row12_oversize_invocation_body_is_refused_before_reading(gateway: tuple[LocalRuntime, Any]) -> None:
    """A 64 MiB body declared in Content-Length is a 413 answered before the body is sent."""
    _, gw = gateway
    with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as s:
        s.sendall(f"POST /v1/workflows/steady/invocations HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {64 << 20}\r\n\r\n".encode())
        answer = b""
        while chunk := s.recv(4096):  # the answer comes at once, and the server closes the connection
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413") and b"max_body_bytes" in answer


def test_row12_a_slow_body_is_cut_off(gateway: tuple[LocalRuntime, Any]) -> None:
    """A body that does not arrive within body_timeout_s is a 408 and the connection closes."""
    _, gw = gateway
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
        s.sendall(f"POST /v1/workflows/steady/invocations HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                  "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"seed\"".encode())
        t0 = time.monotonic()
        answer = b""
        while chunk := s.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408") and b"body_timeout_s" in answer
    assert 0.9 <= time.monotonic() - t0 < 5


def test_row12_a_thousand_slow_clients_do_not_stop_the_gateway(gateway: tuple[LocalRuntime, Any]) -> None:
    """1,000 connections that trickle headers: invocations are still answered at once, and each slow
    connection is closed by the server after header_timeout_s."""
    _, gw = gateway
    slow = []
    try:
        for _ in range(1000):
            s = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
            s.sendall(b"POST /v1/workflows HTTP/1.1\r\nHost: x\r\n")
            slow.append(s)
        t0 = time.monotonic()
        steady_still_serves(gw)
        assert httpx.get(gw.url + "/healthz").status_code == 200
        assert time.monotonic() - t0 < 2.0
        time.sleep(LIMITS.header_timeout_s + 0.5)
        closed = sum(s.recv(1) == b"" for s in slow)
        assert closed == 1000
    finally:
        for s in slow:
            s.close()
    steady_still_serves(gw)


def test_row12_a_header_block_over_16_kib_is_refused_and_the_connection_closed(gateway: tuple[LocalRuntime, Any]) -> None:
    """Whichever HTTP parser serves (httptools, which sets no bound itself, or h11), a client cannot
    make the gateway buffer an endless header block: past 16 KiB it gets a 4xx and the connection
    closes; a large body after normal headers is still read (it is not a header)."""
    _, gw = gateway
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * (20 * 1024) + b"\r\n")
        got = b""
        while chunk := s.recv(4096):
            got += chunk
    assert got.split(b" ")[1] in (b"400", b"431"), got[:80]
    big = np.ones(50_000)  # a 400 KB input (540 KB as base64): well past the header bound, in the body
    with GatewayClient(gw.url, token=TOKEN) as c:
        res = c.invoke("steady", {"x": big})
    assert res.ok and res.outputs["o"].shape == big.shape


def test_row12_a_flood_of_bad_requests_does_not_flood_the_log(gateway: tuple[LocalRuntime, Any],
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """2,000 malformed requests each get a 400, but uvicorn's warning about them is logged at a bounded rate."""
    _, gw = gateway
    caplog.set_level(logging.WARNING, logger="uvicorn.error")
    t0 = time.monotonic()
    answered = 0

    def flood(n: int) -> None:
        nonlocal answered
        for _ in range(n):
            with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as s:
                s.sendall(b"\x16\x03\x01 garbage that is not HTTP\r\n\r\n")
                if s.recv(64).startswith(b"HTTP/1.1 400"):
                    answered += 1

    threads = [threading.Thread(target=flood, args=(250,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    elapsed = time.monotonic() - t0
    records = [r for r in caplog.records if r.name == "uvicorn.error" and "Invalid HTTP request" in r.getMessage()]
    assert answered == 2000
    assert len(records) <= 20 + elapsed + 1, (len(records), elapsed)
    steady_still_serves(gw)


# ---------------------------------------------------------------- row 13: deep nesting and long chains


@pytest.mark.parametrize("text", ["[" * 20000 + "]" * 20000, "a:\n" + "".join(" " * k + "- \n" for k in range(300)),
                                  '{"name":' * 5000 + "1" + "}" * 5000])
def test_row13_deep_nesting_is_400_not_500(gateway: tuple[LocalRuntime, Any], text: str) -> None:
    """YAML or JSON nested far deeper than a spec needs is a 400 naming the bound, and the gateway serves on."""
    rt, gw = gateway
    app = create_app(rt, token=TOKEN, limits=GatewayLimits(handler_packages=("rt_handlers",)))
    with TestClient(app, headers=AUTH) as c:
        r = c.post("/v1/workflows", content=text, headers={"content-type": "application/yaml"})
    assert r.status_code == 400 and "nesting deeper than 32 levels" in r.json()["message"], r.text[:300]


def test_row13_a_1500_function_chain_is_400_not_500(gateway: tuple[LocalRuntime, Any]) -> None:
    """Over the gateway's cap it is refused by count; under a cap that lets it through, the (iterative)
    validation reaches the real error at the end of the chain instead of a RecursionError."""
    rt, gw = gateway
    r = httpx.post(gw.url + "/v1/workflows", content=chain("long", 1500), headers=YAML)
    assert r.status_code == 413 and "max_spec_bytes" in r.json()["message"]  # 128 KiB: the first cap it meets
    roomy = GatewayLimits(handler_packages=("rt_handlers",), max_spec_bytes=1 << 20)
    with TestClient(create_app(rt, token=TOKEN, limits=roomy), headers=AUTH) as c:
        r = c.post("/v1/workflows", content=chain("long", 1500), headers={"content-type": "application/yaml"})
    assert r.status_code == 400 and "1500 functions, more than this gateway's max_functions=64" in r.json()["message"]
    spec = chain("long", 1500) + "  - {name: orphan, kind: cpu, handler: 'rt_handlers:negate', inputs: {x: f0.y}, " \
                                  "outputs: {y: null}}\n"
    app = create_app(rt, token=TOKEN, limits=GatewayLimits(handler_packages=("rt_handlers",), max_functions=2000,
                                                             max_spec_bytes=1 << 20))
    with TestClient(app, headers=AUTH) as c:
        r = c.post("/v1/workflows", content=spec, headers={"content-type": "application/yaml"})
    assert r.status_code == 400 and "nothing reads the outputs of function 'orphan'" in r.json()["message"]
    assert rt.workflows() == ["steady"]


# ---------------------------------------------------------------- row 15: the schema states what is accepted


def test_row15_schema_and_gateway_agree_on_the_reported_cases(gateway: tuple[LocalRuntime, Any]) -> None:
    """`inputs` with `seed` and an empty spec are schema-invalid (and 422); a 405's Allow names every method."""
    import jsonschema

    rt, gw = gateway
    schema = httpx.get(gw.url + "/openapi.json").json()
    body = schema["paths"]["/v1/workflows/{name}/invocations"]["post"]["requestBody"]["content"]["application/json"]
    validator = jsonschema.Draft202012Validator({**body["schema"], "components": schema["components"]})
    x = {"dtype": "float64", "shape": [1], "data_b64": "AAAAAAAA8D8="}
    both = {"inputs": {"x": x}, "seed": 1}
    assert not validator.is_valid(both) and validator.is_valid({"seed": 1}) and validator.is_valid({"inputs": {"x": x}})
    r = httpx.post(gw.url + "/v1/workflows/steady/invocations", json=both, headers=AUTH)
    assert r.status_code == 422 and "not both" in r.json()["message"]
    spec_schema = schema["paths"]["/v1/workflows"]["post"]["requestBody"]["content"]["application/yaml"]["schema"]
    assert spec_schema["minLength"] == 1 and spec_schema["pattern"] == r"\S"
    r = httpx.post(gw.url + "/v1/workflows", content=" \n", headers=YAML)
    assert r.status_code == 422 and r.json()["error"] == "invalid_request"
    r = httpx.put(gw.url + "/v1/workflows", headers=AUTH)
    assert r.status_code == 405 and r.headers["allow"] == "GET, POST"
    r = httpx.patch(gw.url + "/v1/workflows/steady", headers=AUTH)
    assert r.status_code == 405 and r.headers["allow"] == "GET, DELETE"


def test_row15_schema_driven_fuzzing_finds_no_5xx_and_no_valid_request_refused(
        gateway: tuple[LocalRuntime, Any]) -> None:
    """Schemathesis generates schema-valid requests for every operation of the gateway's own schema: none
    is answered 5xx or 422 (does not match the schema), and every answer conforms to the schema."""
    schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is in the dev extra")
    from hypothesis import HealthCheck, Phase, given, settings
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    rt, _ = gateway
    # a second app on the same runtime, driven in-process; "steady" is there for it to find
    app = create_app(rt, token=TOKEN, limits=LIMITS, max_timeout_s=2.0, default_timeout_s=1.0)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    statuses: dict[str, set[int]] = {}
    checks = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
    for result in schema.get_all_operations():
        op = result.ok()
        if op.method.upper() == "DELETE":
            continue  # would undeploy the fixture's workflow by luck only; undeploy is tested above
        if op.path == "/v1/dashboard/stream":
            continue  # unending by design (server-sent events); tests/integration/test_dashboard_api.py reads it

        @given(case=op.as_strategy())
        @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), phases=[Phase.generate],
                  database=None)
        def fuzz(case: Any) -> None:
            r = case.call(headers=AUTH)
            statuses.setdefault(case.operation.label, set()).add(r.status_code)
            assert r.status_code != 422, (case.as_curl_command(), r.text[:500])
            case.validate_response(r, checks=checks)

        fuzz()
    assert len(statuses) == 18 and all(max(s) < 500 for s in statuses.values()), statuses
    assert rt.workflows() == ["steady"]


@pytest.mark.parametrize("auth, status", [({}, 401), ({"authorization": "Bearer not-the-token"}, 401),
                                          (AUTH, 413)])
def test_a_request_refused_on_its_headers_gets_its_answer_not_a_reset(gateway: tuple[LocalRuntime, Any],
                                                                      auth: dict[str, str], status: int) -> None:
    """Issue 37 row 10: a large invocation body without the token (or over the 1 MiB limit with it) is
    refused on its headers, and the client, still sending, must read the 401 or 413 with its reason,
    not a reset. A 413 closes the connection, so the gateway reads and drops the body first (up to
    64 MiB, 5 s). The review saw resets with a 6 MB body; on this machine's loopback the answer got
    through before that change too (this test passes on both): it pins the behaviour at 40 MB."""
    _, gw = gateway
    body = b'{"inputs": {"x": "' + b"A" * (40 << 20) + b'"}}'
    with httpx.Client(timeout=30) as c:
        r = c.post(f"{gw.url}/v1/workflows/steady/invocations", content=body,
                   headers={"content-type": "application/json", **auth})
    assert r.status_code == status, r.text
    assert r.json()["error"] == {401: "unauthorized", 413: "payload_too_large"}[status]
    steady_still_serves(gw)


def test_connections_that_never_authenticate_cannot_lock_out_clients_with_the_token(
        gateway: tuple[LocalRuntime, Any]) -> None:
    """Issue 37 row 6: past the connection cap the newest connection was closed, so 2,100 connections
    that never authenticated kept every client with the token out. Here, with a cap of 32, 40 strangers
    each get a 401 and keep their connection open; then 10 invocations with the token, each on a new
    connection, are all answered (before: refused at accept), and the strangers' connections are what
    is closed to make room."""
    rt, _ = gateway
    limits = GatewayLimits(handler_packages=("rt_handlers",), max_connections=32, header_timeout_s=30.0)
    with serve(rt, token=TOKEN, limits=limits, access_log=False) as gw:
        host, port = gw.url.removeprefix("http://").rsplit(":", 1)
        strangers = []
        for _ in range(40):
            s = socket.create_connection((host, int(port)))
            s.sendall(b"GET /v1/workflows HTTP/1.1\r\nhost: x\r\n\r\n")
            strangers.append(s)
        answered = 0
        for s in strangers:
            s.settimeout(5)
            try:
                answered += s.recv(4096).startswith(b"HTTP/1.1 401")
            except OSError:
                pass
        assert answered >= 30  # the first 32 are answered; later ones may already push older ones out
        ok = 0
        for k in range(10):
            with httpx.Client(timeout=30) as c:  # a new connection each time
                r = c.post(f"{gw.url}/v1/workflows/steady/invocations", json={"inputs": {"x": encode_array(np.array([float(k)]))}},
                           headers=AUTH)
            ok += r.status_code == 200
        assert ok == 10
        closed = 0
        for s in strangers:
            s.settimeout(0.5)
            try:
                closed += s.recv(1) == b""
            except OSError:
                closed += 1
            s.close()
        assert closed >= 10


def test_a_413_reads_the_refused_body_before_it_answers() -> None:
    """Row 10 where it can be seen on any machine: the order of the ASGI events. A request over the
    body limit is refused with 413 and ``connection: close``; the guard takes every body message the
    client sends before it starts the answer (before the change: none), so the server closes a socket
    with nothing unread. A refusal on a kept-alive connection (401) reads nothing: the server does."""
    import asyncio

    from gfaas.runtime.gateway.guard import Guard

    async def app(scope: Any, receive: Any, send: Any) -> None:  # never reached: refused on headers
        raise AssertionError("the app was called")

    def events(headers: list[tuple[bytes, bytes]]) -> list[str]:
        guard = Guard(app, max_body_bytes=1 << 20, limits=GatewayLimits(), token=TOKEN)
        chunks = [{"type": "http.request", "body": b"x" * (1 << 20), "more_body": k < 3} for k in range(4)]
        log: list[str] = []

        async def receive() -> dict[str, Any]:
            log.append("body")
            return chunks.pop(0) if chunks else {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            log.append(message["type"])

        scope = {"type": "http", "method": "POST", "path": "/v1/workflows/w/invocations", "root_path": "",
                 "headers": headers, "query_string": b"", "client": ("127.0.0.1", 5)}
        asyncio.run(guard(scope, receive, send))
        return log

    auth = [(b"authorization", f"Bearer {TOKEN}".encode())]
    over = events([(b"content-length", str(4 << 20).encode()), *auth])
    assert over == ["body"] * 4 + ["http.response.start", "http.response.body"]
    unauth = events([(b"content-length", str(4 << 20).encode())])
    assert unauth == ["http.response.start", "http.response.body"]
