"""The head machine's side of ``gfaas bench cluster`` (:mod:`gfaas.bench.cluster`), run there with
``python -m gfaas.bench.cluster_driver`` inside a :class:`~gfaas.deploy.netlab.NetLab`'s head namespace:
the caller in the root namespace cannot reach the machines' addresses.

stdin: ``{"lab": LabInfo, "sizes", "repeats", "workflows", "requests", "out"}``; progress lines on
stderr; the measurements (JSON) written to ``out``.
"""

from __future__ import annotations

import json
import logging
import statistics
import sys
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from ..runtime.cluster import RAY_SLIVER, ray_resource

PRODUCER, CONSUMER = "producer", "consumer"  # the two functions of each passing invocation


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class End:
    """One end of a transfer, a Ray actor pinned to one machine: it talks to that machine's node
    daemon (gfaas), to the baseline's Redis on the head, and to Ray's object store. Connections are
    opened before the timed loop, as a warm worker holds them; each method times only its own put or get."""

    def __init__(self, socket_path: str, redis_url: str) -> None:
        self.socket_path, self.redis_url = socket_path, redis_url
        self.token = ""
        self.keep: dict[int, Any] = {}

    def bind(self, token: str) -> None:
        self.token = token

    def _client(self) -> Any:
        # As a function's task does: its own connection, opened before its put or get and closed
        # after (untimed), so its mappings end with the task and the node can reuse the segment.
        from ..dataplane.client import connect

        return connect(socket_path=self.socket_path, token=self.token)

    def put(self, system: str, nbytes: int, seq: int) -> tuple[Any, float]:
        arr = np.full(nbytes, seq % 251, dtype=np.uint8)
        arr[:8] = np.frombuffer(np.int64(seq).tobytes(), dtype=np.uint8)  # each repeat's bytes differ
        client = self._client() if system == "gfaas" else None
        t0 = time.perf_counter()
        if client is not None:
            ref: Any = str(client.put(arr, consumers=[CONSUMER]))
        elif system == "redis":  # the runtime's baseline transport itself: serialise, SET
            ref = self._redis(seq).put(arr, None)
        else:
            obj = __import__("ray").put(arr)
            self.keep[seq] = obj
            ref = [obj]  # nested, so Ray hands the reference on instead of the value
        took = time.perf_counter() - t0
        if client is not None:
            client.close()
        return ref, took

    def get(self, system: str, ref: Any, seq: int, nbytes: int) -> float:
        client = self._client() if system == "gfaas" else None
        t0 = time.perf_counter()
        if client is not None:
            x = np.asarray(client.get(ref))  # m2's daemon pulls the object from m1's transfer server
        elif system == "redis":
            x = self._redis(seq).get(ref)
        else:
            x = __import__("ray").get(ref[0])
        took = time.perf_counter() - t0
        if x.nbytes != nbytes or int(np.frombuffer(x[:8].tobytes(), dtype=np.int64)[0]) != seq \
                or int(x[-1]) != seq % 251:
            raise RuntimeError(f"{system}: the consumer read other bytes than were put (seq {seq})")
        del x
        if client is not None:
            client.close()
        if system == "redis":
            from ..runtime.transport import parse_redis_ref

            self._redis(seq)._r.delete(parse_redis_ref(ref)[0])
        return took

    def drop(self, seq: int) -> None:
        self.keep.pop(seq, None)

    def _redis(self, seq: int) -> Any:
        from ..runtime.transport import RedisTransport, TransportConfig

        return RedisTransport(TransportConfig("redis", redis_url=self.redis_url), f"bench{seq}", PRODUCER)


def _ms(xs: list[float]) -> float:
    return round(statistics.median(xs) * 1e3, 3)


def passing(cfg: dict[str, Any], redis_url: str) -> list[dict[str, Any]]:
    """One tensor from m1 to m2 per repeat, each system in turn (interleaved, so all see the same load)."""
    import ray

    from ..config import NodeConfig
    from ..dataplane.directory import redis_client
    from ..dataplane.peer_auth import PeerKey
    from ..dataplane.peer_control import PeerAdmin
    from ..runtime.cluster import discover

    lab = cfg["lab"]
    key = PeerKey.from_file(lab["cluster_key_file"])
    directory = redis_client(NodeConfig(node_id="bench", redis_url=lab["redis_url"],
                                        cluster_key_file=lab["cluster_key_file"],
                                        redis_password_file=lab["redis_password_file"]), 5.0)
    deadline = time.monotonic() + 30
    while True:  # a node writes its entry from a background thread: it may land after Ray saw the node
        where = {n["node"]: n["address"] for n in discover(directory, key)}
        if {"m1", "m2"} <= set(where) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    directory.close()
    if not {"m1", "m2"} <= set(where):
        raise RuntimeError(f"nodes m1 and m2 did not register in the directory within 30 s (found {sorted(where)})")
    # As the gateway does: the head opens each invocation on both nodes over their transfer ports.
    admins = {m: PeerAdmin(where[m], m, key) for m in ("m1", "m2")}
    actor: Any = ray.remote(End)
    ends: dict[str, Any] = {m: actor.options(num_cpus=0.01, resources={ray_resource(m): RAY_SLIVER}).remote(
        lab["nodes"][m]["socket"], redis_url) for m in ("m1", "m2")}
    rows, seq = [], 0
    for nbytes in cfg["sizes"]:
        out0 = admins["m1"].snapshot()["links"].get("net-out", 0)
        times: dict[str, list[float]] = {"gfaas": [], "redis": [], "ray": []}
        puts: dict[str, list[float]] = {s: [] for s in times}
        for k in range(cfg["repeats"] + 1):  # the first round warms every path up and is not counted
            # A fresh invocation per round (outside the timed part): the previous round's copies go with it.
            inv = uuid.uuid4().hex  # the 32 hex digits an invocation ID must be
            tokens = key.function_tokens(inv, [PRODUCER, CONSUMER])  # each node derives the same; none is sent
            for a in admins.values():
                a.open_invocation("bench-cluster", [PRODUCER, CONSUMER], inv, tokens)
            ray.get([ends["m1"].bind.remote(tokens[PRODUCER]), ends["m2"].bind.remote(tokens[CONSUMER])])
            for system in times:
                seq += 1
                ref, put_s = ray.get(ends["m1"].put.remote(system, nbytes, seq))
                get_s = ray.get(ends["m2"].get.remote(system, ref, seq, nbytes))
                ray.get(ends["m1"].drop.remote(seq))
                del ref
                if k:
                    times[system].append(put_s + get_s)
                    puts[system].append(put_s)
            for a in admins.values():
                a.end_invocation(inv)
        net_out = admins["m1"].snapshot()["links"].get("net-out", 0) - out0
        g, r, y = (_ms(times[s]) for s in ("gfaas", "redis", "ray"))
        rows.append({"bytes": nbytes, "gfaas_ms": g, "redis_ms": r, "ray_ms": y,
                     "redis_over_gfaas": round(r / g, 2), "ray_over_gfaas": round(y / g, 2),
                     "meets_3x_redis": r >= 3 * g, "meets_ray": g <= y,
                     "put_ms": {s: _ms(v) for s, v in puts.items()},
                     "gfaas_owner_net_out_bytes": net_out})
        say(f"  {nbytes / 2**20:g} MiB: gfaas {g:.1f} ms, Redis {r:.1f} ms ({r / g:.2f}x), "
            f"Ray {y:.1f} ms ({y / g:.2f}x)")
    for a in admins.values():
        a.close()
    for e in ends.values():
        ray.kill(e)
    return rows


