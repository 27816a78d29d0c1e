"""The daemon's reused threads for deferred work (cross-node pulls): reuse, growth, idle exit, failures."""

from __future__ import annotations

import threading
import time

from gfaas.dataplane.threads import ReusedThreads


def _alive(name: str) -> int:
    return sum(t.name == name for t in threading.enumerate())


def _wait_until(cond, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_jobs_one_after_another_run_on_one_thread() -> None:
    pool = ReusedThreads("t-seq")
    ran: list[str] = []
    for k in range(5):
        done = threading.Event()
        pool.submit(lambda k=k, done=done: (ran.append(threading.current_thread().name + str(k)), done.set()))
        assert done.wait(5)
        _wait_until(lambda: pool._idle == 1)  # back to waiting before the next submit
    assert ran == [f"t-seq{k}" for k in range(5)]
    assert pool.started == 1


def test_jobs_that_block_each_get_a_thread_of_their_own() -> None:
    """A pull stuck on a silent peer must not hold up another: no cap, no queueing behind it."""
    pool = ReusedThreads("t-par")
    release = threading.Event()
    running = threading.Semaphore(0)

    def job() -> None:
        running.release()
        release.wait(5)

    for _ in range(6):
        pool.submit(job)
    for _ in range(6):
        assert running.acquire(timeout=5)  # all six run at once
    assert pool.started == 6
    release.set()
    _wait_until(lambda: pool._idle == 6)
    done = threading.Event()
    pool.submit(done.set)  # an idle one takes it
    assert done.wait(5) and pool.started == 6


def test_idle_threads_leave_and_a_later_job_still_runs() -> None:
    pool = ReusedThreads("t-idle", idle_s=0.05)
    done = threading.Event()
    pool.submit(done.set)
    assert done.wait(5)
    _wait_until(lambda: _alive("t-idle") == 0)
    assert pool._idle == 0
    again = threading.Event()
    pool.submit(again.set)
    assert again.wait(5) and pool.started == 2


def test_a_failing_job_is_logged_and_its_thread_serves_the_next(caplog) -> None:  # type: ignore[no-untyped-def]
    pool = ReusedThreads("t-fail")
    pool.submit(lambda: 1 / 0)
    _wait_until(lambda: pool._idle == 1)
    done = threading.Event()
    pool.submit(done.set)
    assert done.wait(5)
    assert pool.started == 1
    assert any("deferred work failed" in r.message and r.exc_info for r in caplog.records)
