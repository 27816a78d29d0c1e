"""The manager of the scaling testbed: starts one node process per namespace and drives it.

It runs in the root namespace and talks to each node over the node's stdin/stdout (frames of
:mod:`gfaas.scaling.frames`), so control traffic never shares the rate-limited links with the
blocks. Every frame a node sends lands in one queue (:meth:`Manager.next_event`), which the
multicast runner here and the serving loop of :mod:`gfaas.scaling.serving` consume.
"""

from __future__ import annotations

import logging
import os
import queue
import secrets
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from io import BufferedReader
from typing import Any, cast

from ..errors import ConfigError, ProtocolError, ScalingError
from ..models.llm import LlamaConfig, packed_size, preset
from ..policy.multicast import Schedule
from ..pyexec import module_argv
from . import frames as F
from .netns import Testbed
from .warm import warm_orders

log = logging.getLogger("gfaas.scaling")

PORT = 7400



@dataclass
class MulticastResult:
    """What one real multicast run did.

    ``arrivals``: (node, block, src, step, seconds after the start) per accepted block;
    ``transfers``: (step, src, dst, block) as the senders logged them; ``refused``: the refused
    blocks' reports; ``cpu_s``: CPU seconds of every node process during the run; ``starts``: the
    transfers with the second each send started.
    """

    scheme: str
    nodes: int
    blocks: int
    seconds: float
    bound_seconds: float
    arrivals: list[tuple[int, int, int, int, float]]
    transfers: list[tuple[int, int, int, int]]
    refused: list[dict[str, Any]] = field(default_factory=list)
    cpu_s: float = 0.0
    starts: list[tuple[int, int, int, int, float]] = field(default_factory=list)


def step_bound_seconds(schedule: Schedule, sizes: Sequence[int], bytes_per_s: float) -> float:
    """The schedule's time on ideal links: each step lasts as long as its largest block takes at the
    link rate (blocks of whole layers differ in size: the first and last carry the embeddings)."""
    return sum(max(sizes[tr.block] for tr in step) for step in schedule.steps if step) / bytes_per_s


def _cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