def workflows(cfg: dict[str, Any], redis_url: str) -> list[dict[str, Any]]:
    """The reference workflows through the runtime on the lab, each request with gfaas then with Redis
    (same warm Ray actors: the transport is chosen per invocation)."""
    from .. import workflows as W
    from ..runtime.local import LocalRuntime, RuntimeConfig

    lab = cfg["lab"]
    rc = RuntimeConfig(executor="ray", ray_address=lab["ray_address"], join=lab["redis_url"],
                       redis_password_file=lab["redis_password_file"], cluster_key_file=lab["cluster_key_file"],
                       transfer_host=lab["head_ip"], redis_url=redis_url, ray_cpus_per_worker=0.05, scale="small",
                       node_capacity_bytes=256 << 20)
    rows = []
    with LocalRuntime(rc) as rt:
        for name in cfg["workflows"]:
            rt.deploy(W.spec_text(name))
            inputs = W.make_inputs(name, seed=5, scale="small")
            lat: dict[str, list[float]] = {"gfaas": [], "redis": []}
            parts: dict[str, list[dict[str, float]]] = {t: [] for t in lat}
            where: set[str] = set()
            for k in range(cfg["requests"] + 1):  # the first request of each warms the workers
                for transport in lat:
                    t0 = time.perf_counter()
                    res = rt.invoke(name, inputs, timeout=300, transport=transport)
                    took = time.perf_counter() - t0
                    if not res.ok:
                        raise RuntimeError(f"{name} with {transport} failed: {res.error}")
                    where.update(r.worker.rsplit("@", 1)[-1] for r in res.functions if not r.skipped)
                    if k:
                        lat[transport].append(took)
                        parts[transport].append(res.breakdown.as_dict())
            g, r = _ms(lat["gfaas"]), _ms(lat["redis"])
            rows.append({"workflow": name, "gfaas_p50_ms": g, "redis_p50_ms": r, "redis_over_gfaas": round(r / g, 2),
                         "requests": cfg["requests"], "nodes": sorted(where),
                         # where the time went (the runtime's own split: passing to and from the gateway,
                         # between functions, compute, queueing), p50 of each part
                         "breakdown_p50_ms": {t: {k: _ms([b[k] for b in bs]) for k in bs[0]}
                                              for t, bs in parts.items()}})
            say(f"  {name}: gfaas p50 {g:.1f} ms, Redis p50 {r:.1f} ms ({r / g:.2f}x) on {sorted(where)}")
            rt.undeploy(name)
    return rows


def main() -> int:
    import ray

    logging.basicConfig(level=logging.WARNING)
    cfg = json.loads(sys.stdin.read())
    lab = cfg["lab"]
    with open(lab["redis_password_file"]) as f:
        password = f.read().strip()
    # The baseline's Redis: the directory's server on the head, its database 1 (the directory uses 0).
    redis_url = f"redis://:{password}@{lab['head_ip']}:{urlsplit(lab['redis_url']).port}/1"
    ray.init(address=lab["ray_address"], log_to_driver=False, logging_level=logging.ERROR)
    doc: dict[str, Any] = {"ray_version": ray.__version__}
    t0 = time.perf_counter()
    say(f"data passing m1 -> m2, {cfg['repeats']} repeats per size ...")
    doc["passing"] = passing(cfg, redis_url)
    doc["passing_s"] = round(time.perf_counter() - t0, 1)
    if cfg["workflows"]:
        t0 = time.perf_counter()
        say(f"end to end: {len(cfg['workflows'])} workflows, {cfg['requests']} requests each way ...")
        doc["workflows"] = workflows(cfg, redis_url)
        doc["workflows_s"] = round(time.perf_counter() - t0, 1)
    else:
        doc["workflows"] = []
    ray.shutdown()
    with open(cfg["out"], "w") as f:
        json.dump(doc, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
