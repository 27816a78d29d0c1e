"""Issue 37 row 1: under the Ray executor, function code ran as Ray's user (root in the Kubernetes
manifests), read the node's admin token and connected as Admin; the gateway took code packages in
that mode. Now a code package's functions run under Ray only inside a sandboxed worker process started
by the actor on its machine (a uid per workflow, SandboxedActor; refused with the sandbox off), and the
node daemon can give its socket to a group so that Ray's actors run as a non-root member of it,
reaching the socket and nothing of the daemon's state (deploy/k8s, pinned by
tests/unit/test_k8s_manifests.py)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from gfaas.errors import SpecError
from gfaas.runtime.config import RuntimeConfig
from gfaas.runtime.deployments import Deployments

NOBODY = 65534
GROUP = 2000

SPEC = """
name: pkg
inputs: {x: null}
outputs: {y: f.y}
functions:
  - {name: f, kind: cpu, handler: "mine:double", inputs: {x: input.x}, outputs: {y: null}}
"""


def test_the_ray_executor_refuses_code_packages_with_the_sandbox_off(tmp_path: Any) -> None:
    """Before anything is unpacked or stored: a clear error naming the sandbox and what to do (with it
    on, a package's functions run sandboxed on their machines: SandboxedActor, below)."""
    (tmp_path / "mine.py").write_text("def double(ctx, inputs):\n    return {'y': ctx.get(inputs['x']) * 2}\n")
    host = SimpleNamespace(config=RuntimeConfig(executor="ray", sandbox="none"), _tenants=None)
    for code in (str(tmp_path), b"not even an archive"):
        with pytest.raises(SpecError, match="code packages need the sandbox .* and it is off"):
            Deployments.deploy(host, SPEC, code)  # type: ignore[arg-type]


def _actor_init(sandbox_uid: int, digest: str) -> bytes:
    from gfaas.runtime.worker import Init, _enc

    return _enc.encode(Init("pkg", "f", SPEC, "small", {"kind": "gfaas", "socket_path": "/nonexistent.sock"}, 1,
                            sandbox_uid=sandbox_uid, sandbox_gid=sandbox_uid, code_dir=f"/gateway/code/pkg/{digest}"))


def test_a_sandboxed_actor_refuses_a_package_that_is_not_the_one_named(tmp_path: Any,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The package travels beside the Init that names its digest: bytes of another package (or altered
    ones) are refused before anything is stored or started; so is a start outside a gfaas node's Ray
    node (no daemon to bind), and one with no workflow uid to run under."""
    from gfaas.errors import ConfigError
    from gfaas.runtime.codepkg import pack_dir, read_archive
    from gfaas.runtime.ray_executor import NODE_SOCKET_ENV, NODE_STATE_ENV, SandboxedActor

    (tmp_path / "mine.py").write_text("def double(ctx, inputs):\n    return {'y': 2}\n")
    good = pack_dir(tmp_path)
    digest = read_archive(good).digest
    (tmp_path / "mine.py").write_text("import os\ndef double(ctx, inputs):\n    os.system('id')\n")
    other = pack_dir(tmp_path)
    monkeypatch.delenv(NODE_SOCKET_ENV, raising=False)
    with pytest.raises(ConfigError, match="gfaas node start --ray-address"):
        SandboxedActor(_actor_init(200_000, digest), good)
    monkeypatch.setenv(NODE_SOCKET_ENV, "/nonexistent.sock")
    monkeypatch.setenv(NODE_STATE_ENV, str(tmp_path / "state"))
    with pytest.raises(ConfigError, match="runs only sandboxed"):
        SandboxedActor(_actor_init(-1, digest), good)
    if os.geteuid() != 0:
        pytest.skip("the digest check comes after the root check (a sandboxed actor runs as root)")
    with pytest.raises(ConfigError, match=f"has digest {read_archive(other).digest[:12]}, not {digest[:12]}"):
        SandboxedActor(_actor_init(200_000, digest), other)


def test_the_code_root_of_a_machine_is_refused_when_someone_else_made_it(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Any) -> None:
    """Another user who made /tmp/gfaas-code-<uid> first would own the packages stored there."""
    import tempfile

    from gfaas.errors import ConfigError
    from gfaas.runtime import ray_executor as R

    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    assert R.code_root() == str(tmp_path / f"gfaas-code-{os.geteuid()}")
    if os.geteuid() != 0:
        return
    squatted = tmp_path / f"gfaas-code-{os.geteuid()}"
    os.chown(squatted, NOBODY, NOBODY)
    with pytest.raises(ConfigError, match="is not a directory of uid 0"):
        R.code_root()
    os.rmdir(squatted)
    os.symlink(tmp_path, squatted)
    with pytest.raises(ConfigError, match="is not a directory of uid 0"):
        R.code_root()


_PROBE = """
import os, socket, sys
groups = [int(g) for g in sys.argv[3].split(",") if g]
os.setgroups(groups); os.setresgid(65534, 65534, 65534); os.setresuid(65534, 65534, 65534)
out = []
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
try:
    s.connect(sys.argv[1]); out.append("connect:ok")
except OSError as exc:
    out.append(f"connect:{exc.errno}")
try:
    open(os.path.join(sys.argv[2], "admin.token")).read(); out.append("token:ok")
except OSError as exc:
    out.append(f"token:{exc.errno}")
print(" ".join(out))
"""


@pytest.mark.root
def test_a_socket_group_lets_its_members_connect_and_nothing_more(make_config: Any, run_dir: str) -> None:
    """``socket_group``: the socket 0660 and its directory 0710, both the group's; the state directory
    stays 0700. A process of another uid in the group connects and cannot read the admin token; one
    outside the group can do neither."""
    from gfaas.dataplane.local import LocalNode

    os.chmod(run_dir, 0o711)  # the test's own directory: anyone may pass through, as /run does
    sock = os.path.join(run_dir, "sock", "node.sock")
    cfg = make_config(socket_path=sock, state_dir=os.path.join(run_dir, "state"), socket_group=GROUP)
    with LocalNode(cfg):
        st, folder, state = os.stat(sock), os.stat(os.path.dirname(sock)), os.stat(cfg.state_dir)
        assert (stat.S_IMODE(st.st_mode), st.st_gid) == (0o660, GROUP)
        assert (stat.S_IMODE(folder.st_mode), folder.st_gid) == (0o710, GROUP)
        assert stat.S_IMODE(state.st_mode) == 0o700

        def probe(groups: list[int]) -> str:
            # started as root (the interpreter may sit where nobody cannot reach), dropped before probing
            r = subprocess.run([sys.executable, "-I", "-c", _PROBE, sock, cfg.state_dir, ",".join(map(str, groups))],
                               capture_output=True, text=True, timeout=30, cwd="/")
            return r.stdout.strip() or r.stderr

        assert probe([GROUP]) == "connect:ok token:13"
        assert probe([]) == "connect:13 token:13"
