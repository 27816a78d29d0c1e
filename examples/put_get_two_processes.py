"""Pass arrays between two processes through a node daemon: zero-copy put/get, and access control.

    .venv/bin/python examples/put_get_two_processes.py

The platform side (this process) starts a node daemon, opens an invocation of a two-function
workflow and hands each function its credentials. The producer process puts a seeded array (and
writes a second one in place with ``allocate``/``seal``); the consumer process reads both as
read-only views of shared memory, checks them and reports. A function that is not a declared
consumer is refused. The printed output is always the same (checked by tests/integration/test_examples.py).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
from typing import Any

import numpy as np

import gfaas
from gfaas.dataplane.local import LocalNode


def producer(creds: gfaas.Credentials, out: Any) -> None:
    c = gfaas.connect(creds)
    frame = np.random.default_rng(1).integers(0, 256, (720, 1280, 3), dtype=np.uint8)
    ref = c.put(frame, consumers=["consumer"])  # one copy into shared memory
    buf = c.allocate((256, 256), np.float32, consumers=["consumer"])
    buf.array[:] = np.arange(256, dtype=np.float32)  # written in place: no copy at all
    out.send([str(ref), str(buf.seal())])
    c.close()


def consumer(creds: gfaas.Credentials, refs: list[str], out: Any) -> None:
    c = gfaas.connect(creds)
    frame, table = c.get(refs[0]), c.get(refs[1])  # read-only views, no copy
    out.send({"frame": (frame.shape, str(frame.dtype), int(frame.sum(dtype=np.int64)), frame.flags.writeable),
              "table": (table.shape, float(table[3, 7]))})
    c.close()


def main() -> None:
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="gfaas-example-") as d:
        cfg = gfaas.NodeConfig(node_id="n0", socket_path=os.path.join(d, "node.sock"),
                               state_dir=os.path.join(d, "state"), capacity_bytes=256 << 20)
        with LocalNode(cfg), gfaas.Admin(cfg.socket_path, state_dir=cfg.state_dir) as admin:
            inv = admin.open_invocation("example", ["producer", "consumer", "bystander"])
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=producer, args=(inv.credentials("producer"), send))
            p.start()
            refs = recv.recv()
            p.join()
            # A reference names the node and a random 128-bit ID (different every run, so not printed).
            print("producer put", len(refs), "objects:", ", ".join(f"gfaas://{r.split('/')[2]}/<id>" for r in refs))

            bystander = gfaas.connect(inv.credentials("bystander"))
            try:
                bystander.get(refs[0])
            except gfaas.AccessDenied as exc:
                print("bystander refused:", exc)
            bystander.close()

            q = ctx.Process(target=consumer, args=(inv.credentials("consumer"), refs, send))
            q.start()
            got = recv.recv()
            q.join()
            print("consumer read frame", got["frame"][0], got["frame"][1], "checksum", got["frame"][2],
                  "writeable", got["frame"][3])
            print("consumer read table", got["table"][0], "value at [3, 7]", got["table"][1])
            st = admin.stats()
            print("objects left after both were read:", st["objects"])
            admin.end_invocation(inv)


if __name__ == "__main__":
    main()
