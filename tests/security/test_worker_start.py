"""Issue 36: a worker's root phase leaves nothing behind, forked from the template or spawned.

Two attacks from the review of a worker's start as root, replayed: a module planted in the directory
the runtime was started from (``python -m`` put it first on ``sys.path``, and the next worker start
imported it as uid 0), and descriptors kept from the root phase (onnxruntime's telemetry database
under root's HOME, a duplicate of the runtime's stderr through which a function wrote a forged
gateway log line).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gfaas.runtime.local import LocalRuntime, RuntimeConfig

pytestmark = pytest.mark.timeout(180)

SUPPORT = str(Path(__file__).resolve().parents[1] / "support")
FN = """
name: {name}
inputs: {{x: null}}
outputs: {{out: f.y}}
functions:
  - {{name: f, kind: cpu, handler: "{handler}", params: {params}, inputs: {{x: input.x}}, outputs: {outputs}}}
"""


@pytest.fixture
def support(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(SUPPORT)
    monkeypatch.setenv("PYTHONPATH", SUPPORT)


@pytest.mark.parametrize("fork_server", [True, False], ids=["forked", "spawned"])
def test_a_module_planted_in_the_runtimes_directory_is_never_imported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, support: None, fork_server: bool) -> None:
    """The runtime runs from a world-writable directory where a tenant planted ``msgspec.py`` (which
    every worker imports first thing); workers start and serve, and the planted module never runs.
    The same directory does take over a plain ``python -c`` (the probe can tell)."""
    planted = tmp_path / "shared"
    planted.mkdir()
    planted.chmod(0o1777)
    marker = tmp_path / "ran-as"
    (planted / "msgspec.py").write_text(f"import os\nopen({str(marker)!r}, 'w').write(str(os.getuid()))\n")
    monkeypatch.chdir(planted)
    with LocalRuntime(RuntimeConfig(fork_server=fork_server)) as rt:
        rt.deploy(FN.format(name="plain", handler="rt_handlers:negate", params="{}", outputs="{y: null}"))
        r = rt.invoke("plain", {"x": np.arange(3.0)}, timeout=60)
        assert r.ok, r.error
        np.testing.assert_array_equal(r.outputs["out"], -np.arange(3.0))
    assert not marker.exists(), f"the planted module ran as uid {marker.read_text()}"
    subprocess.run([sys.executable, "-c", "import msgspec"], cwd=planted, check=False)
    assert marker.exists()  # a non-isolated interpreter started there would have run it


@pytest.mark.root
@pytest.mark.parametrize("fork_server", [True, False], ids=["forked", "spawned"])
def test_a_sandboxed_function_holds_only_its_own_descriptors(
        support: None, fork_server: bool, capfd: pytest.CaptureFixture[str]) -> None:
    """A sandboxed function lists its descriptors: stdio (its captured output), its sockets, nothing
    else; none is the runtime's stderr or a file. The forged log line it writes into each one lands in
    its own log, never on the runtime's stderr."""
    from attack_handlers import FORGED  # type: ignore[import-not-found]

    st = os.fstat(2)
    outs = "{y: null, fds: {shape: []}, files: {shape: []}, runtime_stderr: {shape: []}, other: {shape: []}}"
    spec = FN.format(name="fds", handler="attack_handlers:descriptors",
                     params=f"{{stderr_dev: {st.st_dev}, stderr_ino: {st.st_ino}}}", outputs=outs)
    with LocalRuntime(RuntimeConfig(fork_server=fork_server, sandbox="uid")) as rt:
        rt.deploy(spec)
        r = rt.invoke("fds", {"x": np.zeros(2)}, timeout=60)
        assert r.ok, r.error
        got: dict[str, Any] = {k.split(".", 1)[1]: int(v) for k, v in r.scalars.items()}
        logs = rt.logs("fds", "f")
    assert int(r.outputs["out"][0]) >= 200000  # it ran sandboxed
    assert got["runtime_stderr"] == 0 and got["files"] == 0 and got["other"] == 0, got
    # stdin, stdout, stderr, the two pipes' read ends, its socket to the runtime and the attached
    # daemon connection: seven at most.
    assert got["fds"] <= 7, got
    assert FORGED not in capfd.readouterr().err
    assert any(FORGED in ln["text"] for ln in logs), logs
