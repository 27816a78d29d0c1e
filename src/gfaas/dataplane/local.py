"""Start and stop node daemons as separate processes (used by the CLI, tests, demo, benchmarks)."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import asdict

from ..config import NodeConfig
from ..errors import ConfigError, DaemonUnavailable
from ..lifeline import pipe
from ..pyexec import module_argv
from ..secfiles import private_dir


def pid_path(config: NodeConfig) -> str:
    return os.path.join(config.state_dir, "daemon.pid")


def is_serving(socket_path: str) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.connect(socket_path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def daemon_command(config_fd: int, lifeline_fd: int | None = None) -> list[str]:
    """The daemon's command line: its configuration (which may hold a Redis password) comes through
    the inherited descriptor ``config_fd``, never in argv, which every local user can read;
    ``lifeline_fd``: the read end of a pipe whose write end only the owner holds (see start_daemon)."""
    cmd = module_argv("gfaas.dataplane.node_main", "--config-fd", str(config_fd))
    return cmd if lifeline_fd is None else [*cmd, "--lifeline-fd", str(lifeline_fd)]


def _config_pipe(config: NodeConfig) -> int:
    """A pipe's read end holding ``config`` as JSON (written whole: it fits the pipe's buffer)."""
    data = json.dumps({k: v for k, v in asdict(config).items() if k != "extra"}).encode()
    if len(data) > 65536:
        raise ConfigError(f"node configuration of {len(data)} bytes is too large to pass to the daemon")
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        os.write(w, data)
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)
    return r


def start_daemon(config: NodeConfig, timeout: float = 15.0, log_path: str | None = None,
                 netns: str | None = None, lifeline: bool = False) -> subprocess.Popen[bytes]:
    """Spawn a daemon process for ``config`` and wait until its socket answers.

    ``lifeline``: the daemon ends when this process does, however it ends (SIGKILL included): it holds
    the read end of a pipe whose only write end stays here (close-on-exec, so no other child inherits
    it) and stops once the pipe reports end-of-file, which the kernel delivers when the last write end
    closes. The write end is kept as ``proc.lifeline``; closing it stops the daemon too. Without it
    (``gfaas node start``) the daemon outlives its starter until ``stop_daemon``."""
    if is_serving(config.socket_path):
        raise DaemonUnavailable(f"a node daemon already serves {config.socket_path}; stop it first")
    private_dir(config.state_dir, "state directory")  # ConfigError naming the fix if another user's
    try:
        os.unlink(pid_path(config))  # stale, from a daemon that was killed
    except FileNotFoundError:
        pass
    log_path = log_path or os.path.join(config.state_dir, "daemon.log")
    cfg_fd = _config_pipe(config)
    life_r, life_w = pipe() if lifeline else (None, None)
    cmd = daemon_command(cfg_fd, life_r)
    if netns:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    # Never through a symlink someone planted where the log goes.
    try:
        log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        for fd in (cfg_fd, life_r, life_w):
            if fd is not None:
                os.close(fd)
        if exc.errno == errno.ELOOP:
            raise ConfigError(f"log file {log_path} is a symlink; it is refused: remove it") from None
        raise
    passed = (cfg_fd,) if life_r is None else (cfg_fd, life_r)
    try:
        proc = subprocess.Popen(cmd, stdout=log_fd, stderr=log_fd, stdin=subprocess.DEVNULL,
                                start_new_session=True, pass_fds=passed)
    except BaseException:
        if life_w is not None:
            os.close(life_w)
        raise
    finally:
        os.close(log_fd)
        for fd in passed:
            os.close(fd)
    proc.lifeline = life_w  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with open(log_path, "rb") as f:
                tail = f.read()[-2000:].decode(errors="replace")
            raise DaemonUnavailable(f"node daemon exited with code {proc.returncode} at start:\n{tail}")
        if is_serving(config.socket_path) and os.path.exists(pid_path(config)):
            return proc
        time.sleep(0.02)
    proc.kill()
    raise DaemonUnavailable(f"node daemon did not start serving {config.socket_path} within {timeout} s")


def read_pid(config: NodeConfig) -> int | None:
    try:
        with open(pid_path(config)) as f:
            return int(f.read().strip())
    except (FileNotFoundError, ValueError):
        return None


def stop_daemon(config: NodeConfig, timeout: float = 10.0) -> bool:
    """SIGTERM the daemon of ``config`` and wait for it to go; returns False if none was running."""
    pid = read_pid(config)
    if pid is None:
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        os.unlink(pid_path(config))
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.02)
    else:
        os.kill(pid, signal.SIGKILL)
    try:
        os.unlink(pid_path(config))
    except FileNotFoundError:
        pass
    return True


class LocalNode:
    """A daemon in a child process for the duration of a ``with`` block; it also ends when this process
    does, even by SIGKILL (``start_daemon(lifeline=True)``), so it never outlives its owner orphaned."""

    def __init__(self, config: NodeConfig, netns: str | None = None) -> None:
        self.config = config
        self.netns = netns
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LocalNode:
        self.proc = start_daemon(self.config, netns=self.netns, lifeline=True)
        return self

    def _close_lifeline(self) -> None:
        fd = getattr(self.proc, "lifeline", None)
        if fd is not None:
            os.close(fd)
            self.proc.lifeline = None  # type: ignore[union-attr]

    def kill(self) -> None:
        """SIGKILL the daemon (crash simulation)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self._close_lifeline()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._close_lifeline()
