"""``gfaas serve`` as a user starts it: a child process whose stderr says where it listens and where its
token file is; stopped with SIGTERM (or killed by the test)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

LISTEN = re.compile(r"gfaas gateway listening on .*; OpenAPI: (http://\S+)/docs;")
TOKEN = re.compile(r"bearer token in (\S+);")


class Served:
    """``gfaas serve ARGS`` until the ``with`` block ends; ``url``, ``token_file``, ``stderr`` (lines so far)."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: str | Path | None = None,
                 start_timeout: float = 180.0) -> None:
        self.args, self.env, self.cwd, self.start_timeout = args, env, cwd, start_timeout
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.token_file = ""
        self.stderr: list[str] = []

    def __enter__(self) -> Served:
        self.proc = subprocess.Popen([sys.executable, "-m", "gfaas", "serve", *self.args], env=self.env, cwd=self.cwd,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert self.proc.stderr is not None
        deadline = time.monotonic() + self.start_timeout
        while not self.url and time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.stderr.append(line)
            m = LISTEN.search(line)
            if m:
                self.url = m.group(1)
                t = TOKEN.search(line)
                self.token_file = t.group(1) if t else ""
        if not self.url:
            self.__exit__()
            raise AssertionError("gfaas serve did not start:\n" + "".join(self.stderr))
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its new parent, does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def env_with(**extra: str) -> dict[str, str]:
    env = {**os.environ, **extra}
    env.pop("GFAAS_URL", None)
    return env
