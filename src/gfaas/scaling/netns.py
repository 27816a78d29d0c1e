"""A rate-limited test network on one machine: N network namespaces joined by one bridge.

Layout (names carry a random token, so parallel runs never collide, and nothing is added to the
root namespace)::

    gfs<tok>h (hub)      bridge br0, one port v<i> per node
    gfs<tok>n<i> (node)  eth0 = 10.77.0.<i+1>/24, the other end of v<i>

Each node gets the single-port model the multicast schedules assume: ``tc htb`` on its ``eth0``
limits what it sends, and ``htb`` on ``v<i>`` (the hub's egress towards the node) limits what it
receives, both to ``rate_mbit``. ``netem`` does not work on this kernel, so links are rate-limited,
not delayed. Jumbo frames (MTU 9000) keep the per-packet CPU cost of the 2-core host low, so the
links, not the CPUs, bound a transfer.

:class:`Testbed` is a context manager; its set-up undoes what it made when a step fails, and
:meth:`Testbed.close` deletes every namespace (which removes their links) and is idempotent.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass

from ..errors import ConfigError, ScalingError

log = logging.getLogger("gfaas.scaling")

PREFIX = "gfs"
MTU = 9000
SUBNET = "10.77.0"



def check_capable() -> None:
    """Raise :class:`ScalingError` with the fix when this process cannot build a testbed."""
    if os.geteuid() != 0:
        raise ScalingError("network namespaces need root; run it as root, e.g. "
                               "`sudo .venv/bin/gfaas scale demo`")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise ScalingError(f"the `{tool}` tool is missing; install iproute2")


def _run(*argv: str) -> None:
    res = subprocess.run(list(argv), capture_output=True, timeout=20)
    if res.returncode:
        raise ScalingError(f"`{' '.join(argv)}` failed: {res.stderr.decode(errors='replace').strip()}")


def list_namespaces(prefix: str = PREFIX) -> list[str]:
    """Namespaces whose names start with ``prefix`` (for leak checks)."""
    res = subprocess.run(["ip", "netns", "list"], capture_output=True, timeout=10, text=True)
    return [line.split()[0] for line in res.stdout.splitlines() if line.startswith(prefix)]


@dataclass(frozen=True)
class Link:
    """A node's ports: ``rate_mbit`` each way (10^6 bit/s, counted on frames as tbf counts them)."""

    rate_mbit: float

    @property
    def bytes_per_s(self) -> float:
        return self.rate_mbit * 1e6 / 8

    def shaping(self) -> tuple[str, int, int]:
        """(rate, burst bytes, queue bytes): a burst of one jumbo GSO super-packet (64 KiB) at least,
        or 4 ms of traffic; a queue of 100 ms, so TCP does not lose packets while the bucket drains."""
        burst = max(1 << 16, int(self.bytes_per_s * 0.004))
        limit = max(4 * burst, int(self.bytes_per_s * 0.1))
        return f"{int(self.rate_mbit * 1e6)}bit", burst, limit


class Testbed:
    """``nodes`` namespaces on a bridge, each link limited to ``rate_mbit`` both ways."""

    __test__ = False  # not a pytest test class, despite its name

    def __init__(self, nodes: int, rate_mbit: float, token: str | None = None) -> None:
        if not 1 <= nodes <= 200:
            raise ConfigError(f"nodes={nodes}: a testbed has 1..200 nodes")
        if not rate_mbit > 0:
            raise ConfigError(f"rate_mbit={rate_mbit}: give a link rate > 0")
        self.nodes = nodes
        self.link = Link(rate_mbit)
        self.token = token or secrets.token_hex(3)
        self.hub = f"{PREFIX}{self.token}h"
        self.namespaces = [f"{PREFIX}{self.token}n{i}" for i in range(nodes)]
        self.ips = [f"{SUBNET}.{i + 1}" for i in range(nodes)]
        self._made: list[str] = []

    def __enter__(self) -> Testbed:
        check_capable()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        for ns in (self.hub, *self.namespaces):
            _run("ip", "netns", "add", ns)
            self._made.append(ns)
        h = self.hub
        _run("ip", "-n", h, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", h, "link", "set", "br0", "mtu", str(MTU), "up")
        for i, ns in enumerate(self.namespaces):
            port = f"v{i}"
            _run("ip", "-n", h, "link", "add", port, "mtu", str(MTU), "type", "veth", "peer", "name", "eth0",
                 "mtu", str(MTU), "netns", ns)
            _run("ip", "-n", h, "link", "set", port, "master", "br0", "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.ips[i]}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            # A link idles between a node's steps; restarting slow start after each idle period would
            # add a ramp to every step (the sysctl is per namespace).
            _run("ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.tcp_slow_start_after_idle=0")
            # Start with large socket buffers: on a busy 2-CPU host a receiver can be off the CPU for
            # tens of ms, and a young connection's auto-tuned window would stall the link meanwhile.
            _run("ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.tcp_rmem=4096 8388608 33554432")
            _run("ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.tcp_wmem=4096 4194304 33554432")
            self._shape(ns, "eth0")
            self._shape(h, port)
        log.debug("testbed %s: %d nodes at %.0f Mbit/s", self.token, self.nodes, self.link.rate_mbit)

    def _shape(self, ns: str, dev: str) -> None:
        """Limit ``dev``'s egress to the link rate (htb). Pure ACKs and other packets under 256 bytes
        get a class of their own that goes first: a node's ACKs for what it receives share its send
        port with its own data, and behind a queue of data they would throttle its incoming transfer
        (they are ~1% of the bytes with jumbo frames)."""
        tc = ["ip", "netns", "exec", ns, "tc"]
        rate, burst, limit = self.link.shaping()
        common = ["burst", str(burst), "cburst", str(burst), "quantum", str(4 * MTU)]
        _run(*tc, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "20")
        _run(*tc, "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", rate, "ceil", rate,
             *common)
        _run(*tc, "class", "add", "dev", dev, "parent", "1:1", "classid", "1:10", "htb", "rate",
             f"{max(1, int(self.link.rate_mbit * 1e4))}bit", "ceil", rate, "prio", "0", *common)
        _run(*tc, "class", "add", "dev", dev, "parent", "1:1", "classid", "1:20", "htb", "rate", rate, "ceil", rate,
             "prio", "1", *common)
        _run(*tc, "qdisc", "add", "dev", dev, "parent", "1:20", "bfifo", "limit", str(limit))
        _run(*tc, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
             "match", "u16", "0x0000", "0xff00", "at", "2", "flowid", "1:10")

    def exec_argv(self, node: int) -> list[str]:
        """The command prefix that runs a program inside node ``node``'s namespace."""
        return ["ip", "netns", "exec", self.namespaces[node]]

    def close(self) -> None:
        """Delete every namespace this testbed made (their links go with them)."""
        while self._made:
            ns = self._made.pop()
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
