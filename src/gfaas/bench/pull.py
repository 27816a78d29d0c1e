"""``gfaas bench pull``: one object between two machines of a network-namespace lab, a gfaas pull
against one raw TCP stream over the same link, in one run.

**The lab** (:class:`~gfaas.deploy.netlab.NetLab` without Ray): a head with the global directory and
two machines, m1 and m2, each running a node daemon; every link limited to ``--rate-mbit`` each way
(default 100,000: far above what this host's cores move, so the CPUs bound every system rather than the
shaper). Root is needed for the namespaces.

**What is timed** (:mod:`.pull_driver`, which runs in m2's namespace; m1 runs the TCP sender), per
size, in interleaved rounds after one warm-up round (the systems taking turns to go first), the median of
``--repeats``:

* ``tcp``: the reference, one plain TCP stream from m1 to m2, request to last byte, received into
  memory that exists already (what any receiver with a buffer pool pays), sent and received in
  pieces of the pull's chunk size (2 MiB; faster here than one call for the whole object).
* ``warm``: a consumer on m2 gets an object a producer put on m1 (published before the clock starts):
  m2's daemon looks it up in the directory and pulls it from m1 over a connection proved with the
  cluster key, into a segment its workflow used before; until the consumer holds the array.
* ``cold``: the same under a workflow that never ran there, so the bytes land in fresh memory.
* ``engine`` (with ``--engine-python``, an interpreter that has Mooncake's transfer engine): m2 reads
  the bytes from m1's registered buffer with ``transfer_sync_read`` over the engine's TCP transport
  (:mod:`.te_peer` on both machines), buffers touched beforehand: the engine's own rate, with none of
  gfaas's look-up or access checks.

Targets (issue: the cluster mode at line rate): ``warm`` at >= 0.9 of ``tcp`` from 64 MiB up, and
``warm`` no slower than ``cold`` (how every pull ran before) at every size.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from ..errors import ConfigError, GfaasError
from ..units import MiB, format_bytes, parse_size

SIZES = "1MiB,4MiB,16MiB,64MiB,256MiB"
TE_PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "te_peer.py")
RATE_MBIT = 100_000.0
TCP_TARGET, TCP_TARGET_FROM = 0.9, 64 * MiB

# The raw stream's sending end, run in m1's namespace. argv: ip, largest size, piece. Prints its port,
# then answers each 8-byte request with that many bytes from a touched buffer (``sendall`` of one piece
# at a time: on these links that was faster than one call for the whole object, 1.5-2.5 against 1.3-1.5
# GB/s at 256 MiB), until the peer closes.
SENDER = r"""
import socket, struct, sys
ls = socket.socket(); ls.bind((sys.argv[1], 0)); ls.listen(1)
print(ls.getsockname()[1], flush=True)
buf, piece = memoryview(bytearray(b"\x02" * int(sys.argv[2]))), int(sys.argv[3])
c, _ = ls.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while True:
    req = c.recv(8, socket.MSG_WAITALL)
    if len(req) < 8:
        break
    n, off = struct.unpack("!Q", req)[0], 0
    while off < n:
        c.sendall(buf[off:min(n, off + piece)])
        off += piece
