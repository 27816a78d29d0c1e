"""The consumer machine's side of ``gfaas bench pull`` (:mod:`gfaas.bench.pull`), run with
``python -m gfaas.bench.pull_driver`` inside machine m2's namespace of a Ray-less
:class:`~gfaas.deploy.netlab.NetLab`; machine m1 holds the objects and runs the raw TCP sender.

stdin: ``{"lab": LabInfo, "sizes", "repeats", "sender": "ip:port", "piece", "out"}``; progress on stderr; the
samples (JSON) written to ``out``.

Per size and round, interleaved so all three see the same load:

* ``tcp``: one raw TCP stream, m1 -> m2: this process asks the sender for ``n`` bytes and ``recv_into``
  a buffer touched beforehand until the last byte is in (the sender ``sendall``s from a touched buffer);
  each call moves at most ``piece`` bytes.
* ``warm``: a gfaas pull as a function sees it: m1's producer put the tensor (untimed, published in the
  directory before the clock starts), m2's consumer ``get`` makes m2's daemon look it up and pull it
  from m1's transfer server, until the consumer holds the array. The same workflow every round, so
  m2's daemon lands the bytes in a segment of the workflow it used before (a deployed workflow's
  steady state).
* ``cold``: the same under a new workflow every round: the bytes land in freshly allocated memory,
  as every pull did before segments were reused for pulls.
* ``engine`` (when ``engine`` is given): Mooncake's transfer engine reads the bytes from m1's registered
  buffer (:mod:`.te_peer`, one process on each machine, started by the engine's interpreter).
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import time
import uuid
from typing import Any

import numpy as np

PRODUCER, CONSUMER = "producer", "consumer"
# Before each timed transfer: the daemons free what the last one left (an invocation's end) in the
# background, which would otherwise land on whichever system runs next.
SETTLE_S = 0.1


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class TcpReader:
    """The receiving end of the raw stream (one connection for the whole run, as the puller keeps its own)."""

    def __init__(self, address: str, most: int, piece: int) -> None:
        self.piece = piece
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = memoryview(bytearray(most))
        self.buf[:] = b"\x01" * most  # touched: the stream lands in memory that exists

    def read(self, n: int) -> float:
        t0 = time.perf_counter()
        self.sock.sendall(struct.pack("!Q", n))
        got = 0
        while got < n:
            k = self.sock.recv_into(self.buf[got:min(n, got + self.piece)])
            if not k:
                raise ConnectionError(f"the sender closed after {got} of {n} bytes")
            got += k
        return time.perf_counter() - t0


class Gfaas:
    """m1's producer and m2's consumer, each through its node's socket with an invocation's tokens."""

    def __init__(self, lab: dict[str, Any]) -> None:
        from ..config import NodeConfig
        from ..dataplane.client import Admin
        from ..dataplane.directory import redis_client
        from ..dataplane.peer_auth import PeerKey

        self.key = PeerKey.from_file(lab["cluster_key_file"])
        self.nodes = lab["nodes"]
        self.admins = {m: Admin(self.nodes[m]["socket"], state_dir=self.nodes[m]["state_dir"]) for m in ("m1", "m2")}
        self.directory = redis_client(NodeConfig(node_id="bench", redis_url=lab["redis_url"],
                                                 cluster_key_file=lab["cluster_key_file"],
                                                 redis_password_file=lab["redis_password_file"]), 10.0)

    def pull(self, workflow: str, nbytes: int, seq: int) -> float:
        from ..dataplane.client import connect
        from ..dataplane.directory import obj_key
        from ..dataplane.ids import DataRef

        inv = uuid.uuid4().hex
        tokens = self.key.function_tokens(inv, [PRODUCER, CONSUMER])
        for a in self.admins.values():
            a.open_invocation(workflow, [PRODUCER, CONSUMER], inv, tokens)
        try:
            x = np.full(nbytes, seq % 251, dtype=np.uint8)
            x[:8] = np.frombuffer(np.int64(seq).tobytes(), dtype=np.uint8)
            with connect(socket_path=self.nodes["m1"]["socket"], token=tokens[PRODUCER]) as prod:
                ref = prod.put(x, consumers=[CONSUMER])
            deadline = time.monotonic() + 10
            while not self.directory.exists(obj_key(DataRef.parse(str(ref)).id)):  # published: not timed
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{ref} was not published in the directory within 10 s")
                time.sleep(0.002)
            with connect(socket_path=self.nodes["m2"]["socket"], token=tokens[CONSUMER]) as cons:
                t0 = time.perf_counter()
                y = cons.get(ref)
                took = time.perf_counter() - t0
                if y.nbytes != nbytes or y[8] != x[8] or not np.array_equal(y[:8], x[:8]) or y[-1] != x[-1]:
                    raise RuntimeError(f"the pulled copy of {ref} differs from what was put")
                del y
            return took
        finally:
            for a in self.admins.values():
                a.end_invocation(inv)

    def close(self) -> None:
        for a in self.admins.values():
            a.close()
        self.directory.close()


class EngineReader:
    """m2's end of the engine (a :mod:`.te_peer` process in this namespace)."""

    def __init__(self, engine: dict[str, Any], most: int) -> None:
        import subprocess

        self.remote, self.raddr = engine["remote"], engine["raddr"]
        # Its own log lines (glog, every connection) are not ours to print; failures come as JSON.
        self.proc = subprocess.Popen([engine["python"], engine["peer"], engine["ip"], str(most)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        info = json.loads(self.proc.stdout.readline() or "{}")
        if "port" not in info:
            raise RuntimeError(f"the transfer engine on m2 did not start: {info}")

    def read(self, n: int) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"read": n, "peer": self.remote, "raddr": self.raddr}) + "\n")
        self.proc.stdin.flush()
        ans = json.loads(self.proc.stdout.readline())
        if ans["rc"] != 0:
            raise RuntimeError(f"transfer_sync_read of {n} bytes returned {ans['rc']}")
        return float(ans["s"])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(10)


def main() -> int:
    cfg = json.loads(sys.stdin.read())
    sizes, repeats = cfg["sizes"], cfg["repeats"]
    tcp = TcpReader(cfg["sender"], max(sizes), cfg["piece"])
    g = Gfaas(cfg["lab"])
    eng = EngineReader(cfg["engine"], max(sizes)) if cfg.get("engine") else None
    systems = ["tcp", "warm", "cold"] + (["engine"] if eng else [])
    samples: dict[str, dict[str, list[float]]] = {str(n): {s: [] for s in systems} for n in sizes}
    seq = 0
    try:
        for k in range(repeats + 1):  # round 0 warms every path (and m2's warm segments) up: not counted
            for n in sizes:
                seq += 1
                t = {}
                # The systems take turns going first (a rotation per round and size): in a fixed order one
                # always ran right after another (the cold pull after the warm one), which can bias the
                # pair a target compares by whatever the earlier one leaves behind.
                turn = (k + seq) % len(systems)
                for system in systems[turn:] + systems[:turn]:
                    time.sleep(SETTLE_S)
                    if system == "tcp":
                        t[system] = tcp.read(n)
                    elif system == "engine":
                        assert eng is not None
                        t[system] = eng.read(n)
                    else:
                        t[system] = g.pull("bench-pull" if system == "warm" else f"bench-pull-cold-{seq}", n, seq)
                if k:
                    for system, s in t.items():
                        samples[str(n)][system].append(s)
            say(f"  round {k}/{repeats} done" + (" (warm-up, not counted)" if k == 0 else ""))
    finally:
        g.close()
        if eng is not None:
            eng.close()
    with open(cfg["out"], "w") as f:
        json.dump({"samples": samples}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
