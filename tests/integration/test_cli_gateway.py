"""The CLI's gateway commands: one URL variable and one token default for all of them, a one-line error
when no gateway answers or the token is wrong, `gfaas invoke` (inputs from .npy, .json and JSON text,
outputs to .npy and result.json, a failed invocation's exit status), `gfaas workflows list` showing what
the gateway serves, and `gfaas --version`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import gfaas
from gfaas.cli import main
from gfaas.cli_invoke import parse_input
from gfaas.errors import SpecError
from gfaas.runtime.gateway import serve
from gfaas.runtime.local import LocalRuntime, RuntimeConfig
from gfaas.secfiles import create_file

pytestmark = pytest.mark.timeout(120)

TOKEN = "cli-gateway-token-0123456789abcdef"
SPEC = """
name: sums
description: doubles x and counts its positive entries
inputs: {x: {dtype: float32, shape: [-1]}}
outputs: {y: f.y, n: f.n_pos}
functions:
  - {name: f, kind: cpu, handler: "rt_handlers:double", inputs: {x: input.x}, outputs: {y: null, n_pos: {shape: []}}}
"""
FAILING = """
name: failing
inputs: {x: null}
outputs: {out: f.y}
functions:
  - {name: f, kind: cpu, handler: "rt_handlers:fail_if_negative", inputs: {x: input.x}, outputs: {y: null}}