"""
PIECE = 2 * MiB  # the raw stream's send and receive calls move at most this much: the pull's chunk


def parse_sizes(text: str) -> list[int]:
    try:
        out = [parse_size(s.strip()) for s in text.split(",") if s.strip()]
    except ValueError as exc:
        raise ConfigError(f"--sizes {text!r}: {exc}; give e.g. {SIZES}") from None
    if not out or any(n < MiB or n > 1024 * MiB for n in out):
        raise ConfigError(f"--sizes {text!r}: give sizes from 1MiB to 1GiB, e.g. {SIZES}")
    return out


def run(sizes: list[int], repeats: int = 15, rate_mbit: float = RATE_MBIT, say: Any = None,
        engine_python: str = "") -> dict[str, Any]:
    """Build the lab, measure, return the result document (without provenance). ``engine_python``: an
    interpreter with Mooncake's transfer engine, for the ``engine`` row (none without it)."""
    from ..deploy.netlab import NetLab
    from .cluster import check_capable

    say = say or (lambda msg: None)
    if repeats < 1:
        raise ConfigError(f"--repeats {repeats}: give at least 1")
    check_capable(ray=False)
    if engine_python:
        probe = subprocess.run([engine_python, "-c", "import mooncake.engine"], capture_output=True, text=True)
        if probe.returncode:
            raise ConfigError(f"--engine-python {engine_python}: it cannot import mooncake.engine "
                              f"({probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else probe.returncode}); "
                              "make one with `make pull-results` or pip install mooncake-transfer-engine-non-cuda "
                              "(and apt-get install libibverbs1 librdmacm1)")
    t0 = time.perf_counter()
    capacity = max(1024 * MiB, 8 * max(sizes))
    with tempfile.TemporaryDirectory(prefix="gfaas-bench-pull-") as run_dir:
        say(f"starting a lab of 3 machines (no Ray) at {rate_mbit:g} Mbit/s ...")
        with NetLab(3, run_dir, rate_mbit=rate_mbit, capacity_bytes=capacity, ray=False) as lab:
            lab_s = time.perf_counter() - t0
            say(f"lab up in {lab_s:.1f} s; {repeats} rounds of {', '.join(format_bytes(n) for n in sizes)} ...")
            sender = subprocess.Popen(lab.testbed.exec_argv(1) + [sys.executable, "-c", SENDER, lab.testbed.ips[1],
                                                                  str(max(sizes)), str(PIECE)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            owner = None
            try:
                assert sender.stdout is not None
                port = sender.stdout.readline().strip()
                if not port.isdigit():
                    raise GfaasError(f"the TCP sender on m1 did not start: {sender.stderr.read()[-2000:]}")  # type: ignore[union-attr]
                engine: dict[str, Any] = {}
                if engine_python:  # the engine's owner end on m1: its registered buffer, read by m2
                    owner = subprocess.Popen(lab.testbed.exec_argv(1) + [engine_python, TE_PEER, lab.testbed.ips[1],
                                                                         str(max(sizes))],
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                             text=True)
                    assert owner.stdout is not None
                    info = json.loads(owner.stdout.readline() or "{}")
                    if "port" not in info:
                        raise GfaasError(f"the transfer engine on m1 did not start: {info}")
                    engine = {"python": engine_python, "peer": TE_PEER, "remote": f"{lab.testbed.ips[1]}:{info['port']}",
                              "raddr": info["addr"], "ip": lab.testbed.ips[2]}
                assert lab.info is not None
                out = os.path.join(run_dir, "driver.json")
                stdin = json.dumps({"lab": json.loads(lab.info.to_json()), "sizes": sizes, "repeats": repeats,
                                    "sender": f"{lab.testbed.ips[1]}:{port}", "piece": PIECE, "engine": engine,
                                    "out": out})
                res = lab.run_on(2, [sys.executable, "-m", "gfaas.bench.pull_driver"], stdin=stdin,
                                 timeout=3600, stdout=sys.stderr)
                if res.returncode:
                    raise GfaasError(f"the benchmark's driver on m2 failed (exit {res.returncode}); the machines' "
                                     f"logs:\n{lab.logs(1500)}")
                with open(out) as f:
                    samples = json.load(f)["samples"]
            finally:
                for proc in (sender, owner):
                    if proc is not None:
                        proc.kill()
                        proc.wait(10)
    doc = document(samples, sizes, repeats, rate_mbit, lab_s, time.perf_counter() - t0)
    if engine_python:
        doc["config"]["engine"] = _engine_version(engine_python)
    return doc


def _engine_version(python: str) -> str:
    res = subprocess.run([python, "-c", "import importlib.metadata as m; "
                                        "print(m.version('mooncake-transfer-engine-non-cuda'))"],
                         capture_output=True, text=True)
    return f"mooncake-transfer-engine-non-cuda {res.stdout.strip() or '?'}"


def document(samples: dict[str, dict[str, list[float]]], sizes: list[int], repeats: int, rate_mbit: float,
             lab_s: float, total_s: float) -> dict[str, Any]:
    """Rows and targets from the driver's samples (seconds per pull, by size and system)."""
    rows = []
    for n in sizes:
        s = samples[str(n)]
        ms = {k: statistics.median(v) * 1e3 for k, v in s.items() if v}
        gbps = {k: n / (v / 1e3) / 1e9 for k, v in ms.items()}
        rows.append({"bytes": n, **{f"{k}_ms": round(v, 3) for k, v in ms.items()},
                     **{f"{k}_gbps": round(v, 3) for k, v in gbps.items()},
                     "warm_over_tcp": round(gbps["warm"] / gbps["tcp"], 3),
                     "warm_over_cold": round(gbps["warm"] / gbps["cold"], 3),
                     **({"warm_over_engine": round(gbps["warm"] / gbps["engine"], 3)} if "engine" in gbps else {})})
    big = [r for r in rows if r["bytes"] >= TCP_TARGET_FROM]
    return {
        "config": {"sizes": sizes, "repeats": repeats, "rate_mbit": rate_mbit, "machines": 3, "tcp_piece": PIECE,
                   "cores_shared_by_all_machines": os.cpu_count()},
        "rows": rows,
        "targets": [
            {"id": "tcp", "target": f"warm pull / one raw TCP stream, at {format_bytes(TCP_TARGET_FROM)} and up",
             "value": min((r["warm_over_tcp"] for r in big), default=None), "bound": TCP_TARGET,
             "status": None if not big else "pass" if all(r["warm_over_tcp"] >= TCP_TARGET for r in big) else "fail"},
            {"id": "cold", "target": "warm pull / cold pull (fresh memory, as before), every size",
             "value": min(r["warm_over_cold"] for r in rows), "bound": 1.0,
             "status": "pass" if all(r["warm_over_cold"] >= 1.0 for r in rows) else "fail"}],
        "definition": {
            "tcp": "one raw TCP stream m1 -> m2 (sendall from a touched buffer, recv_into a touched buffer, "
                   "at most tcp_piece bytes per call, as the pull moves its chunks), request to last byte",
            "warm": "consumer get on m2 of an object put on m1, published before the clock starts: directory "
                    "look-up, pull over a key-proved connection into a segment the workflow used before, until "
                    "the consumer holds the array",
            "cold": "the same under a workflow new to m2 each round: the bytes land in freshly allocated memory",
            "engine": "Mooncake transfer engine, TCP transport: transfer_sync_read by m2 of m1's registered, touched "
                      "buffer into its own (with --engine-python only)",
            "gbps": "bytes / median seconds / 1e9"},
        "timing_s": {"lab_start": round(lab_s, 1), "total": round(total_s, 1)},
    }


def main(a: argparse.Namespace) -> int:
    from ..provenance import provenance
    from . import emit

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    prov = provenance()  # before the run: it names the code that ran
    doc = {"provenance": prov, **run(parse_sizes(a.sizes or SIZES), a.repeats, a.rate_mbit, say, a.engine_python)}
    if emit(doc, a.out, a.json):
        return 0
    c = doc["config"]
    print(f"m1 -> m2 at {c['rate_mbit']:g} Mbit/s, median of {c['repeats']} (GB/s)")
    eng = "engine_gbps" in doc["rows"][0]
    print(f"{'size':>8} {'tcp':>7} {'warm':>7} {'cold':>7}" + (f" {'engine':>7}" if eng else "")
          + f" {'warm/tcp':>9} {'warm/cold':>10}" + (f" {'warm/engine':>12}" if eng else ""))
    for r in doc["rows"]:
        print(f"{format_bytes(r['bytes']):>8} {r['tcp_gbps']:7.2f} {r['warm_gbps']:7.2f} {r['cold_gbps']:7.2f}"
              + (f" {r['engine_gbps']:7.2f}" if eng else "")
              + f" {r['warm_over_tcp']:8.2f}x {r['warm_over_cold']:9.2f}x"
              + (f" {r['warm_over_engine']:11.2f}x" if eng else ""))
    for t in doc["targets"]:
        print(f"target: {t['target']} >= {t['bound']:g}: {t['value']} ({t['status']})")
    return 0
