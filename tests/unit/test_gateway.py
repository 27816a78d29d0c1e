"""The HTTP gateway against a fake runtime: every endpoint, every error path, the wire encoding, the
metrics (parsed and counted exactly) and a real server with concurrent clients."""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import logging
import math
import os
import re
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, get_args

import httpx
import numpy as np
import pytest
import yaml
from fastapi import FastAPI
from fastapi.testclient import TestClient

from gfaas.errors import ConfigError, NotFound, Overloaded, SpecError
from gfaas.runtime.api import RuntimeAPI
from gfaas.runtime.client_http import GatewayClient, InvocationTimeout
from gfaas.runtime.gateway import DType, create_app, serve
from gfaas.runtime.metrics import Registry
from gfaas.runtime.result import Breakdown, FunctionRecord, InvocationResult
from gfaas.runtime.wire import DTYPES, WireError, decode_array, encode_array, jsonable, result_from_document

BREAKDOWN = Breakdown(queue_s=0.5, host_pass_s=0.25, fn_pass_s=0.125, compute_s=2.0, total_s=3.0)
SPEC = "name: double\ninputs: [x]\n"
TOKEN = "unit-test-token-0123456789abcdef"
AUTH = {"authorization": f"Bearer {TOKEN}"}


# ---------------------------------------------------------------- the fake runtime


class _Inv:
    def __init__(self, inv_id: str, workflow: str, x: np.ndarray, kind: str, transport: str | None) -> None:
        self.id, self.workflow, self.x, self.kind, self.transport = inv_id, workflow, x, kind, transport
        self.done = threading.Event()
        self.result: InvocationResult | None = None


class FakeRuntime:
    """Deterministic stand-in for the runtime.

    A spec is YAML ``{name, inputs: [names], kind: double|fail|hold, dtype: optional}``. ``double``
    finishes at submit with ``y = 2 * x`` (of the first input) and scalars ``n`` (size) and ``top`` (max, NaN
    when empty); ``fail`` finishes failed; ``hold`` stays running until :meth:`release`. ``overloaded``
    refuses submits, ``bug`` names a method that raises ``RuntimeError`` (a runtime bug).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.specs: dict[str, dict[str, Any]] = {}
        self.invs: dict[str, _Inv] = {}
        self.ids = itertools.count()
        self.overloaded = False
        self.bug = ""
        self.depths: dict[str, int] = {}
        self.submits = 0
        self.asked: list[str] = []  # invocation IDs passed to status() and result()
        self.waiting = threading.Event()  # set when result() is about to wait

    def _maybe_bug(self, method: str) -> None:
        if self.bug == method:
            raise RuntimeError(f"fake runtime bug in {method}")

    def deploy(self, spec_text: str, code: bytes | None = None) -> str:
        self._maybe_bug("deploy")
        self.code = code
        try:
            spec = yaml.safe_load(spec_text)
        except yaml.YAMLError as exc:
            raise SpecError(f"spec is not YAML: {exc}") from None
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or \
                not isinstance(spec.get("inputs"), list):
            raise SpecError("spec: needs `name` (a string) and `inputs` (a list of names)")
        spec.setdefault("kind", "double")
        with self.lock:
            if spec["name"] in self.specs:
                raise SpecError(f"workflow {spec['name']!r} is already deployed; pick another name")
            self.specs[spec["name"]] = spec
        return str(spec["name"])

    def undeploy(self, workflow: str) -> None:
        with self.lock:
            if self.specs.pop(workflow, None) is None:
                raise NotFound(f"no workflow {workflow!r} is deployed")

    def versions(self, workflow: str) -> list[dict[str, Any]]:
        with self.lock:
            if workflow not in self.specs:
                raise NotFound(f"no workflow {workflow!r} is deployed")
        return [{"version": 1, "current": True, "created": 0.0, "note": "", "code": None}]

    def rollback(self, workflow: str, version: int) -> int:
        self.versions(workflow)
        if version != 1:
            raise NotFound(f"workflow {workflow!r} has no version {version}")
        return 1

    def workflows(self) -> list[str]:
        with self.lock:
            return sorted(self.specs)

    def describe(self, workflow: str) -> dict[str, Any]:
        self._maybe_bug("describe")
        with self.lock:
            spec = self.specs.get(workflow)
        if spec is None:
            raise NotFound(f"no workflow {workflow!r} is deployed")
        return {"name": spec["name"], "inputs": spec["inputs"], "kind": spec["kind"], "functions": ("f",)}

    def submit(self, workflow: str, inputs: Mapping[str, np.ndarray] | None = None, seed: int | None = None,
               transport: str | None = None, deadline_s: float | None = None) -> str:
        self._maybe_bug("submit")
        with self.lock:
            spec = self.specs.get(workflow)
        if spec is None:
            raise NotFound(f"no workflow {workflow!r} is deployed")
        if (inputs is None) == (seed is None):
            raise SpecError("give either inputs or a seed")
        if transport not in (None, "gfaas", "redis"):
            raise ConfigError(f"transport {transport!r} is not 'gfaas' or 'redis'")
        if inputs is None:
            inputs = {n: np.arange(int(seed or 0) % 5 + 1, dtype=np.float32) for n in spec["inputs"]}
        if sorted(inputs) != sorted(spec["inputs"]):
            raise SpecError(f"workflow {workflow!r} takes inputs {sorted(spec['inputs'])}; got {sorted(inputs)}")
        for n, a in inputs.items():
            if spec.get("dtype") and a.dtype != np.dtype(spec["dtype"]):
                raise SpecError(f"workflow {workflow!r} input {n!r}: dtype {a.dtype} where {spec['dtype']} is declared")
        if self.overloaded:
            raise Overloaded(f"the queue of {workflow}/f is full")
        x = inputs[spec["inputs"][0]] if spec["inputs"] else np.zeros(0, np.float32)
        with self.lock:
            inv = _Inv(f"inv-{next(self.ids):06d}", workflow, x, spec["kind"], transport)
            self.invs[inv.id] = inv
            self.submits += 1
        if inv.kind != "hold":
            self._finish(inv)
        return inv.id

    def _finish(self, inv: _Inv) -> None:
        x = inv.x
        if inv.kind == "objects":  # a runtime that returns what the wire cannot carry
            inv.result = InvocationResult(inv.id, inv.workflow, "done", outputs={"y": np.array([object()])})
        elif inv.kind == "fail":
            inv.result = InvocationResult(inv.id, inv.workflow, "failed", error="f: ValueError: boom",
                                          breakdown=BREAKDOWN, functions=(FunctionRecord("f", "w0"),))
        else:
            inv.result = InvocationResult(
                inv.id, inv.workflow, "done", outputs={"y": x * 2},
                scalars={"n": np.int64(x.size), "top": float(x.max()) if x.size else math.nan},
                breakdown=BREAKDOWN,
                functions=(FunctionRecord("f", "w0", 0.5, 0.125, 2.0, 0.25), FunctionRecord("g", skipped=True)))
        inv.done.set()

    def release(self) -> None:
        with self.lock:
            held = [i for i in self.invs.values() if not i.done.is_set()]
        for inv in held:
            self._finish(inv)

    def _inv(self, invocation_id: str) -> _Inv:
        with self.lock:
            self.asked.append(invocation_id)
            inv = self.invs.get(invocation_id)
        if inv is None:
            raise NotFound(f"no invocation {invocation_id!r} is known here")
        return inv

    def status(self, invocation_id: str) -> str:
        self._maybe_bug("status")
        inv = self._inv(invocation_id)
        return inv.result.status if inv.done.is_set() and inv.result else "running"

    def result(self, invocation_id: str, timeout: float | None = None) -> InvocationResult:
        self._maybe_bug("result")
        inv = self._inv(invocation_id)
        if timeout != 0:
            self.waiting.set()
        if not inv.done.wait(timeout):
            raise TimeoutError(f"invocation {invocation_id} still running")
        assert inv.result is not None
        return inv.result

    def logs(self, workflow: str, function: str | None = None, invocation: str | None = None,
             since: float | None = None, limit: int = 1000, after: int | None = None) -> list[dict[str, Any]]:
        return []

    def scaling_status(self, workflow: str) -> dict[str, Any]:
        self._maybe_bug("scaling_status")
        if workflow not in self.specs:
            raise NotFound(f"no workflow {workflow!r}")
        return {"workflow": workflow, "version": 1, "nodes": {},
                "functions": {"f": {"warm": 1, "idle": 1, "busy": 0, "starting": 0, "queued": 0}}}

    def queue_depths(self) -> dict[str, int]:
        self._maybe_bug("queue_depths")
        return dict(self.depths)


# ---------------------------------------------------------------- fixtures and helpers


@pytest.fixture
def rt() -> FakeRuntime:
    r = FakeRuntime()
    r.deploy(SPEC)
    r.deploy("name: failing\ninputs: [x]\nkind: fail\n")
    r.deploy("name: held\ninputs: [x]\nkind: hold\n")
    r.deploy("name: typed\ninputs: [x]\ndtype: float64\n")
    return r


@pytest.fixture
def app(rt: FakeRuntime) -> FastAPI:
    return create_app(rt, token=TOKEN, sweep_interval_s=3600)


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app, headers=AUTH) as c:
        yield c


def arr_doc(a: np.ndarray) -> dict[str, Any]:
    return {"dtype": a.dtype.name, "shape": list(a.shape), "data_b64": base64.b64encode(a.tobytes()).decode()}


def expected_doc(inv: str, workflow: str, x: np.ndarray) -> dict[str, Any]:
    return {
        "invocation_id": inv, "workflow": workflow, "status": "done", "error": None,
        "outputs": {"y": arr_doc(x * 2)},
        "scalars": {"n": int(x.size), "top": float(x.max()) if x.size else "NaN"},
        "breakdown": {"queue_s": 0.5, "host_pass_s": 0.25, "fn_pass_s": 0.125, "compute_s": 2.0, "total_s": 3.0},
        "functions": [
            {"function": "f", "worker": "w0", "queued_s": 0.5, "get_s": 0.125, "compute_s": 2.0, "put_s": 0.25,
             "skipped": False},
            {"function": "g", "worker": "", "queued_s": 0.0, "get_s": 0.0, "compute_s": 0.0, "put_s": 0.0,
             "skipped": True}],
    }


def invoke(client: Any, workflow: str, body: dict[str, Any], **params: Any) -> httpx.Response:
    r: httpx.Response = client.post(f"/v1/workflows/{workflow}/invocations", json=body, params=params)
    return r


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')


def parse_metrics(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """A strict little parser of the text exposition format: every line is a comment or a sample, every
    sample's family has a TYPE line before it, labels are well-formed."""
    assert text.endswith("\n")
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    types: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge", "histogram"), line
            assert name not in types, f"two TYPE lines for {name}"
            types[name] = kind
            continue
        m = _SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name, labels, value = m.groups()
        family = re.sub(r"_(bucket|sum|count)$", "", name) if re.sub(r"_(bucket|sum|count)$", "", name) in types \
            and types[re.sub(r"_(bucket|sum|count)$", "", name)] == "histogram" else name
        assert family in types, f"sample {name} without a TYPE line"
        pairs = []
        if labels:
            consumed = 0
            for lm in _LABEL.finditer(labels):
                assert lm.start() == consumed, f"bad labels {labels!r}"
                consumed = lm.end()
                pairs.append((lm.group(1), lm.group(2).replace('\\"', '"').replace("\\n", "\n")
                              .replace("\\\\", "\\")))
            assert consumed == len(labels), f"bad labels {labels!r}"
        key = (name, frozenset(pairs))
        assert key not in samples, f"duplicate series {line!r}"
        samples[key] = float(value.replace("+Inf", "inf").replace("-Inf", "-inf"))
    return samples


