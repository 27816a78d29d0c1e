"""One end of Mooncake's transfer engine for ``gfaas bench pull --engine-python`` (the comparison row).

Run as a file by an interpreter that has the engine (``pip install mooncake-transfer-engine-non-cuda``;
Debian's ``libibverbs1`` and ``librdmacm1``): it imports nothing of gfaas, which that interpreter may
lack. argv: this machine's IP, the buffer's size. It registers a touched buffer of that size with an
engine on the TCP transport (peer-to-peer handshake), prints ``{"port", "addr"}`` as one JSON line, then
serves JSON lines on stdin: ``{"read": n, "peer": "ip:port", "raddr": a}`` reads ``n`` bytes of the
peer's registered buffer into its own and answers ``{"s": seconds, "rc": code}``; end of input ends it.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import sys
import time


def main() -> int:
    from mooncake.engine import TransferEngine

    ip, size = sys.argv[1], int(sys.argv[2])
    engine = TransferEngine()
    rc = engine.initialize(ip, "P2PHANDSHAKE", "tcp", "")
    if rc != 0:
        print(json.dumps({"error": f"TransferEngine.initialize returned {rc}"}), flush=True)
        return 1
    buf = mmap.mmap(-1, size)
    buf[:] = b"\x03" * size  # touched: what is registered exists
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    if engine.register_memory(addr, size) != 0:
        print(json.dumps({"error": "register_memory failed"}), flush=True)
        return 1
    print(json.dumps({"port": engine.get_rpc_port(), "addr": addr}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        t0 = time.perf_counter()
        rc = engine.transfer_sync_read(cmd["peer"], addr, cmd["raddr"], cmd["read"])
        print(json.dumps({"s": time.perf_counter() - t0, "rc": rc}), flush=True)
    engine.unregister_memory(addr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