"""


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def gateway(rt_handlers: str, tmp_path: Path) -> Iterator[tuple[str, str]]:
    token_file = tmp_path / "token"
    create_file(str(token_file), (TOKEN + "\n").encode(), sync=False)
    with LocalRuntime(RuntimeConfig(sandbox="none")) as rt:
        rt.deploy(SPEC)
        rt.deploy(FAILING)
        with serve(rt, port=0, token=TOKEN, access_log=False) as gw:
            yield gw.url, str(token_file)


def test_every_gateway_command_says_in_one_line_that_no_gateway_answers(tmp_path: Path) -> None:
    """With $GFAAS_URL at a port nobody listens on: exit 1 and one line naming the URL and the fix."""
    url = f"http://127.0.0.1:{closed_port()}"
    env = {**os.environ, "GFAAS_URL": url, "GFAAS_RUN_DIR": str(tmp_path)}
    (tmp_path / "s.yaml").write_text(SPEC)
    for args in (["invoke", "sums", "--input", "x=[1]"], ["logs", "sums"], ["workflows", "list"],
                 ["workflows", "status", "sums"], ["deploy", str(tmp_path / "s.yaml")]):
        r = subprocess.run([sys.executable, "-m", "gfaas", *args], capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == 1, (args, r.stderr)
        assert r.stderr.splitlines() == [
            f"gfaas: error: no gateway answers at {url} (connection refused): start one with `gfaas serve`, or give "
            "the address of yours (--url or $GFAAS_URL; GatewayClient(url))"], (args, r.stderr)


def test_a_wrong_token_is_one_line_naming_the_flag(gateway: tuple[str, str], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    url, _ = gateway
    wrong = tmp_path / "wrong"
    create_file(str(wrong), b"not-the-token-0123456789abcdef\n", sync=False)
    assert main(["logs", "sums", "--url", url, "--token-file", str(wrong)]) == 1
    assert capsys.readouterr().err.strip() == (
        "gfaas: error: gateway: HTTP 401: no token, or not this gateway's: give the token file `gfaas serve` printed "
        "(--token-file FILE or $GFAAS_GATEWAY_TOKEN_FILE; token_file= in Python)")


def test_invoke_takes_json_npy_and_json_files_and_saves_the_outputs(
        gateway: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """--input x=[...] becomes the declared float32; .npy and .json files work alike; each output is
    saved as NAME.npy beside result.json; $GFAAS_URL and $GFAAS_GATEWAY_TOKEN_FILE are the defaults."""
    url, token_file = gateway
    monkeypatch.setenv("GFAAS_URL", url)
    monkeypatch.setenv("GFAAS_GATEWAY_TOKEN_FILE", token_file)
    np.save(tmp_path / "x.npy", np.array([1.5, -2.0], np.float32))
    (tmp_path / "x.json").write_text("[3, 4, -5]")
    for value, want in (("[1, -2, 3]", [2.0, -4.0, 6.0]), (str(tmp_path / "x.npy"), [3.0, -4.0]),
                        (str(tmp_path / "x.json"), [6.0, 8.0, -10.0])):
        out = tmp_path / "out"
        assert main(["invoke", "sums", "--input", f"x={value}", "--out", str(out)]) == 0
        printed = capsys.readouterr().out
        y = np.load(out / "y.npy")
        assert y.dtype == np.float32 and y.tolist() == want
        doc = json.loads((out / "result.json").read_text())
        assert doc["status"] == "done" and doc["workflow"] == "sums" and doc["error"] is None
        assert doc["outputs"]["y"] == {"dtype": "float32", "shape": [len(want)], "file": str(out / "y.npy"),
                                       "value": want}
        assert doc["outputs"]["n"]["value"] == sum(1 for v in want if v > 0)
        assert printed.startswith("sums: done in ") and f"-> {out / 'y.npy'} = {json.dumps(want)}" in printed
    assert main(["invoke", "sums", "--input", "x=[1]", "--out", str(tmp_path / "j"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["outputs"]["y"]["value"] == [2.0]


def test_a_failed_invocation_exits_1_with_the_functions_error(gateway: tuple[str, str], tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    url, token_file = gateway
    code = main(["invoke", "failing", "--input", "x=[-1.0]", "--out", str(tmp_path / "o"), "--url", url,
                 "--token-file", token_file])
    err = capsys.readouterr().err
    assert code == 1 and "gfaas: error: failing failed: " in err and "negative input at 0" in err
    assert json.loads((tmp_path / "o" / "result.json").read_text())["failure"]["function"] == "f"


def test_workflows_list_shows_what_the_gateway_serves(gateway: tuple[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    url, token_file = gateway
    assert main(["workflows", "list", "--url", url, "--token-file", token_file]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "failing      v1   1 functions, inputs x",
        "sums         v1   1 functions, inputs x  doubles x and counts its positive entries"]
    assert main(["workflows", "list", "--url", url, "--token-file", token_file, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == ["failing", "sums"] and rows[1]["functions"] == ["f"]
    assert main(["workflows", "list", "--reference"]) == 0  # no gateway needed
    assert capsys.readouterr().out.split()[0] == "driving"


def test_bad_inputs_are_refused_before_anything_is_sent(tmp_path: Path) -> None:
    declared = {"x": {"dtype": "float32", "shape": [-1]}}
    with pytest.raises(SpecError, match=r"--input 'x': write NAME=VALUE"):
        parse_input("x", declared)
    with pytest.raises(SpecError, match=r"--input y: the workflow has no input 'y'; its inputs are \['x'\]"):
        parse_input("y=[1]", declared)
    with pytest.raises(SpecError, match=r"--input x='\[1,' is neither a \.npy or \.json file nor JSON text"):
        parse_input("x=[1,", declared)
    with pytest.raises(SpecError, match=r"--input x: cannot read .*missing\.npy as a \.npy file"):
        parse_input(f"x={tmp_path / 'missing.npy'}", declared)
    with pytest.raises(SpecError, match=r"does not convert to the declared dtype float32"):
        parse_input('x=["a", "b"]', declared)
    name, arr = parse_input("x=[1, 2]", declared)
    assert name == "x" and arr.dtype == np.float32 and arr.tolist() == [1.0, 2.0]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"gfaas {gfaas.__version__}"


def test_the_python_client_raises_gateway_unavailable() -> None:
    """GatewayUnavailable is part of the error tree and a ConnectionError."""
    assert issubclass(gfaas.GatewayUnavailable, gfaas.GfaasError)
    assert issubclass(gfaas.GatewayUnavailable, ConnectionError)
    with pytest.raises(gfaas.GatewayUnavailable, match="no gateway answers at http://127.0.0.1:"), \
            gfaas.GatewayClient(f"http://127.0.0.1:{closed_port()}") as c:
        c.workflows()
