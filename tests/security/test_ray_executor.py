"""Issue 37 row 1: under the Ray executor, function code ran as Ray's user (root in the Kubernetes
manifests), read the node's admin token and connected as Admin; the gateway took code packages in
that mode. Now the Ray executor refuses code packages, and the node daemon can give its socket to a
group so that Ray's actors run as a non-root member of it, reaching the socket and nothing of the
daemon's state (deploy/k8s, pinned by tests/unit/test_k8s_manifests.py)."""

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


def test_the_ray_executor_refuses_code_packages(tmp_path: Any) -> None:
    """Before anything is unpacked or stored: a clear error naming the executor and what to do."""
    (tmp_path / "mine.py").write_text("def double(ctx, inputs):\n    return {'y': ctx.get(inputs['x']) * 2}\n")
    host = SimpleNamespace(config=RuntimeConfig(executor="ray"))  # deploy() reads nothing else first
    for code in (str(tmp_path), b"not even an archive"):
        with pytest.raises(SpecError, match="code packages are not accepted with the ray executor: its actors run "
                                            "functions as Ray's own user, without the per-workflow sandbox"):
            Deployments.deploy(host, SPEC, code)  # type: ignore[arg-type]


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