class Manager:
    """N node processes in a :class:`Testbed`; nodes ``0..sources-1`` load the model at start (hot).
    A multicast run may use fewer sources; the other loaded nodes then start it empty."""

    def __init__(self, bed: Testbed, cfg: LlamaConfig | str, blocks: int, sources: int = 1, seed: int = 0,
                 floor_s: float = 0.0) -> None:
        self.bed = bed
        self.cfg = preset(cfg) if isinstance(cfg, str) else cfg
        self.blocks = blocks
        self.sources = sources
        self.seed = seed
        self.floor_s = floor_s
        self.sizes = [packed_size(self.cfg, b, blocks) for b in range(blocks)]
        self.events: queue.Queue[tuple[int, F.Frame | None]] = queue.Queue()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.pids: list[int] = []
        self.digests: list[str] = []
        self.logs: list[dict[str, Any]] = []
        self._runs = 0
        self._key = secrets.token_hex(32)

    def __enter__(self) -> Manager:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, timeout: float = 60.0) -> None:
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        for i in range(self.bed.nodes):
            p = subprocess.Popen([*self.bed.exec_argv(i), *module_argv("gfaas.scaling.node")],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
            self.procs.append(p)
            threading.Thread(target=self._read, args=(i, p), daemon=True).start()
        for i in range(self.bed.nodes):
            self.send(i, "setup", {"node": i, "addrs": self.bed.ips, "port": PORT, "config": asdict(self.cfg),
                                   "blocks": self.blocks, "seed": self.seed, "key": self._key,
                                   "hot": i < self.sources, "floor_s": self.floor_s})
        ready: dict[int, dict[str, Any]] = {}
        while len(ready) < self.bed.nodes:
            node, fr = self.next_event(timeout)
            if fr.kind == "ready":
                ready[node] = fr.meta
        self.pids = [int(ready[i]["pid"]) for i in range(self.bed.nodes)]
        self.digests = list(ready[0]["digests"])
        if any(ready[i]["digests"] != self.digests for i in range(self.sources)):
            raise ScalingError("the source nodes hold different copies of the model")

    def _read(self, node: int, p: subprocess.Popen[bytes]) -> None:
        assert p.stdout is not None
        try:
            while True:
                fr = F.read_frame(cast(BufferedReader, p.stdout), 1 << 30)
                if fr is None:
                    break
                self.events.put((node, fr))
        except (OSError, ProtocolError) as exc:
            log.warning("node %d: %s", node, exc)
        self.events.put((node, None))

    def send(self, node: int, kind: str, meta: dict[str, Any], payload: bytes | memoryview = b"") -> None:
        stdin = self.procs[node].stdin
        assert stdin is not None
        F.write_frame(stdin, kind, meta, payload)

    def next_event(self, timeout: float) -> tuple[int, F.Frame]:
        """The next frame from any node (see :meth:`poll_event`); ScalingError after ``timeout``."""
        ev = self.poll_event(timeout)
        if ev is None:
            raise ScalingError(f"no answer from the nodes within {timeout:.0f} s")
        return ev

    def poll_event(self, timeout: float) -> tuple[int, F.Frame] | None:
        """The next frame from any node, or None after ``timeout``; ``log`` frames are kept in
        :attr:`logs`, ``error`` frames and exits raise :class:`ScalingError`."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                node, fr = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if fr is None:
                raise ScalingError(f"node {node} exited (code {self.procs[node].poll()})")
            if fr.kind == "error":
                raise ScalingError(str(fr.meta.get("message")))
            if fr.kind == "log":
                self.logs.append({"node": node, **fr.meta})
                log.debug("node %d: %s", node, fr.meta.get("message"))
                continue
            return node, fr

    def start_multicast(self, schedule: Schedule, garble: Mapping[int, Sequence[tuple[int, str]]] | None = None
                        ) -> tuple[int, float]:
        """Hand every node its part of ``schedule`` (destinations start empty) and start it once all are
        armed; returns (run id, start time on the monotonic clock the nodes share)."""
        if schedule.nodes != self.bed.nodes or schedule.blocks != self.blocks or schedule.sources > self.sources:
            raise ConfigError(f"schedule for {schedule.nodes} nodes / {schedule.blocks} blocks / "
                             f"{schedule.sources} sources does not fit this testbed ({self.bed.nodes} nodes, "
                             f"{self.blocks} blocks, {self.sources} loaded)")
        run = self._runs
        self._runs += 1
        sends: list[list[list[int]]] = [[] for _ in range(schedule.nodes)]
        recvs: list[list[list[int]]] = [[] for _ in range(schedule.nodes)]
        for t, step in enumerate(schedule.steps):
            for tr in step:
                sends[tr.src].append([t, tr.dst, tr.block])
                recvs[tr.dst].append([t, tr.src, tr.block])
        for i in range(schedule.nodes):
            self.send(i, "multicast", {"run": run, "sends": sends[i], "recvs": recvs[i], "digests": self.digests,
                                       "repair_from": 0, "hold": i < schedule.sources,
                                       "garble": [list(g) for g in (garble or {}).get(i, [])]})
        # Two phases: every node connects to its destinations and pre-allocates its buffers, then all
        # start together, so the measured time is the transfers' alone.
        armed: set[int] = set()
        while len(armed) < schedule.nodes:
            node, fr = self.next_event(60.0)
            if fr.kind == "armed" and fr.meta.get("run") == run:
                armed.add(node)
        t0 = time.monotonic()
        for i in range(schedule.nodes):
            self.send(i, "start", {"run": run})
        return run, t0

    def multicast(self, schedule: Schedule, garble: Mapping[int, Sequence[tuple[int, str]]] | None = None,
                  timeout: float = 120.0) -> MulticastResult:
        """Run ``schedule`` over the links and wait until every node is done."""
        cpu0 = sum(_cpu_seconds(p) for p in self.pids)
        first_log = len(self.logs)
        run, t0 = self.start_multicast(schedule, garble)
        arrivals: list[tuple[int, int, int, int, float]] = []
        transfers: list[tuple[int, int, int, int]] = []
        starts: list[tuple[int, int, int, int, float]] = []
        done: set[int] = set()
        while len(done) < schedule.nodes:
            node, fr = self.next_event(timeout)
            if fr.meta.get("run") != run:
                continue
            if fr.kind == "block":
                m = fr.meta
                arrivals.append((node, m["block"], m["src"], m["step"], m["t"] - t0))
            elif fr.kind == "done":
                done.add(node)
                transfers.extend((s, node, d, b) for s, d, b, _, _ in fr.meta["sent"])
                starts.extend((s, node, d, b, t - t0) for s, d, b, t, _ in fr.meta["sent"])
        seconds = max((a[4] for a in arrivals), default=0.0)
        bound = step_bound_seconds(schedule, self.sizes, self.bed.link.bytes_per_s)
        refused = [e for e in self.logs[first_log:] if e.get("refused")]
        cpu = sum(_cpu_seconds(p) for p in self.pids) - cpu0
        return MulticastResult(schedule.scheme, schedule.nodes, schedule.blocks, seconds, bound, arrivals,
                               sorted(transfers), refused, cpu, sorted(starts))

    def start_warm(self, nodes: Sequence[int], bytes_per_s: float) -> tuple[int, float]:
        """A warm scale-out: ``nodes`` copy the model from their host-memory caches at the emulated
        host-to-device rate ``bytes_per_s``, each in its :func:`~gfaas.scaling.warm.warm_orders`
        order, reporting every block as it lands; (run id, start time)."""
        run = self._runs
        self._runs += 1
        t0 = time.monotonic()
        for n, order in zip(nodes, warm_orders(len(nodes), self.blocks), strict=True):
            self.send(n, "warm", {"run": run, "order": order, "bytes_per_s": bytes_per_s})
        return run, t0

    def warm_start(self, nodes: Sequence[int], timeout: float = 60.0) -> tuple[float, dict[int, bool]]:
        """Ask ``nodes`` to start from their host-memory cache (the warm tier); (seconds until the
        last answered, node -> hit)."""
        t0 = time.monotonic()
        for n in nodes:
            self.send(n, "warm", {})
        hits: dict[int, bool] = {}
        while len(hits) < len(nodes):
            node, fr = self.next_event(timeout)
            if fr.kind == "warmed":
                hits[node] = bool(fr.meta.get("hit"))
        return time.monotonic() - t0, hits

    def close(self) -> None:
        for i, p in enumerate(self.procs):
            if p.poll() is None:
                try:
                    self.send(i, "stop", {})
                    assert p.stdin is not None
                    p.stdin.close()
                except (OSError, ValueError):
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        self.procs.clear()
