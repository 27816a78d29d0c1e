"""The worker's loop (worker._serve) with its log capture, in a child process: a chain's two functions
each print every way a handler can (print, an unterminated print, os.write to fd 1 and 2, a log record),
and each function's lines come back in its own reply (Done.logs, Done.next.logs), marked the task's; a
quiet task gets none. On both task paths (GFAAS_WORKER_CORE=native and python)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gfaas.native import native_class

HANDLERS = '''
import logging, os, sys
import numpy as np

def _say(who):
    print(f"{who} print")
    os.write(1, f"{who} fd1\\n".encode())
    os.write(2, f"{who} fd2\\n".encode())
    logging.getLogger("userfn").warning("%s record", who)
    print(f"{who} unterminated", end="", file=sys.stderr)

def a(ctx, inputs):
    n = int(ctx.get(inputs["n"]))
    if n != 5:  # 5: a quiet task
        _say("a")
    return {"x": np.arange(n, dtype=np.float32)}

def b(ctx, inputs):
    x = ctx.get(inputs["x"])
    if len(x) != 5:
        _say("b")
    return {"total": np.float32(x.sum())}
'''

SPEC = """
name: loud
inputs: {n: {dtype: int64, shape: []}}
outputs: {total: b.total}
functions:
  - {name: a, kind: cpu, handler: "loud_handlers:a", inputs: {n: input.n}, outputs: {x: {dtype: float32, shape: [-1]}}}
  - {name: b, kind: cpu, handler: "loud_handlers:b", inputs: {x: a.x}, outputs: {total: {dtype: float32, shape: []}}}
"""

CHILD = r"""
import json, os, socket, sys
import numpy as np
from gfaas.runtime import worker as W
from gfaas.runtime.logs import Capture

class Link:  # the attached connection a lazy task never touches here
    devices = ()
    closed = False

spec = open(sys.argv[1]).read()
ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
if os.fork() == 0:  # the worker: its fds 1 and 2 captured, as serve_fd does
    ours.close()
    cap = Capture()
    cap.install()
    os._exit(W._serve(theirs, W.Init("loud", "a", spec, follow=["b"]), cap, Link()))
theirs.close()
assert isinstance(W._dec.decode(ours.recv(W.MAX_MSG)), W.Ready)
replies = []
for i, n in enumerate((4, 5, 4)):  # 5: the handlers print nothing
    then = W.Task(f"inv{i}", "", {"x": "inline:x"}, [], {"total": ["gateway"]}, function="b", carry={"x": "x"},
                  inline_max=1 << 16, lazy=True)
    task = W.Task(f"inv{i}", "", {"n": "inline:n"}, ["n"], {"x": ["b"]}, inline_max=1 << 16, lazy=True, then=then,
                  values={"n": W.to_value(np.asarray(n, np.int64))})
    ours.send(W._enc.encode(task))
    r = W._dec.decode(ours.recv(W.MAX_MSG))
    assert type(r) is W.Done and type(r.next) is W.Done, r
    replies.append([[[ln.stream, ln.text, ln.task] for ln in d.logs] for d in (r, r.next)])
ours.send(W._enc.encode(W.Stop()))
os.wait()
print(json.dumps(replies))
"""


def _expected(who: str) -> list[list[object]]:
    return sorted([["stdout", f"{who} print", True], ["stdout", f"{who} fd1", True], ["stderr", f"{who} fd2", True],
                   ["log", f"userfn: {who} record", True], ["stderr", f"{who} unterminated", True]])


@pytest.mark.parametrize("core", ["native", "python"])
def test_each_function_of_a_chain_gets_its_own_lines(core: str, tmp_path: Path) -> None:
    if core == "native" and native_class("WorkerCore") is None:
        pytest.skip("gfaas_native is not built")
    (tmp_path / "loud_handlers.py").write_text(HANDLERS)
    (tmp_path / "spec.yaml").write_text(SPEC)
    env = {**os.environ, "GFAAS_WORKER_CORE": core,
           "PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)}
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD), str(tmp_path / "spec.yaml")],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    replies = json.loads(p.stdout.strip().splitlines()[-1])
    loud, quiet, loud_again = replies
    for a, b in (loud, loud_again):
        assert sorted(a) == _expected("a")
        assert sorted(b) == _expected("b")
    assert quiet == [[], []]
