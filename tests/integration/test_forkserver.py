"""The worker template (runtime/forkserver.py): what the runtime relies on from a forked process as
from a spawned one (exit status, kill, a template that died started again), and what a fork must
not inherit (the template's random stream)."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator

import numpy as np
import pytest

from gfaas.runtime.forkserver import ForkServer, template_env
from gfaas.runtime.local import LocalRuntime, RuntimeConfig

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def server() -> Iterator[ForkServer]:
    fs = ForkServer(template_env(os.environ, 1))
    try:
        yield fs
    finally:
        fs.close()


def _fork(fs: ForkServer) -> tuple[object, socket.socket]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        proc, _ = fs.fork(dict(os.environ), theirs.fileno())
    finally:
        theirs.close()
    return proc, ours


def test_a_forked_worker_reports_its_exit_and_can_be_killed(server: ForkServer) -> None:
    """Closing its socket before Init: it exits 0. Killed while it waits: -SIGKILL, as Popen says."""
    proc, ours = _fork(server)
    ours.close()
    assert proc.wait(30) == 0  # type: ignore[attr-defined]
    proc, ours = _fork(server)
    assert proc.poll() is None  # type: ignore[attr-defined]
    proc.kill()  # type: ignore[attr-defined]
    assert proc.wait(30) == -signal.SIGKILL  # type: ignore[attr-defined]
    ours.close()


def test_a_template_that_died_is_started_again(server: ForkServer) -> None:
    server.ready(60)
    assert server.started == 1 and server._proc is not None
    server._proc.kill()
    server._proc.wait()
    proc, ours = _fork(server)
    ours.close()
    assert proc.wait(30) == 0 and server.started == 2  # type: ignore[attr-defined]


def test_forked_workers_draw_different_random_numbers(rt_handlers: str) -> None:
    """Two workers forked from one template: numpy's global generator is reseeded in each, so their
    first draws differ (without it every fork repeats the template's stream)."""
    spec = """
name: draws
inputs: {x: null}
outputs: {y: f.y}
functions:
  - {name: f, kind: cpu, handler: "rt_handlers:draw", inputs: {x: input.x}, outputs: {y: null},
     scaling: {min: 2, max: 2}}
"""
    with LocalRuntime(RuntimeConfig(queue_hints=False)) as rt:
        rt.deploy(spec)
        ids = [rt.submit("draws", {"x": np.zeros(1)}) for _ in range(6)]
        firsts: dict[int, int] = {}
        for i in ids:
            res = rt.result(i, timeout=60)
            assert res.ok, res.error
            pid, value = (int(v) for v in res.outputs["y"])
            firsts.setdefault(pid, value)
    assert len(firsts) == 2, firsts
    assert len(set(firsts.values())) == 2, firsts


def test_threads_polling_one_exited_worker_agree_and_ask_the_template_once(server: ForkServer) -> None:
    """The runtime's loop thread and its reaper poll the same worker. The template answers slowly
    here, so every thread sees the exit before the first answer comes: each gets the one status, none
    closes a descriptor another still uses (the first version raised EBADF), and the template is
    asked once (it reports an exit once)."""
    import threading
    import time

    proc, ours = _fork(server)
    ours.close()
    real, asked = server.status, []

    def slow_status(pid: int) -> int | None:
        asked.append(pid)
        time.sleep(0.2)
        return real(pid)

    server.status = slow_status  # type: ignore[method-assign]
    time.sleep(0.5)  # it has exited by now (it exits as soon as its socket closes)
    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(_poll(proc))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert got == [0] * 8 and asked == [proc.pid]  # type: ignore[attr-defined]


def _poll(proc: object) -> object:
    try:
        return proc.poll()  # type: ignore[attr-defined]
    except OSError as exc:
        return exc
