"""Code packages through the gateway and the CLI: ``gfaas deploy SPEC --code DIR``, versions and
rollback over HTTP, and each bad package answered with a 4xx naming the problem, nothing deployed."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from test_runtime_code import HANDLER, spec  # pytest puts this directory on sys.path

from gfaas import GatewayClient, SpecError, serve_gateway
from gfaas.cli import main
from gfaas.runtime.gateway import GatewayLimits
from gfaas.runtime.local import LocalRuntime, RuntimeConfig

TOKEN = "code-deploy-test-token-0123456789"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalRuntime, str, Path]]:
    tmp = tmp_path_factory.mktemp("gw")
    token_file = tmp / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    rt = LocalRuntime(RuntimeConfig(queue_hints=False, drain_timeout_s=30))
    try:
        with serve_gateway(rt, access_log=False, token=TOKEN, limits=GatewayLimits(max_code_bytes=1 << 20)) as gw:
            yield rt, gw.url, token_file
    finally:
        rt.close()


def code_dir(tmp: Path, version: int) -> Path:
    d = tmp / f"code{version}"
    (d / "mymod").mkdir(parents=True, exist_ok=True)
    (d / "mymod" / "__init__.py").write_text("")
    (d / "mymod" / "handlers.py").write_text(HANDLER.format(version=version))
    return d


def test_deploy_versions_and_rollback_through_the_client(gateway: tuple[LocalRuntime, str, Path],
                                                         tmp_path: Path) -> None:
    _, url, _ = gateway
    with GatewayClient(url, token=TOKEN) as c:
        assert c.deploy(spec("viahttp"), code=code_dir(tmp_path, 1)) == "viahttp"
        assert float(c.invoke("viahttp", {"x": np.zeros(2)}).outputs["y"][0]) == 1.0
        c.deploy(spec("viahttp"), code=code_dir(tmp_path, 2))
        assert float(c.invoke("viahttp", {"x": np.zeros(2)}).outputs["y"][0]) == 2.0
        assert [(v["version"], v["current"]) for v in c.versions("viahttp")] == [(1, False), (2, True)]
        assert c.rollback("viahttp", 1) == 3
        assert float(c.invoke("viahttp", {"x": np.zeros(2)}).outputs["y"][0]) == 1.0


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize(("files", "status", "message"), [
    ({"mymod/handlers.py": HANDLER.format(version=1).encode()}, 400, "holds its spec at its root as one of"),
    ({"workflow.yaml": spec("evil").encode(), "../../etc/evil.py": b"x"}, 400, "'..' part"),
    ({"workflow.yaml": spec("other", handler="os:system").encode(), "mymod/handlers.py": b""}, 400,
     "names module 'os', which the code package does not hold"),
    ({"workflow.yaml": spec("big").encode(), "blob.bin": b"\0" * (2 << 20)}, 400, "expands to more than 1,048,576"),
])
def test_bad_packages_get_a_4xx_and_deploy_nothing(gateway: tuple[LocalRuntime, str, Path], files: dict[str, bytes],
                                                   status: int, message: str) -> None:
    rt, url, _ = gateway
    before = rt.workflows()
    r = httpx.post(f"{url}/v1/workflows", content=_tar(files),
                   headers={"content-type": "application/gzip", "authorization": f"Bearer {TOKEN}"})
    assert r.status_code == status and message in r.json()["message"], r.text
    assert rt.workflows() == before


def test_limits_and_authentication_hold_for_packages(gateway: tuple[LocalRuntime, str, Path]) -> None:
    _, url, _ = gateway
    r = httpx.post(f"{url}/v1/workflows", content=b"\0" * ((1 << 20) + 1),
                   headers={"content-type": "application/gzip", "authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 413 and "max_code_bytes" in r.json()["message"]
    r = httpx.post(f"{url}/v1/workflows", content=_tar({"workflow.yaml": spec("anon").encode()}),
                   headers={"content-type": "application/gzip"})
    assert r.status_code == 401
    with GatewayClient(url, token=TOKEN) as c, pytest.raises(SpecError, match="not a readable tar archive"):
        c.deploy("", code=b"definitely not an archive")


def test_the_cli_deploys_lists_and_rolls_back(gateway: tuple[LocalRuntime, str, Path], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    _, url, token_file = gateway
    spec_file = tmp_path / "wf.yaml"
    spec_file.write_text(spec("bycli"))
    gw = ["--url", url, "--token-file", str(token_file)]
    assert main(["deploy", str(spec_file), "--code", str(code_dir(tmp_path, 1)), *gw]) == 0
    out = capsys.readouterr().out
    assert out.startswith("deployed bycli version 1, code ") and out.rstrip().endswith("(3 files)")
    assert main(["deploy", str(spec_file), "--code", str(code_dir(tmp_path, 2)), *gw]) == 0
    assert "deployed bycli version 2" in capsys.readouterr().out
    assert main(["workflows", "rollback", "bycli", "1", *gw]) == 0
    assert capsys.readouterr().out == "bycli: version 3 is current (the content of version 1)\n"
    assert main(["workflows", "versions", "bycli", *gw]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in lines] == ["1", "2", "*"] and lines[2].endswith("rollback to 1")
