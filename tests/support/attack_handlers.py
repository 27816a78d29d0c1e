"""Handlers that act as hostile function code (tests/security/test_sandbox.py, issue 14 row 1).

Each probe tries one way for a function to reach what is not its own and reports 1 if the kernel
refused it, 0 if it got through; the test asserts which ones must be refused.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import numpy as np


def _refused(action: Any) -> int:
    try:
        action()
    except PermissionError:
        return 1
    except OSError as exc:  # EPERM from a syscall that is not a file access
        return 1 if exc.errno in (1, 13) else 0
    return 0


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(64)


def _connect(path: str) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.connect(path)
    finally:
        s.close()


def probe(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """Try to read the node's state and tokens, the daemon's and another tenant's process, and root."""
    p = ctx.params
    state, daemon, victim = str(p["state_dir"]), int(p["daemon_pid"]), int(p["victim_pid"])
    ctx.get(inputs["x"])
    out = {
        "state_list": _refused(lambda: os.listdir(state)),
        "admin_token": _refused(lambda: _read(os.path.join(state, "admin.token"))),
        "registry": _refused(lambda: _read(os.path.join(state, "invocations.json"))),
        "daemon_socket": _refused(lambda: _connect(str(p["socket_path"]))),
        "daemon_environ": _refused(lambda: _read(f"/proc/{daemon}/environ")),
        "daemon_mem": _refused(lambda: _read(f"/proc/{daemon}/mem")),
        "daemon_fds": _refused(lambda: os.listdir(f"/proc/{daemon}/fd")),
        "victim_environ": _refused(lambda: _read(f"/proc/{victim}/environ")),
        "victim_signal": _refused(lambda: os.kill(victim, 0)),
        "become_root": _refused(lambda: os.setuid(0)),
    }
    return {"y": np.array([os.getuid(), os.getgid()], dtype=np.int64),
            **{k: np.int64(v) for k, v in out.items()}}


PROBES = ("state_list", "admin_token", "registry", "daemon_socket", "daemon_environ", "daemon_mem",
          "daemon_fds", "victim_environ", "victim_signal", "become_root")


def whoami(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    ctx.get(inputs["x"])
    return {"y": np.array([os.getuid(), os.getpid()], dtype=np.int64)}
