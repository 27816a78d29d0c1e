"""Who may read memory registered with Mooncake's transfer engine (groundwork for issue 38, item 1).

Issue 38 asks for bytes between machines through an existing transfer engine, registered on the
node's shared segments, with the cluster key still deciding who may pull what. This probe checks the
engine's own access model on one machine: a process registers a buffer holding a marker with an
engine in TCP mode (``P2PHANDSHAKE``: no metadata server); a second process, given nothing but the
first engine's address and the buffer's address, reads it. Printed: whether the read succeeded and
what it got. (On this machine kind it does: the engine asks no credential of a reader, so a node's
segments cannot simply be registered with it; see the closing note of the session that added this.)

Needs ``pip install mooncake-transfer-engine-non-cuda`` and Debian's ``libibverbs1`` and
``librdmacm1`` (not dependencies of gfaas). Run: ``python benchmarks/te_access_probe.py``.
"""

from __future__ import annotations

import subprocess
import sys
import time

MARKER = b"registered-bytes-of-tenant-A"

OWNER = f"""
import sys, time, numpy as np
from mooncake.engine import TransferEngine
e = TransferEngine()
assert e.initialize("localhost", "P2PHANDSHAKE", "tcp", "") == 0
buf = np.frombuffer({MARKER!r} + bytes(1000), dtype=np.uint8).copy()
assert e.register_memory(buf.ctypes.data, buf.nbytes) == 0
print(e.get_rpc_port(), buf.ctypes.data, flush=True)
sys.stdin.read()  # until the probe is done
"""

READER = f"""
import sys, numpy as np
from mooncake.engine import TransferEngine
port, addr = int(sys.argv[1]), int(sys.argv[2])
e = TransferEngine()
assert e.initialize("localhost", "P2PHANDSHAKE", "tcp", "") == 0
dst = np.zeros(1024, dtype=np.uint8)
assert e.register_memory(dst.ctypes.data, dst.nbytes) == 0
rc = e.transfer_sync_read(f"localhost:{{port}}", dst.ctypes.data, addr, {len(MARKER)})
print(rc, bytes(dst[:{len(MARKER)}]).hex(), flush=True)
"""


def main() -> int:
    try:
        import mooncake.engine  # noqa: F401
    except ImportError as exc:
        print(f"te_access_probe: Mooncake's transfer engine is not importable ({exc}); "
              "pip install mooncake-transfer-engine-non-cuda (and apt-get install libibverbs1 librdmacm1)",
              file=sys.stderr)
        return 2
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    try:
        assert owner.stdout is not None
        port, addr = owner.stdout.readline().split()
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", READER, port, addr], capture_output=True, text=True, timeout=60)
        rc, data = out.stdout.split()
        got = bytes.fromhex(data)
        print(f"a reader with no credential: transfer_sync_read returned {rc} in {time.perf_counter() - t0:.2f} s "
              f"(with its start); it {'READ' if got == MARKER else 'did not read'} the owner's registered bytes"
              f" ({got!r})")
    finally:
        if owner.stdin is not None:
            owner.stdin.close()
        owner.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