def metric(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


# ---------------------------------------------------------------- endpoints: success paths


def test_runtime_protocol_is_what_the_fake_implements(rt: FakeRuntime) -> None:
    assert isinstance(rt, RuntimeAPI)
    assert get_args(DType) == DTYPES


def test_healthz(client: TestClient) -> None:
    r = client.get("/healthz")
    assert (r.status_code, r.json()) == (200, {"status": "ok"})


@pytest.mark.parametrize("ctype, text", [
    ("application/yaml", "name: neu\ninputs: [a, b]\n"),
    ("text/yaml; charset=utf-8", "name: neu\ninputs: [a, b]\n"),
    ("text/plain", "name: neu\ninputs: [a, b]\n"),
    ("application/json", json.dumps({"name": "neu", "inputs": ["a", "b"]})),
])
def test_deploy_list_describe(client: TestClient, ctype: str, text: str) -> None:
    r = client.post("/v1/workflows", content=text, headers={"content-type": ctype})
    assert (r.status_code, r.json()) == (201, {"workflow": "neu"})
    assert r.headers["location"] == "/v1/workflows/neu"
    r = client.get("/v1/workflows")
    assert (r.status_code, r.json()) == (200, {"workflows": ["double", "failing", "held", "neu", "typed"]})
    r = client.get("/v1/workflows/neu")
    assert (r.status_code, r.json()) == (200, {"name": "neu", "inputs": ["a", "b"], "kind": "double",
                                               "functions": ["f"]})


def test_sync_invocation_with_inputs_gives_the_exact_document(client: TestClient, rt: FakeRuntime) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    r = invoke(client, "double", {"inputs": {"x": arr_doc(x)}})
    assert r.status_code == 200, r.text
    assert r.json() == expected_doc("inv-000000", "double", x)
    assert rt.invs["inv-000000"].transport is None


def test_sync_invocation_with_seed_and_transport(client: TestClient, rt: FakeRuntime) -> None:
    r = invoke(client, "double", {"seed": 3, "transport": "redis"}, mode="sync", timeout=5)
    assert r.status_code == 200, r.text
    assert r.json() == expected_doc("inv-000000", "double", np.arange(4, dtype=np.float32))
    assert rt.invs["inv-000000"].transport == "redis"


def test_seed_bound_is_exact_in_json(client: TestClient) -> None:
    """Seeds go up to 2^53 - 1, where every JSON number is an exact integer (a schema fuzzer sent the
    float 9.2e18, within 2^63 - 1 as a float, refused as an int above it); 2^53 is a 422."""
    assert invoke(client, "double", {"seed": 2**53 - 1}, mode="sync", timeout=5).status_code == 200
    for bad in (2**53, 9.223372036854776e18):
        assert invoke(client, "double", {"seed": bad}, mode="sync", timeout=5).status_code == 422


def test_outputs_digest_instead_of_data(client: TestClient) -> None:
    """?outputs=digest answers dtype, shape and the SHA-256 of the bytes data_b64 would carry, on the
    sync answer and on the result endpoint alike; anything but full/digest is a 422."""
    import base64
    import hashlib

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    full = invoke(client, "double", {"inputs": {"x": arr_doc(x)}}).json()["outputs"]["y"]
    want = {"dtype": "float32", "shape": [2, 3],
            "sha256": hashlib.sha256(base64.b64decode(full["data_b64"])).hexdigest()}
    r = invoke(client, "double", {"inputs": {"x": arr_doc(x)}}, outputs="digest")
    assert r.status_code == 200 and r.json()["outputs"] == {"y": want}
    inv = r.json()["invocation_id"]
    r = client.get(f"/v1/invocations/{inv}/result", params={"outputs": "digest"})
    assert r.json()["outputs"] == {"y": want} and r.json()["breakdown"]["total_s"] == 3.0
    r = client.get(f"/v1/invocations/{inv}/result", params={"outputs": "some"})
    assert r.status_code == 422 and "outputs" in r.text


def test_failed_invocation_is_200_with_status_failed(client: TestClient) -> None:
    r = invoke(client, "failing", {"seed": 1})
    assert r.status_code == 200
    doc = r.json()
    assert (doc["status"], doc["error"], doc["outputs"], doc["scalars"]) == ("failed", "f: ValueError: boom", {}, {})


def test_async_invocation_then_status_and_result(client: TestClient) -> None:
    r = invoke(client, "double", {"seed": 0}, mode="async")
    assert r.status_code == 202
    assert r.json() == {"invocation_id": "inv-000000", "status": "done",
                        "status_url": "/v1/invocations/inv-000000", "result_url": "/v1/invocations/inv-000000/result"}
    assert r.headers["location"] == "/v1/invocations/inv-000000"
    r = client.get("/v1/invocations/inv-000000")
    assert (r.status_code, r.json()) == (200, {"invocation_id": "inv-000000", "status": "done"})
    for _ in range(2):  # fetching twice gives the same document
        r = client.get("/v1/invocations/inv-000000/result")
        assert (r.status_code, r.json()) == (200, expected_doc("inv-000000", "double", np.arange(1, dtype=np.float32)))


def test_result_while_running_is_202_then_200(client: TestClient, rt: FakeRuntime) -> None:
    r = invoke(client, "held", {"seed": 0}, mode="async")
    assert r.status_code == 202 and r.json()["status"] == "running"
    inv = r.json()["invocation_id"]
    assert client.get(f"/v1/invocations/{inv}").json() == {"invocation_id": inv, "status": "running"}
    r = client.get(f"/v1/invocations/{inv}/result")
    assert (r.status_code, r.json()) == (202, {"invocation_id": inv, "status": "running",
                                               "status_url": f"/v1/invocations/{inv}",
                                               "result_url": f"/v1/invocations/{inv}/result"})
    r = client.get(f"/v1/invocations/{inv}/result", params={"wait": 0.01})
    assert r.status_code == 202
    rt.release()
    r = client.get(f"/v1/invocations/{inv}/result", params={"wait": 5})
    assert (r.status_code, r.json()) == (200, expected_doc(inv, "held", np.arange(1, dtype=np.float32)))


def test_result_wait_returns_as_soon_as_the_invocation_finishes(client: TestClient, rt: FakeRuntime) -> None:
    inv = invoke(client, "held", {"seed": 0}, mode="async").json()["invocation_id"]
    timer = threading.Timer(0.05, rt.release)
    timer.start()
    r = client.get(f"/v1/invocations/{inv}/result", params={"wait": 60})
    timer.join()
    assert r.status_code == 200 and r.json()["status"] == "done"


def test_sync_timeout_is_504_with_the_id_then_the_result_can_be_fetched(client: TestClient, rt: FakeRuntime) -> None:
    r = invoke(client, "held", {"seed": 0}, timeout=0.01)
    assert r.status_code == 504
    body = r.json()
    inv = body["invocation_id"]
    assert body == {"error": "timeout", "message": body["message"], "invocation_id": inv, "status": "running",
                    "status_url": f"/v1/invocations/{inv}", "result_url": f"/v1/invocations/{inv}/result"}
    assert inv in body["message"] and "poll" in body["message"]
    rt.release()
    r = client.get(body["result_url"])
    assert r.status_code == 200 and r.json()["status"] == "done"
    s = parse_metrics(client.get("/metrics").text)
    assert metric(s, "gfaas_invocations_total", workflow="held", status="done") == 1


def test_openapi_schema_has_typed_models(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    paths = doc["paths"]
    for p in ("/healthz", "/v1/workflows", "/v1/workflows/{name}", "/v1/workflows/{name}/invocations",
              "/v1/invocations/{invocation_id}", "/v1/invocations/{invocation_id}/result", "/metrics"):
        assert p in paths, p
    schemas = doc["components"]["schemas"]
    for s in ("InvocationRequest", "ArrayDoc", "ResultDocument", "InvocationAccepted", "ErrorBody", "BreakdownDoc"):
        assert s in schemas, s
    assert schemas["ArrayDoc"]["properties"]["dtype"]["enum"] == list(DTYPES)
    post = paths["/v1/workflows/{name}/invocations"]["post"]
    assert {"200", "202", "400", "404", "422", "429", "504"} <= set(post["responses"])
    assert "application/yaml" in paths["/v1/workflows"]["post"]["requestBody"]["content"]


# ---------------------------------------------------------------- error paths


def test_bad_specs_are_400_with_the_runtime_message(client: TestClient) -> None:
    """Text that is not YAML is refused by the gateway's screen; the rest of the checks are the runtime's."""
    r = client.post("/v1/workflows", content="name: [unclosed", headers={"content-type": "application/yaml"})
    assert r.status_code == 400 and r.json()["error"] == "bad_request"
    assert r.json()["message"].startswith("spec: not valid YAML/JSON")
    r = client.post("/v1/workflows", content="just a string", headers={"content-type": "text/plain"})
    assert r.status_code == 400 and "needs `name`" in r.json()["message"]
    r = client.post("/v1/workflows", content=SPEC, headers={"content-type": "application/yaml"})
    assert (r.status_code, r.json()) == (400, {"error": "bad_request", "message":
                                               "workflow 'double' is already deployed; pick another name"})
    r = client.post("/v1/workflows", content="  \n", headers={"content-type": "application/yaml"})
    assert r.status_code == 422 and r.json()["error"] == "invalid_request" and "empty" in r.json()["message"]
    r = client.post("/v1/workflows", content=b"name: \xff\xfe", headers={"content-type": "application/yaml"})
    assert r.status_code == 400 and "UTF-8" in r.json()["message"]
    r = client.post("/v1/workflows", content=SPEC, headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 415 and "application/yaml" in r.json()["message"]


@pytest.mark.parametrize("path", ["/v1/workflows/nope", "/v1/workflows/..%2F..%2Fetc"])
def test_unknown_workflow_is_404(client: TestClient, path: str) -> None:
    r = client.get(path)
    assert r.status_code == 404 and r.json()["error"] == "not_found"
    r = client.post(f"{path}/invocations", json={"seed": 1})
    assert r.status_code == 404 and r.json()["error"] == "not_found"


@pytest.mark.parametrize("inv, well_formed", [
    ("inv-999999", True), ("inv-000000x", True), ("a.b:c", True), ("..", False), ("x" * 129, False), ("a b", False), ("%00", False),
    ("ünïcode", False), ("inv-000000%2F..", False), ("'; DROP TABLE", False), ("a%0Ab", False)])
def test_unknown_and_forged_invocation_ids_are_404(client: TestClient, rt: FakeRuntime, inv: str,
                                                   well_formed: bool) -> None:
    invoke(client, "double", {"seed": 1})  # inv-000000 exists
    rt.asked.clear()
    for path in (f"/v1/invocations/{inv}", f"/v1/invocations/{inv}/result", f"/v1/invocations/{inv}/result?wait=1"):
        r = client.get(path)
        assert r.status_code == 404, (path, r.text)
        assert r.json()["error"] == "not_found"
    # IDs that cannot be one never reach the runtime; well-formed unknown ones are the runtime's NotFound
    assert bool(rt.asked) == well_formed, rt.asked


def test_unknown_route_and_method_have_json_errors(client: TestClient) -> None:
    r = client.get("/v2/nothing")
    assert r.status_code == 404 and r.json()["error"] == "not_found" and "/v2/nothing" in r.json()["message"]
    r = client.delete("/v1/workflows")
    assert r.status_code == 405 and r.json()["error"] == "method_not_allowed" and "allow" in r.headers


_X = arr_doc(np.arange(6, dtype=np.float32))


@pytest.mark.parametrize("body, status, field, words", [
    ({"inputs": {"x": {**_X, "dtype": "float128"}}}, 422, "inputs.x.dtype", "'float32'"),
    ({"inputs": {"x": {**_X, "dtype": "object"}}}, 422, "inputs.x.dtype", "'bool'"),
    ({"inputs": {"x": {**_X, "shape": [-6]}}}, 422, "inputs.x.shape.0", "greater than or equal to 0"),
    ({"inputs": {"x": {**_X, "shape": "6"}}}, 422, "inputs.x.shape", "list"),
    ({"inputs": {"x": {**_X, "shape": [6.5]}}}, 422, "inputs.x.shape.0", "integer"),
    ({"inputs": {"x": {**_X, "shape": [1] * 33}}}, 422, "inputs.x.shape", "at most 32"),
    ({"inputs": {"x": {"dtype": "float32", "shape": [6]}}}, 422, "inputs.x.data_b64", "required"),
    ({"inputs": {"x": {**_X, "extra": 1}}}, 422, "inputs.x.extra", "not permitted"),
    ({"inputs": {"x": [1, 2, 3]}}, 422, "inputs.x", "dictionary"),
    ({"inputs": {"x": {**_X, "data_b64": "not base64!"}}}, 400, "inputs.x.data_b64", "base64"),
    ({"inputs": {"x": {**_X, "data_b64": "AAAA\nAAAA"}}}, 400, "inputs.x.data_b64", "base64"),
    ({"inputs": {"x": {**_X, "shape": [2, 4]}}}, 400, "inputs.x", "needs 32 bytes but data_b64 decodes to 24"),
    ({"inputs": {"x": {**_X, "shape": [2**40, 2**40]}}}, 400, "inputs.x.shape", "2**48"),
    ({"inputs": {"x": {"dtype": "bool", "shape": [2], "data_b64": base64.b64encode(b"\x01\x07").decode()}}},
     400, "inputs.x.data_b64", "0 or 1"),
    ({"inputs": {"x": _X}, "seed": 3}, 422, "body", "exactly one of `inputs`"),
    ({}, 422, "body", "exactly one of `inputs`"),
    ({"seed": "3"}, 422, "seed", "integer"),
    ({"seed": -1}, 422, "seed", "greater than or equal to 0"),
    ({"seed": True}, 422, "seed", "integer"),
    ({"seed": 1, "sede": 2}, 422, "sede", "not permitted"),
    ({"inputs": {"y": _X}}, 400, None, "takes inputs ['x']; got ['y']"),
    ({"seed": 1, "transport": "carrier-pigeon"}, 422, "transport", "'gfaas' or 'redis'"),
    ({"seed": 1, "inputs": None}, 422, "inputs", "dictionary"),
])
def test_malformed_invocation_bodies(client: TestClient, rt: FakeRuntime, body: dict[str, Any], status: int,
                                     field: str | None, words: str) -> None:
    r = invoke(client, "double", body)
    assert r.status_code == status, r.text
    doc = r.json()
    assert doc["error"] == ("invalid_request" if status == 422 else "bad_request")
    assert words in doc["message"], doc["message"]
    if field is not None:
        assert field in doc["message"]
    if status == 422:
        assert field in [e["field"] for e in doc["errors"]]
        assert "Value error" not in doc["message"]
        assert '{"seed": INT}' in doc["message"]  # says what a good body looks like
    assert rt.submits == 0


def test_wrong_dtype_for_the_workflow_is_400(client: TestClient) -> None:
    r = invoke(client, "typed", {"inputs": {"x": _X}})
    assert r.status_code == 400 and "dtype float32 where float64 is declared" in r.json()["message"]
    r = invoke(client, "typed", {"inputs": {"x": arr_doc(np.ones(3))}})
    assert r.status_code == 200


@pytest.mark.parametrize("content, ctype, words", [
    (b'{"seed": 1', "application/json", "not valid JSON"),
    (b"", "application/json", "body"),
    (b'{"seed": 1}', "text/plain", "body"),
    (b"[1, 2]", "application/json", "body"),
])
def test_bodies_that_are_not_a_json_object_are_422(client: TestClient, content: bytes, ctype: str,
                                                   words: str) -> None:
    r = client.post("/v1/workflows/double/invocations", content=content, headers={"content-type": ctype})
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "invalid_request" and words in r.json()["message"]


@pytest.mark.parametrize("params", [{"mode": "later"}, {"timeout": -1}, {"timeout": 10_000}, {"timeout": "soon"}])
def test_bad_query_parameters_are_422(client: TestClient, params: dict[str, Any]) -> None:
    r = invoke(client, "double", {"seed": 1}, **params)
    assert r.status_code == 422 and r.json()["errors"][0]["field"].startswith("query."), r.text


def test_bad_wait_is_422(client: TestClient) -> None:
    inv = invoke(client, "double", {"seed": 1}).json()["invocation_id"]
    for wait in (-1, 601, "x"):
        r = client.get(f"/v1/invocations/{inv}/result", params={"wait": wait})
        assert r.status_code == 422 and r.json()["errors"][0]["field"] == "query.wait"


def test_oversize_bodies_are_413(rt: FakeRuntime) -> None:
    limit = 1000
    with TestClient(create_app(rt, token=TOKEN, max_body_bytes=limit), headers=AUTH) as c:
        big = {"inputs": {"x": arr_doc(np.zeros(300, np.float32))}}  # ~1.6 kB of JSON
        r = c.post("/v1/workflows/double/invocations", json=big)
        assert r.status_code == 413 and r.json()["error"] == "payload_too_large"
        assert str(limit) in r.json()["message"]

        def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is enforced while reading
            data = json.dumps(big).encode()
            for i in range(0, len(data), 100):
                yield data[i:i + 100]

        r = c.post("/v1/workflows/double/invocations", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"] == "payload_too_large"
        r = c.post("/v1/workflows", content=(lambda: (yield b"name: x\n" * 200))(),
                   headers={"content-type": "application/yaml"})
        assert r.status_code == 413
        assert rt.submits == 0 and "x" not in rt.specs
        small = {"inputs": {"x": arr_doc(np.zeros(10, np.float32))}}
        assert c.post("/v1/workflows/double/invocations", json=small).status_code == 200


def test_declared_oversize_bodies_are_refused_before_the_app_sees_them(rt: FakeRuntime) -> None:
    with TestClient(create_app(rt, token=TOKEN, max_body_bytes=100), headers=AUTH) as c:
        # the deploy endpoint would answer 415 for this content type; 413 shows it never ran
        r = c.post("/v1/workflows", content=b"x" * 101, headers={"content-type": "application/x-www-form-urlencoded"})
        assert r.status_code == 413
        r = c.post("/v1/workflows", content=b"x" * 100, headers={"content-type": "application/x-www-form-urlencoded"})
        assert r.status_code == 415
        r = c.post("/v1/workflows", content=b"x", headers={"content-type": "application/yaml", "content-length": "x1"})
        assert r.status_code == 400 and "Content-Length" in r.json()["message"]


def test_overloaded_is_429_with_retry_after(rt: FakeRuntime) -> None:
    rt.overloaded = True
    with TestClient(create_app(rt, token=TOKEN, retry_after_s=7), headers=AUTH) as c:
        r = invoke(c, "double", {"seed": 1})
        assert r.status_code == 429
        assert r.headers["retry-after"] == "7"
        assert r.json() == {"error": "overloaded", "message": "the queue of double/f is full", "retry_after_s": 7}
        s = parse_metrics(c.get("/metrics").text)
        assert metric(s, "gfaas_invocations_rejected_total", workflow="double", reason="overloaded") == 1
        rt.overloaded = False
        assert invoke(c, "double", {"seed": 1}).status_code == 200


@pytest.mark.parametrize("method", ["describe", "submit", "result", "status", "deploy"])
def test_runtime_bugs_are_500_logged_and_the_gateway_keeps_serving(
        client: TestClient, rt: FakeRuntime, caplog: pytest.LogCaptureFixture, method: str) -> None:
    inv = invoke(client, "double", {"seed": 1}).json()["invocation_id"]
    rt.bug = method
    with caplog.at_level(logging.ERROR, logger="gfaas.gateway"):
        r = {"describe": lambda: client.get("/v1/workflows/double"),
             "submit": lambda: invoke(client, "double", {"seed": 1}),
             "result": lambda: client.get(f"/v1/invocations/{inv}/result"),
             "status": lambda: client.get(f"/v1/invocations/{inv}"),
             "deploy": lambda: client.post("/v1/workflows", content="name: z\ninputs: []\n",
                                           headers={"content-type": "application/yaml"})}[method]()
    assert r.status_code == 500
    body = r.json()
    assert body["error"] == "internal" and "fake runtime bug" not in body["message"]  # no internals leak
    ref = re.search(r"reference ([0-9a-f]{8})", body["message"])
    assert ref, body
    logged = [rec for rec in caplog.records if rec.name == "gfaas.gateway" and ref.group(1) in rec.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None
    assert "fake runtime bug" in str(logged[0].exc_info[1])
    rt.bug = ""
    assert client.get("/healthz").status_code == 200
    assert client.get(f"/v1/invocations/{inv}/result").status_code == 200


def test_unencodable_outputs_are_500_not_400(client: TestClient, rt: FakeRuntime,
                                             caplog: pytest.LogCaptureFixture) -> None:
    rt.deploy("name: objects\ninputs: [x]\nkind: objects\n")
    with caplog.at_level(logging.ERROR, logger="gfaas.gateway"):
        r = invoke(client, "objects", {"seed": 1})
    assert r.status_code == 500 and r.json()["error"] == "internal"
    assert "cannot encode an array of dtype object" in r.json()["message"]
    assert any(rec.exc_info for rec in caplog.records if rec.name == "gfaas.gateway")
    assert client.get("/healthz").status_code == 200


def test_metrics_survive_a_failing_queue_depths(client: TestClient, rt: FakeRuntime,
                                                caplog: pytest.LogCaptureFixture) -> None:
    rt.bug = "queue_depths"
    with caplog.at_level(logging.ERROR, logger="gfaas.gateway"):
        r = client.get("/metrics")
    assert r.status_code == 200
    assert "gfaas_queue_depth{" not in r.text and "# TYPE gfaas_queue_depth gauge" in r.text
    assert any("queue_depths" in rec.getMessage() for rec in caplog.records)


# ---------------------------------------------------------------- the wire encoding


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (5,), (2, 3), (2, 0, 3), (1, 1, 1, 4)])
def test_array_round_trip(dtype: str, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(7)
    a = (rng.standard_normal(shape) * 100).astype(dtype) if dtype != "bool" else rng.random(shape) > 0.5
    if dtype.startswith("complex"):
        a = a + 1j * a[::-1] if a.ndim else a + 1j
    doc = encode_array(a)
    assert doc["dtype"] == dtype and doc["shape"] == list(shape)
    assert json.loads(json.dumps(doc)) == doc
    b = decode_array(json.loads(json.dumps(doc)))
    assert b.dtype == np.dtype(dtype) and b.shape == shape
    np.testing.assert_array_equal(a, b)
    assert not b.flags.writeable


def test_array_round_trip_through_the_gateway(client: TestClient) -> None:
    for a in (np.float32(2.5), np.zeros((0, 3), np.int16), np.arange(24, dtype=np.int64).reshape(2, 3, 4).T,
              np.array([1, -2], dtype=">i4"), np.linspace(0, 1, 7, dtype=np.float16)):
        r = invoke(client, "double", {"inputs": {"x": encode_array(a)}})
        assert r.status_code == 200, r.text
        y = decode_array(r.json()["outputs"]["y"])
        np.testing.assert_array_equal(y, np.asarray(a) * 2)
        assert y.shape == np.shape(a)


def test_encoding_is_little_endian_c_order() -> None:
    a = np.arange(6, dtype=">i4").reshape(2, 3).T  # big-endian and Fortran-ordered
    doc = encode_array(a)
    assert doc == {"dtype": "int32", "shape": [3, 2],
                   "data_b64": base64.b64encode(np.ascontiguousarray(a, dtype="<i4").tobytes()).decode()}


@pytest.mark.parametrize("value", [np.array(["a"]), np.array([object()]), np.zeros(2, "datetime64[s]"),
                                   np.zeros(2, [("a", "i4")])])
def test_unsupported_dtypes_do_not_encode(value: np.ndarray) -> None:
    with pytest.raises(WireError, match="the wire carries only"):
        encode_array(value)


@pytest.mark.parametrize("doc, words", [
    ([1, 2], "expected an object"),
    ({"dtype": "float32", "shape": [1]}, "missing ['data_b64']"),
    ({"dtype": "f4", "shape": [1], "data_b64": "AAAAAA=="}, "not a supported dtype"),
    ({"dtype": "float32", "shape": [True], "data_b64": "AAAAAA=="}, "non-negative integers"),
    ({"dtype": "float32", "shape": [1], "data_b64": 5}, "base64 string"),
    ({"dtype": "float32", "shape": [1], "data_b64": "AAAAAA="}, "not valid base64"),
])
def test_decode_errors_name_the_field(doc: Any, words: str) -> None:
    with pytest.raises(WireError, match=re.escape(words)) as ei:
        decode_array(doc, "inputs.img")
    assert str(ei.value).startswith("inputs.img")


def test_scalars_become_strict_json() -> None:
    values = {"nan": math.nan, "inf": np.float64(np.inf), "ninf": -math.inf, "i": np.int32(3), "b": np.bool_(True),
              "c": 1 + 2j, "s": "text", "none": None, "arr": np.arange(2, dtype=np.uint8), "t": (1, 2.5)}
    doc = jsonable(values)
    assert json.loads(json.dumps(doc, allow_nan=False)) == {
        "nan": "NaN", "inf": "Infinity", "ninf": "-Infinity", "i": 3, "b": True, "c": [1.0, 2.0], "s": "text",
        "none": None, "arr": encode_array(np.arange(2, dtype=np.uint8)), "t": [1, 2.5]}


def test_result_document_round_trip(client: TestClient) -> None:
    doc = invoke(client, "double", {"inputs": {"x": arr_doc(np.zeros(0, np.float32))}}).json()
    assert doc["scalars"] == {"n": 0, "top": "NaN"}
    res = result_from_document(doc)
    assert res.ok and math.isnan(res.scalars["top"]) and res.breakdown == BREAKDOWN
    assert res.functions[1] == FunctionRecord("g", skipped=True)
    with pytest.raises(WireError, match="not a result document"):
        result_from_document({"workflow": "x"})


def test_the_result_body_is_the_result_document_as_strict_json() -> None:
    """The gateway encodes result documents with msgspec (gateway.invocations._json_bytes): what a
    client parses is exactly the document, non-finite scalars as strings, text as UTF-8."""
    from gfaas.runtime.gateway.invocations import _json_bytes
    from gfaas.runtime.wire import result_document

    res = InvocationResult("i-1", "wf", "failed", {"y": np.arange(3, dtype=np.float64)},
                           {"f.nan": float("nan"), "f.inf": float("-inf"), "f.tiny": 4.6e-05, "f.big": 1e300},
                           "función 'f' failed: ∞", Breakdown(1e-7, 2.5, 0.0, 3.0, 123456.789),
                           (FunctionRecord("f", "f@1", 0.1, 0.2, 0.3, 0.4),
                            FunctionRecord("g", "g@1", float("inf"), float("nan"), 0.0, 1e-9)))
    body = _json_bytes(res)
    assert json.loads(body.decode("utf-8")) == result_document(res)
    assert b'"f.nan":"NaN"' in body and b'"f.inf":"-Infinity"' in body
    assert b'"queued_s":"Infinity","get_s":"NaN"' in body  # times too (wire._seconds)
    assert "función 'f' failed: ∞".encode() in body  # not escaped to ASCII
    assert json.loads(_json_bytes(res, "digest"))["outputs"] == result_document(res, "digest")["outputs"]


# ---------------------------------------------------------------- metrics


def test_metrics_count_each_invocation_exactly_once(client: TestClient, rt: FakeRuntime) -> None:
    rt.depths = {"double/f": 3, "held/f": 0}
    n = 7
    ids = [invoke(client, "double", {"seed": k}).json()["invocation_id"] for k in range(n)]
    invoke(client, "failing", {"seed": 0})
    for inv in ids[:3]:  # results fetched again (twice) are not counted again
        for _ in range(2):
            assert client.get(f"/v1/invocations/{inv}/result").status_code == 200
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    s = parse_metrics(r.text)
    assert metric(s, "gfaas_invocations_total", workflow="double", status="done") == n
    assert metric(s, "gfaas_invocations_total", workflow="failing", status="failed") == 1
    assert metric(s, "gfaas_invocation_latency_seconds_count", workflow="double") == n
    assert metric(s, "gfaas_invocation_latency_seconds_sum", workflow="double") == pytest.approx(3.0 * n)
    buckets = sorted((float(dict(k[1])["le"]), v) for k, v in s.items()
                     if k[0] == "gfaas_invocation_latency_seconds_bucket" and dict(k[1])["workflow"] == "double")
    assert buckets[-1] == (math.inf, n)
    assert all(a[1] <= b[1] for a, b in itertools.pairwise(buckets))  # cumulative
    assert dict(buckets)[2.5] == 0 and dict(buckets)[5.0] == n  # total_s = 3.0
    assert metric(s, "gfaas_invocation_latency_seconds_count", workflow="failing") == 0  # successes only
    assert metric(s, "gfaas_data_pass_seconds_total", workflow="double", kind="host") == pytest.approx(0.25 * n)
    assert metric(s, "gfaas_data_pass_seconds_total", workflow="double", kind="function") == pytest.approx(0.125 * n)
    assert metric(s, "gfaas_data_pass_seconds_total", workflow="failing", kind="host") == pytest.approx(0.25)
    assert metric(s, "gfaas_compute_seconds_total", workflow="double") == pytest.approx(2.0 * n)
    assert metric(s, "gfaas_queue_depth", workflow="double", function="f") == 3
    assert ("gfaas_queue_depth", frozenset({("workflow", "held"), ("function", "f")})) in s
    assert parse_metrics(client.get("/metrics").text) == s  # scraping does not change anything


def test_unfetched_async_invocations_are_counted_by_the_sweep(app: FastAPI, client: TestClient,
                                                              rt: FakeRuntime) -> None:
    ids = [invoke(client, "held", {"seed": k}, mode="async").json()["invocation_id"] for k in range(4)]
    tracker = app.state.gateway.tracker
    assert tracker.sweep() == 0  # still running
    rt.release()
    assert tracker.sweep() == 4
    assert tracker.sweep() == 0
    assert client.get(f"/v1/invocations/{ids[0]}/result").status_code == 200  # not counted a second time
    s = parse_metrics(client.get("/metrics").text)
    assert metric(s, "gfaas_invocations_total", workflow="held", status="done") == 4
    assert tracker.pending() == 0


def test_sweeper_thread_runs_while_the_app_does(rt: FakeRuntime) -> None:
    app = create_app(rt, token=TOKEN, sweep_interval_s=0.01)
    with TestClient(app, headers=AUTH) as c:
        invoke(c, "held", {"seed": 0}, mode="async")
        rt.release()
        tracker = app.state.gateway.tracker
        done = threading.Event()
        for _ in range(500):  # the sweeper counts it within a few intervals
            if tracker.pending() == 0:
                done.set()
                break
            done.wait(0.01)
        assert done.is_set()
        assert metric(parse_metrics(c.get("/metrics").text), "gfaas_invocations_total", workflow="held",
                      status="done") == 1


def test_registry_escapes_labels_and_rejects_misuse() -> None:
    reg = Registry()
    c = reg.counter("x_total", "help with \\ and\nnewline", ["a"])
    c.inc(2, a='q"uo\\te\nnl')
    h = reg.histogram("lat_seconds", "h", ["a"], buckets=[1, 0.1])
    h.observe(0.1, a="z")
    h.observe(7, a="z")
    text = reg.render()
    assert "# HELP x_total help with \\\\ and\\nnewline" in text
    s = parse_metrics(text)
    assert metric(s, "x_total", a='q"uo\\te\nnl') == 2
    assert metric(s, "lat_seconds_bucket", a="z", le="0.1") == 1
    assert metric(s, "lat_seconds_bucket", a="z", le="1.0") == 1
    assert metric(s, "lat_seconds_bucket", a="z", le="+Inf") == 2
    assert h.snapshot(a="z")["count"] == 2
    with pytest.raises(ValueError, match="can only go up"):
        c.inc(-1, a="b")
    with pytest.raises(ValueError, match="takes labels"):
        c.inc(1, b="x")
    with pytest.raises(ValueError, match="already registered"):
        reg.gauge("x_total", "again")


def test_registry_is_thread_safe() -> None:
    reg = Registry()
    c = reg.counter("n_total", "n", ["w"])
    h = reg.histogram("l_seconds", "l", ["w"])

    def work(k: int) -> None:
        for i in range(1000):
            c.inc(w=str(k % 2))
            h.observe(0.01, w="a")
            if i % 20 == 0:
                reg.render()  # concurrent readers too

    with ThreadPoolExecutor(8) as ex:
        list(ex.map(work, range(8)))
    assert c.value(w="0") + c.value(w="1") == 8000
    assert h.snapshot(w="a")["count"] == 8000


# ---------------------------------------------------------------- the client and a real server


def test_gateway_client_against_the_app(client: TestClient, rt: FakeRuntime) -> None:
    gw = GatewayClient(client=client)
    assert gw.healthy()
    assert gw.deploy("name: other\ninputs: [x]\n") == "other"
    assert "other" in gw.workflows() and gw.describe("other")["name"] == "other"
    x = np.arange(5, dtype=np.int32)
    res = gw.invoke("other", {"x": x})
    assert res.ok and res.workflow == "other"
    np.testing.assert_array_equal(res.outputs["y"], 2 * x)
    assert res.scalars == {"n": 5, "top": 4.0}
    inv = gw.invoke("held", seed=2, mode="async")
    assert gw.status(inv) == "running"
    with pytest.raises(TimeoutError):
        gw.result(inv, timeout=0.01)
    with pytest.raises(InvocationTimeout) as ei:
        gw.invoke("held", seed=2, timeout=0.01)
    rt.release()
    assert gw.result(ei.value.invocation_id, timeout=5).ok
    assert gw.result(inv).ok
    assert gw.invoke("failing", seed=1).status == "failed"
    with pytest.raises(NotFound):
        gw.invoke("nope", seed=1)
    with pytest.raises(NotFound):
        gw.status("inv-424242")
    with pytest.raises(SpecError, match="exactly one"):
        gw.invoke("other")
    with pytest.raises(SpecError, match="already deployed"):
        gw.deploy("name: other\ninputs: [x]\n")
    rt.overloaded = True
    with pytest.raises(Overloaded, match="retry after 1 s"):
        gw.submit("other", seed=1)
    assert "gfaas_invocations_total" in gw.metrics()


@pytest.fixture
def server(rt: FakeRuntime) -> Iterator[Any]:
    with serve(rt, token=TOKEN, sweep_interval_s=3600, access_log=False) as gw:
        yield gw


def test_serve_binds_loopback_on_a_free_port(server: Any) -> None:
    assert server.url == f"http://127.0.0.1:{server.port}" and server.port > 0
    assert httpx.get(server.url + "/healthz").json() == {"status": "ok"}


def _server_nodelay(port: int) -> list[int]:
    """TCP_NODELAY of every accepted connection of the in-process server on ``port`` (found among this
    process's descriptors: local port ``port`` and a peer, so not the listener)."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=os.dup(int(name)))
        except (OSError, ValueError):
            continue  # not a socket (or gone)
        try:
            if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            if sock.getsockname()[1] != port:
                continue
            try:
                sock.getpeername()
            except OSError:
                continue  # the listener
            out.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        finally:
            sock.close()  # the duplicate only
    return out


def test_serve_answers_small_requests_without_nagle_delays(server: Any) -> None:
    """Without TCP_NODELAY on the server's connections every answer waits ~40 ms for a delayed ACK (the
    kernel's least delay). The option is checked on the server's own end of a live keep-alive
    connection, not by timing requests: on a loaded 2-core machine a parallel suite once moved their
    median past 60 ms with the option set."""
    with httpx.Client(base_url=server.url, headers=AUTH) as http:
        for call in (lambda: http.get("/healthz"), lambda: invoke(http, "double", {"seed": 1})):
            assert call().status_code == 200
        flags = _server_nodelay(server.port)
        assert flags and all(flags), flags  # the connection is open (keep-alive) and has the option


def test_serve_with_concurrent_clients_loses_and_duplicates_nothing(server: Any, rt: FakeRuntime) -> None:
    n, threads = 200, 16

    def one(k: int, http: httpx.Client) -> tuple[int, str]:
        x = np.arange(k % 13 + 1, dtype=np.float64) * (k + 1)
        if k % 2:
            r = invoke(http, "double", {"inputs": {"x": encode_array(x)}})
            assert r.status_code == 200, r.text
            doc = r.json()
        else:  # half of them async, fetched with a long wait
            r = invoke(http, "double", {"inputs": {"x": encode_array(x)}}, mode="async")
            assert r.status_code == 202, r.text
            doc = http.get(r.json()["result_url"], params={"wait": 30}).json()
        np.testing.assert_array_equal(decode_array(doc["outputs"]["y"]), 2 * x)
        return k, doc["invocation_id"]

    def worker(ks: list[int]) -> list[tuple[int, str]]:
        with httpx.Client(base_url=server.url, timeout=60, headers=AUTH) as http:
            return [one(k, http) for k in ks]

    with ThreadPoolExecutor(threads) as ex:
        results = [r for part in ex.map(worker, [list(range(i, n, threads)) for i in range(threads)]) for r in part]
    assert sorted(k for k, _ in results) == list(range(n))
    ids = [inv for _, inv in results]
    assert len(set(ids)) == n and rt.submits == n
    assert sorted(ids) == sorted(rt.invs)
    s = parse_metrics(httpx.get(server.url + "/metrics", headers=AUTH).text)
    assert metric(s, "gfaas_invocations_total", workflow="double", status="done") == n
    assert metric(s, "gfaas_invocation_latency_seconds_count", workflow="double") == n


def test_serve_survives_a_runtime_bug_and_stops_cleanly(rt: FakeRuntime) -> None:
    gw = serve(rt, token=TOKEN, access_log=False)
    try:
        rt.bug = "describe"
        r = httpx.get(gw.url + "/v1/workflows/double", headers=AUTH)
        assert r.status_code == 500 and r.json()["error"] == "internal"
        rt.bug = ""
        assert httpx.get(gw.url + "/v1/workflows/double", headers=AUTH).status_code == 200
        with GatewayClient(gw.url, token=TOKEN) as c:
            assert c.invoke("double", seed=2).ok
        big = {"inputs": {"x": encode_array(np.zeros(10_000, np.float64))}}
        assert gw.running
    finally:
        gw.stop()
    assert not gw.running
    with pytest.raises(httpx.ConnectError):
        httpx.get(gw.url + "/healthz")
    del big


def test_stop_does_not_hang_on_a_request_still_waiting(rt: FakeRuntime) -> None:
    gw = serve(rt, token=TOKEN, access_log=False, graceful_s=1)

    def request() -> None:
        with contextlib.suppress(httpx.HTTPError):  # the server goes away under it
            httpx.post(gw.url + "/v1/workflows/held/invocations", params={"timeout": 600}, json={"seed": 1}, headers=AUTH,
                       timeout=60)

    waiting = threading.Thread(target=request)
    waiting.start()
    assert rt.waiting.wait(10)  # the request is waiting inside the runtime
    t0 = time.monotonic()
    gw.stop(timeout=10)
    assert time.monotonic() - t0 < 5 and not gw.running
    rt.release()
    waiting.join(30)
    assert not waiting.is_alive()


def test_serve_enforces_the_body_limit_on_a_real_socket(rt: FakeRuntime) -> None:
    with serve(rt, token=TOKEN, max_body_bytes=4096, access_log=False) as gw:
        body = {"inputs": {"x": encode_array(np.zeros(1000, np.float64))}}  # ~10.7 kB of JSON
        r = httpx.post(gw.url + "/v1/workflows/double/invocations", json=body, headers=AUTH)
        assert r.status_code == 413
        assert httpx.get(gw.url + "/healthz").status_code == 200


def test_serve_refuses_a_port_in_use(server: Any, rt: FakeRuntime) -> None:
    with pytest.raises(ConfigError, match="cannot listen"):
        serve(rt, port=server.port)


# ---------------------------------------------------------------- the package's shape


def test_waits_are_bounded_per_app(rt: FakeRuntime) -> None:
    """``max_timeout_s`` bounds ``timeout``/``wait`` per app (schema and 422), not once per process."""
    for bound in (30.0, 600.0):
        app = create_app(rt, token=TOKEN, max_timeout_s=bound, default_timeout_s=1.0, sweep_interval_s=3600)
        paths = app.openapi()["paths"]
        for path, method, param in (("/v1/workflows/{name}/invocations", "post", "timeout"),
                                    ("/v1/invocations/{invocation_id}/result", "get", "wait")):
            (p,) = [p for p in paths[path][method]["parameters"] if p["name"] == param]
            assert json.dumps(p["schema"]).count(f'"maximum": {bound}') == 1, p
        with TestClient(app, headers=AUTH) as c:
            r = c.post(f"/v1/workflows/double/invocations?timeout={bound + 1:g}", json={"seed": 1})
            assert r.status_code == 422 and r.json()["errors"][0]["field"] == "query.timeout"
            assert c.post(f"/v1/workflows/double/invocations?timeout={bound:g}", json={"seed": 1}).status_code == 200
            r = c.get(f"/v1/invocations/inv-000000/result?wait={bound + 1:g}")
            assert r.status_code == 422 and r.json()["errors"][0]["field"] == "query.wait"


def test_gateway_package_stays_untied(rt: FakeRuntime) -> None:
    """The gateway was once one module with every route a closure in create_app; keep it apart: small
    modules, a short create_app with nothing defined inside it, routes and handlers at module level."""
    import ast
    import functools
    import inspect
    import sys
    import textwrap
    from pathlib import Path

    from fastapi.routing import APIRoute

    import gfaas.runtime.gateway as pkg

    modules = sorted(Path(pkg.__file__).parent.glob("*.py"))
    assert len(modules) > 1
    for module in modules:
        n = len(module.read_text().splitlines())
        assert n <= 300, f"{module.name} has {n} lines; split it (see the gateway package docstring)"
    source = textwrap.dedent(inspect.getsource(create_app))
    assert len(source.splitlines()) <= 60, "create_app grows: routes and handlers belong in their modules"
    (fn,) = ast.parse(source).body
    nested = [type(n).__name__ for n in ast.walk(fn) if n is not fn and isinstance(
        n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda)]
    assert not nested, f"create_app defines {nested}: put routes on a router, handlers in errors.py"

    def module_level(f: Any) -> bool:
        while isinstance(f, functools.partial):
            f = f.func
        return f.__module__.startswith(pkg.__name__ + ".") and getattr(sys.modules[f.__module__], f.__name__) is f

    from gfaas.runtime.gateway import dashboard, invocations, logs, nodes, ops, workflows

    routes = [r for router in (ops.router, workflows.router, invocations.router(600.0), logs.router, dashboard.router,
                               nodes.router)
              for r in router.routes
              if isinstance(r, APIRoute)]
    for route in routes:
        assert module_level(route.endpoint), f"{route.path}: the endpoint is not a module-level function"
    app = create_app(rt)
    served = {(path, method.upper()) for path, ops_ in app.openapi()["paths"].items() for method in ops_}
    # (the OpenAPI document writes a path parameter's converter away, and leaves out the dashboard's page)
    assert served == {(r.path_format, m) for r in routes if r.include_in_schema for m in r.methods}, \
        "a route is not on the package's routers"
    for exc, handler in app.exception_handlers.items():
        if exc not in (500,) and not handler.__module__.startswith("fastapi"):
            assert module_level(handler), f"the handler for {exc} is not a module-level function"


# ---------------------------------------------------------------- security pieces (issue 14)


def test_token_is_compared_whole_and_only_as_bearer() -> None:
    """Only `Bearer <the token>` passes: not a prefix, not another scheme, not a missing header."""
    from gfaas.runtime.gateway.auth import token_matches

    t = TOKEN.encode()
    assert token_matches(b"Bearer " + t, t) and token_matches(b"bearer  " + t + b" ", t)
    assert not any(token_matches(h, t) for h in (None, b"", b"Bearer", b"Bearer " + t[:-1], b"Basic " + t,
                                                 b"Bearer " + t + b"x", t))


def test_rate_limiter_lets_a_burst_through_then_one_per_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    """A burst of 3, then one record per second; the next one through reports how many were held back."""
    from gfaas.runtime.gateway import ratelog

    now = [100.0]
    monkeypatch.setattr(ratelog.time, "monotonic", lambda: now[0])
    lim = ratelog.RateLimiter(burst=3, per_s=1.0)
    assert [lim.allow() for _ in range(5)] == [(True, 0)] * 3 + [(False, 0)] * 2
    now[0] += 1.0
    assert lim.allow() == (True, 2) and lim.allow() == (False, 0)


def test_gateway_limits_name_the_bad_setting() -> None:
    """Bad limits fail at construction with the field's name."""
    from gfaas.runtime.gateway import GatewayLimits

    with pytest.raises(ConfigError, match="max_functions=0"):
        GatewayLimits(max_functions=0)
    with pytest.raises(ConfigError, match="not the string 'gfaas'"):
        GatewayLimits(handler_packages="gfaas")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="header_timeout_s"):
        GatewayLimits(header_timeout_s=0)


def test_spec_parsing_is_bounded() -> None:
    """Anchors, aliases and deep nesting are SpecErrors; a 1,500-function chain sorts without recursion."""
    from gfaas.runtime import spec

    with pytest.raises(SpecError, match=r"YAML alias \*a at line 2"):
        spec.parse("x: 1\ny: *a\n")
    with pytest.raises(SpecError, match="anchor &a"):
        spec.parse("x: &a [1]\n")
    with pytest.raises(SpecError, match="nesting deeper than 32"):
        spec.parse("[" * 33 + "]" * 33)
    assert spec.parse("[" * 32 + "]" * 32) is not None
    with pytest.raises(SpecError, match="nesting deeper than 32"):
        spec.parse('{"a": ' * 40 + "1" + "}" * 40)
    fns = "".join(f"  - {{name: f{k}, kind: cpu, handler: 'm:f', inputs: {{x: {'input.x' if k == 0 else f'f{k - 1}.y'}}}, "
                  "outputs: {y: null}}\n" for k in range(1500))
    s = spec.loads(f"name: c\ninputs: {{x: null}}\noutputs: {{o: f1499.y}}\nfunctions:\n{fns}", check_handlers=False)
    assert [f.name for f in s.functions] == [f"f{k}" for k in range(1500)]
    with pytest.raises(SpecError, match="cycle: a -> b -> a"):
        spec.loads("name: c\ninputs: {x: null}\noutputs: {o: a.y}\nfunctions:\n"
                   "  - {name: a, kind: cpu, handler: 'm:f', inputs: {x: b.y}, outputs: {y: null}}\n"
                   "  - {name: b, kind: cpu, handler: 'm:f', inputs: {x: a.y}, outputs: {y: null}}\n",
                   check_handlers=False)


def test_screen_checks_handlers_by_name_before_importing() -> None:
    """Handlers outside the allowed packages fail by name; an allowed module's re-exported foreign
    callable fails after the import; the shipped workflows' own handlers pass."""
    from gfaas.runtime import spec

    def doc(handler: str) -> str:
        return f"name: w\nfunctions: [{{name: f, handler: '{handler}'}}]\n"

    with pytest.raises(SpecError, match="'os:system' is not in an allowed package"):
        spec.screen(doc("os:system"), handler_packages=["gfaas.workflows"], max_functions=4)
    with pytest.raises(SpecError, match="defined in 'gfaas.runtime.context', outside the allowed packages"):
        spec.screen(doc("gfaas.workflows.traffic:Context"), handler_packages=["gfaas.workflows"], max_functions=4)
    text = __import__("gfaas.workflows", fromlist=["spec_text"]).spec_text("traffic")
    assert spec.screen(text, handler_packages=["gfaas.workflows"], max_functions=64)["name"] == "traffic"
    with pytest.raises(SpecError, match="max_functions=1"):
        spec.screen(text, handler_packages=["gfaas.workflows"], max_functions=1)


# ---------------------------------------------------------------- the invoke endpoint's fast path

_FAST_BODIES: list[Any] = [
    {"inputs": {"x": arr_doc(np.arange(6, dtype=np.float32))}},
    {"inputs": {"x": arr_doc(np.zeros((0, 3)))}},
    {"seed": 7}, {"seed": 7, "transport": "redis"}, {"seed": 2**53 - 1}, {"seed": 2**53}, {"seed": -1},
    {"seed": 3.0}, {"seed": True}, {"seed": None}, {"inputs": None, "seed": 1}, {}, [], "x", 3,
    {"inputs": {"x": {"dtype": "float32", "shape": [1.0], "data_b64": "AAAAAA=="}}},
    {"inputs": {"x": {"dtype": "float32", "shape": [2], "data_b64": "AAAAAA=="}}},
    {"inputs": {"x": {"dtype": "float128", "shape": [1], "data_b64": "AAAAAA=="}}},
    {"inputs": {"x": {"dtype": "float32", "shape": [-1], "data_b64": ""}}},
    {"inputs": {"x": {"dtype": "float32", "shape": [1], "data_b64": "AAAAAA==", "more": 1}}},
    {"inputs": {"y": arr_doc(np.ones(2))}}, {"seed": 1, "transport": "carrier-pigeon"},
]
_FAST_QUERIES: list[dict[str, Any]] = [{}, {"timeout": "5"}, {"timeout": "1e1"}, {"timeout": "1_0"},
                                       {"timeout": "inf"}, {"timeout": "-1"}, {"outputs": "digest"},
                                       {"outputs": "all"}, {"mode": "sync"}, {"mode": "later"}, {"other": "1"}]


def _answer(r: httpx.Response) -> tuple[int, Any]:
    doc = r.json()
    if isinstance(doc, dict):
        doc.pop("invocation_id", None)
        if isinstance(doc.get("message"), str):  # an error naming the invocation
            doc["message"] = re.sub(r"[0-9a-f]{32}|inv-\d+", "ID", doc["message"])
    return r.status_code, doc


@pytest.mark.parametrize("body, query", [(b, {}) for b in _FAST_BODIES] + [({"seed": 7}, q) for q in _FAST_QUERIES])
def test_the_fast_path_answers_exactly_as_the_route(rt: FakeRuntime, monkeypatch: pytest.MonkeyPatch,
                                                    body: Any, query: dict[str, Any]) -> None:
    """Every body and query, well-formed or not, gets the same status and document whether the guard's
    fast path takes it (it takes what it parses plainly) or the FastAPI route does (forced here)."""
    from gfaas.runtime.gateway import guard

    answers = []
    for fast in (True, False):
        with monkeypatch.context() as mp:
            if not fast:
                mp.setattr(guard, "parse_query", lambda *a: None)
            with TestClient(create_app(rt, token=TOKEN, sweep_interval_s=3600), headers=AUTH) as c:
                answers.append(_answer(c.post("/v1/workflows/double/invocations", content=json.dumps(body),
                                              params=query, headers={"content-type": "application/json"})))
    assert answers[0] == answers[1]


def test_the_fast_path_takes_plain_requests_and_leaves_the_rest(client: TestClient,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A valid sync invocation never reaches the FastAPI route; an async one, or one whose body the
    fast parser does not take, does (with its body intact)."""
    from gfaas.runtime.gateway import fastpath

    taken: list[str] = []
    real = fastpath.run_invocation

    async def spy(request: Any, name: str, *args: Any) -> Any:
        taken.append(name)
        return await real(request, name, *args)

    monkeypatch.setattr(fastpath, "run_invocation", spy)
    assert invoke(client, "double", {"seed": 1}).status_code == 200
    assert taken == ["double"]
    assert invoke(client, "double", {"seed": 1.0}).status_code == 200  # the route converts 1.0
    assert invoke(client, "double", {"seed": 1}, mode="async").status_code == 202
    assert taken == ["double"]


def test_the_fast_parsers_accept_only_what_the_schema_plainly_allows() -> None:
    from gfaas.runtime.gateway.fastpath import parse_body, parse_query

    assert parse_query(b"", 600) == (None, "full")
    assert parse_query(b"timeout=2.5&outputs=digest&mode=sync", 600) == (2.5, "digest")
    for q in (b"timeout=601", b"timeout=-0.5", b"timeout=nan", b"timeout=1&timeout=2", b"mode=async", b"x=1",
              b"timeout=+1", b"timeout= 1"):
        assert parse_query(q, 600) is None, q
    ok = parse_body(b'{"seed": 3, "transport": "gfaas"}')
    assert ok is not None and (ok.inputs, ok.seed, ok.transport) == (None, 3, "gfaas")
    for raw in (b'{"seed": 3.0}', b'{"seed": true}', b'{"seed": 1, "inputs": null}', b'{"seed": -1}',
                b'{"seed": 1, "x": 2}', b'{}', b'[]', b'{"seed": 1', b'{"inputs": {"a": {"dtype": "f4", '
                b'"shape": [1], "data_b64": ""}}}', b'{"inputs": {"a": {"dtype": "int8", "shape": [-1], '
                b'"data_b64": ""}}}'):
        assert parse_body(raw) is None, raw
