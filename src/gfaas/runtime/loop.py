"""The invoker's event loop: one thread that reads every worker's replies as they come.

A warm worker process answers on its control socket; the loop waits on all of them at once (epoll)
and hands each message to the runtime's ``on_message`` *on the loop's
thread*, where the runtime steps the invocation's DAG and sends the next task at once. So a step costs
one message to a worker and one back, and no thread is woken per task. Workers whose ``run`` blocks
(a Ray actor, an in-process host) get a runner thread of their own, which posts each reply to the loop
the same way. Timers (a call's ``timeout_s``) fire on the loop too.

Everything the loop owns (the selector, the timers) is touched only by the thread that holds its
baton, its own: other threads ``post`` a callable and wake it through a pipe. The one exception is
a caller that waits for its own invocation (``Invoker.invoke``) while the polling rule says poll
(gfaas.policy.polling): it takes the baton and reads the replies itself (:meth:`ReplyLoop.drive`),
so a sequential tiny invocation wakes no thread at all, neither the loop's when its task goes out
nor the caller's when its result is set.

An asyncio event loop can drive it instead of its thread (:meth:`ReplyLoop.adopt`: that loop watches
the epoll descriptor and runs the same rounds; :meth:`ReplyLoop.release` gives it a thread again).
``gfaas serve`` does this from the gateway's lifespan, so each reply is handled on the thread that
submitted its invocation and answers the request: one thread, not two contending for the GIL.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import logging
import os
import queue
import select
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger("gfaas.runtime")


class SocketWorker(Protocol):
    """A worker whose replies the loop reads itself (:class:`~gfaas.runtime.worker.ProcessWorker`)."""

    name: str

    def fileno(self) -> int: ...
    def receive(self) -> Any:
        """The next message (the socket is readable), or None when the worker is gone."""


OnMessage = Callable[[Any, Any], None]  # (worker, message | None (gone) | an exception (a runner's))
TICK_S = 0.25  # how often the loop calls its ``tick`` (the invoker's timeout sweep), busy or not


class ReplyLoop:
    """The loop thread; ``on_message(worker, message)`` runs on it for every reply."""

    def __init__(self, on_message: OnMessage, name: str = "gfaas-invoker",
                 tick: Callable[[], None] | None = None, polls: Callable[[], bool] | None = None,
                 poll_s: float = 0.0) -> None:
        self._on_message = on_message
        self._tick = tick
        # Whether to ask for replies without blocking, for up to poll_s after the last one, rather than
        # sleep on them (policy.polling; the invoker's rule); only while the loop has its own thread
        self._polls = polls if poll_s > 0 else None
        self._poll_s = poll_s
        self._sleeping = False  # blocked in epoll on its own thread: a task sent may wake it (nudge)
        self._next_tick = time.monotonic() + TICK_S
        # epoll itself, not selectors: one look-up per reply (fd -> worker) is all a step pays here.
        # Two sets: the workers' sockets (_replies), and the one the loop waits on (_ep: the wake pipe
        # and _replies), so that a caller that drives (drive) takes the replies off the loop's thread
        # with one call, whatever the workers.
        self._replies = select.epoll()
        self._ep = select.epoll()
        self._ep.register(self._replies.fileno(), select.EPOLLIN)
        self._watched: dict[int, Any] = {}  # fd -> worker
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._ep.register(self._wake_r, select.EPOLLIN)
        # Held by whoever handles replies and posted calls: the loop's thread, or a caller that drives
        self._baton = threading.Lock()
        self._driver: threading.Thread | None = None
        self._posted: deque[Callable[[], None]] = deque()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._runners: dict[int, _Runner] = {}  # id(worker) -> the runner thread of a blocking worker
        self._closing = False
        self._name = name
        # Driven by an asyncio event loop instead of a thread of its own (adopt): that loop, and the
        # handle of its next timed wake-up (the tick, a timer)
        self._aloop: Any = None
        self._wakeup: Any = None
        self._wake_at = 0.0
        self._handover = False  # the thread is asked to stop so that an asyncio loop takes over
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def on_loop(self) -> bool:
        """Whether this thread handles the replies now: the loop's, or a caller's while it drives."""
        t = threading.current_thread()
        return t is self._thread or t is self._driver

    # -- an asyncio event loop drives it (gfaas serve: the gateway's loop, so a reply is handled on
    # the thread that answers the request, with no second thread contending for the GIL)
    def adopt(self, aloop: Any) -> None:
        """From now on, handle replies on ``aloop``'s thread (call this there): the loop's own thread
        stops and ``aloop`` watches the epoll descriptor instead. :meth:`release` gives it back."""
        if self._aloop is not None or self._closing:
            return
        self._handover = True
        self.post(lambda: None)  # wake the thread: it stops after this round
        self._thread.join(10)
        self._handover = False
        if self._thread.is_alive():  # stuck in a reply's handling: keep the thread, not two drivers
            log.warning("the invoker's loop did not hand over to the event loop within 10 s; it keeps its thread")
            return
        self._thread = threading.current_thread()
        self._aloop = aloop
        aloop.add_reader(self._ep.fileno(), self._pump)
        self._pump()  # what came while the thread stopped, and the first timed wake-up

    def release(self) -> None:
        """Back to a thread of its own (call on the adopting loop's thread, before that loop stops)."""
        aloop = self._aloop
        if aloop is None:
            return
        aloop.remove_reader(self._ep.fileno())
        if self._wakeup is not None:
            self._wakeup.cancel()
            self._wakeup = None
        self._aloop = None
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        """One round on the adopting loop (its reader callback and timed wake-up)."""
        if self._aloop is None or self._closing:
            return
        self._once(0.0)
        due = self._due()
        if due is not None and (self._wakeup is None or due < self._wake_at):
            if self._wakeup is not None:
                self._wakeup.cancel()
            self._wake_at = due
            self._wakeup = self._aloop.call_later(max(0.0, due - time.monotonic()), self._timed)

    def _timed(self) -> None:
        self._wakeup = None
        self._pump()

    def poll(self) -> None:
        """Handle the replies already in, now, when an asyncio loop drives this one and this is its
        thread (a no-op otherwise). A server calls it between its own callbacks: in a round with
        hundreds of connections ready, a worker's reply would otherwise wait for the next round,
        and the worker idles that long before its next task (:meth:`_pump` runs once per round)."""
        if self._aloop is not None and self._thread is threading.current_thread():
            self._pump()

    # -- from any thread
    def post(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the loop's thread, soon."""
        self._posted.append(fn)
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:
            pass  # the pipe is full: the loop is awake already
        except OSError:
            if not self._closing:
                raise

    def nudge(self) -> None:
        """A task just went out: wake the loop if it sleeps and polls for replies, so that it polls for
        this one (the wake-up overlaps the task's run instead of following its reply)."""
        if self._sleeping and self._polls is not None and self._polls():
            try:
                os.write(self._wake_w, b"\0")
            except OSError:  # full (it is awake already) or closed
                pass

    def drive(self, done: Callable[[], bool], until: float | None = None) -> bool:
        """On a thread that waits for ``done()`` (Invoker.invoke's caller): read and handle the
        replies here, asking for them without blocking, until ``done()``, until the rule (``polls``)
        says sleep, until ``poll_s`` passes with nothing, or until ``until`` (perf_counter).
        Meanwhile the loop's thread does not watch the replies (it still runs posted calls, timers
        and the tick, once this returns), so no thread is woken per step: the caller's task went out
        without a nudge, and the result is set on the thread that waits for it. False at once when
        it cannot: an asyncio loop drives this one, the loop's thread is handling something, this is
        the loop's thread, or the rule says sleep; the loop's thread handles the replies then."""
        polls = self._polls
        if polls is None or not self.take(polls()):
            return False
        try:
            end = time.perf_counter() + self._poll_s
            while True:
                if self._read_replies() or self._posted:
                    self.run_posted()
                    # Only what was handled can end the wait or turn the rule (a task asked for
                    # the data plane, the result is set): asked here, not on every empty poll.
                    if done() or not polls() or self._closing:
                        break
                    end = time.perf_counter() + self._poll_s
                now = time.perf_counter()
                if now > end or (until is not None and now > until):
                    break
                os.sched_yield()  # a process queued on this CPU (the worker it waits for) runs now
        finally:
            self.give()
        return True

    @property
    def poll_s(self) -> float:
        """How long a caller that drives asks for replies with nothing coming before it sleeps."""
        return self._poll_s

    @property
    def posted(self) -> bool:
        """Whether calls posted from other threads wait (a caller that drives runs them: run_posted)."""
        return bool(self._posted)

    def take(self, polls: bool) -> bool:
        """For a caller about to drive (:meth:`drive`, or the invoker's lane, which reads its one
        worker itself): hold the baton, so that this thread alone handles replies and posted calls
        until :meth:`give`, and take the replies out of what the loop's thread waits on. ``polls``:
        the polling rule's answer for this caller. False, having done nothing, when it cannot (as
        for drive)."""
        if not polls or self._polls is None or self._aloop is not None or self._handover or self._closing \
                or self.on_loop or not self._baton.acquire(blocking=False):
            return False
        self._driver = threading.current_thread()
        try:
            self._ep.unregister(self._replies.fileno())  # the loop's thread, asleep or about to be, no longer sees them
        except BaseException:
            self._driver = None
            self._baton.release()
            raise
        return True

    def give(self) -> None:
        """After :meth:`take`: what comes from now on wakes the loop's thread again."""
        try:
            self._ep.register(self._replies.fileno(), select.EPOLLIN)
        except (OSError, ValueError):  # closed meanwhile
            pass
        self._driver = None
        self._baton.release()

    def run_posted(self) -> None:
        """Run the calls posted so far (holding the baton)."""
        while self._posted:
            self._call(self._posted.popleft())

    def deliver(self, worker: Any, msg: Any) -> None:
        """Handle ``msg`` from ``worker`` (holding the baton) as if the loop had read it: a caller that
        read a worker's socket itself hands over what it will not handle (an end, a broken message
        stops the loop watching that worker, once)."""
        if msg is None or isinstance(msg, BaseException):
            self._unregister(worker)  # its end is reported once
        self._on_message_safely(worker, msg)

    def attach(self, worker: Any) -> None:
        """Read ``worker``'s replies from now on: a socket worker's on the loop, a blocking one's on a
        runner thread of its own."""
        if hasattr(worker, "fileno") and hasattr(worker, "receive"):
            self.post(lambda: self._register(worker))
        else:
            self._runners[id(worker)] = _Runner(worker, self)

    def detach(self, worker: Any, timeout: float = 10.0) -> None:
        """Stop reading ``worker``'s replies (before it is stopped); returns once that holds."""
        runner = self._runners.pop(id(worker), None)
        if runner is not None:
            runner.close()
            return
        if self.on_loop:
            self._unregister(worker)
            return
        done = threading.Event()

        def unregister() -> None:
            self._unregister(worker)
            done.set()

        self.post(unregister)
        if not done.wait(timeout) and self._thread.is_alive():
            log.warning("the invoker's loop did not let go of worker %s within %g s", getattr(worker, "name", "?"),
                        timeout)

    def run_blocking(self, worker: Any, call: Callable[[], Any]) -> None:
        """Run ``call`` (a blocking worker's ``run``) on its runner thread; its return value, or the
        exception it raised, reaches ``on_message`` on the loop."""
        runner = self._runners.get(id(worker))
        if runner is None:
            runner = self._runners[id(worker)] = _Runner(worker, self)
        runner.submit(call)

    def call_at(self, at: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the loop at monotonic time ``at`` (or soon after)."""
        entry = (at, next(self._seq), fn)
        if self.on_loop:
            heapq.heappush(self._timers, entry)
        else:
            self.post(lambda: heapq.heappush(self._timers, entry))

    def close(self) -> None:
        self._closing = True
        self.post(lambda: None)
        if self._aloop is None:
            self._thread.join(10)
        else:  # its adopting loop was never released (it stopped without its shutdown)
            try:
                self._aloop.call_soon_threadsafe(self._aloop.remove_reader, self._ep.fileno())
            except RuntimeError:  # that loop is closed
                pass
        for runner in list(self._runners.values()):
            runner.close()
        self._runners.clear()
        self._ep.close()
        self._replies.close()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    # -- on the loop
    def _register(self, worker: Any) -> None:
        try:
            fd = worker.fileno()
            if self._watched.get(fd) is worker:
                raise ValueError(f"fd {fd} is watched already")
            if self._watched.pop(fd, None) is not None:  # a closed worker's number, reused
                try:
                    self._replies.unregister(fd)
                except OSError:
                    pass
            self._replies.register(fd, select.EPOLLIN)
            self._watched[fd] = worker
        except (ValueError, OSError) as exc:  # registered twice, or its socket closed already
            log.debug("not watching worker %s: %s", getattr(worker, "name", "?"), exc)

    def _unregister(self, worker: Any) -> None:
        for fd, w in list(self._watched.items()):
            if w is worker:
                del self._watched[fd]
                try:
                    self._replies.unregister(fd)
                except OSError:  # its socket closed already (epoll forgot it then)
                    pass

    def _due(self) -> float | None:
        """When the next tick or timer is due (monotonic), if any."""
        until = self._next_tick if self._tick is not None else None
        if self._timers:
            until = self._timers[0][0] if until is None else min(until, self._timers[0][0])
        return until

    def _run(self) -> None:
        polls = self._polls
        while not self._closing and not self._handover:
            if polls is not None and self._driver is None and polls():
                end = time.perf_counter() + self._poll_s
                while not self._closing and not self._handover and self._driver is None and polls():
                    if self._once(0.0):
                        end = time.perf_counter() + self._poll_s
                    elif time.perf_counter() > end:
                        break
                    else:
                        os.sched_yield()  # as in drive
                if self._closing or self._handover:  # its wake-up was read while polling: no sleep
                    break
            until = self._due()
            self._sleeping = True
            self._once(-1.0 if until is None else max(0.0, until - time.monotonic()))
            self._sleeping = False

    def _once(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds (-1: until something comes) and handle what came, what was
        posted, and the timers and tick now due. False: nothing came and nothing was due."""
        try:
            events = self._ep.poll(timeout)
        except OSError:  # a socket closed under epoll: look again
            events = []
        handled = bool(events) or bool(self._posted)
        with self._baton:  # a caller that drives has it: this waits for it to finish
            for fd, _ in events:
                if fd == self._wake_r:
                    try:
                        while os.read(self._wake_r, 4096):
                            pass
                    except BlockingIOError:
                        pass
            if events:
                self._read_replies()  # asked again: a caller may have read what woke this thread
            while self._posted:
                self._call(self._posted.popleft())
            now = time.monotonic()
            while self._timers and self._timers[0][0] <= now:
                handled = True
                self._call(heapq.heappop(self._timers)[2])
            if self._tick is not None and now >= self._next_tick:
                handled = True
                self._next_tick = now + TICK_S
                self._call(self._tick)
        return handled

    def _read_replies(self) -> bool:
        """Handle every reply in now (holding the baton); whether there was one."""
        try:
            events = self._replies.poll(0)
        except OSError:  # a socket closed under epoll: look again next time
            return False
        for fd, _ in events:
            worker = self._watched.get(fd)
            if worker is None:
                continue
            try:
                msg = worker.receive()
            except BlockingIOError:  # nothing after all
                continue
            except Exception as exc:  # noqa: BLE001 - a broken message ends that worker, not the loop
                msg = exc
            self.deliver(worker, msg)
        return bool(events)

    def _on_message_safely(self, worker: Any, msg: Any) -> None:
        try:
            self._on_message(worker, msg)
        except Exception:  # noqa: BLE001 - a bug in one step must not stop every invocation
            log.exception("internal error in the invoker's loop handling a reply of %s", getattr(worker, "name", "?"))

    @staticmethod
    def _call(fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:  # noqa: BLE001 - a bug in one step must not stop every invocation
            log.exception("internal error in the invoker's loop")


class _Runner:
    """The thread of a worker whose ``run`` blocks: it runs one call at a time and posts the outcome."""

    def __init__(self, worker: Any, loop: ReplyLoop) -> None:
        self.worker = worker
        self._loop = loop
        self._q: queue.SimpleQueue[Callable[[], Any] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"gfaas-run-{getattr(worker, 'name', '?')}",
                                        daemon=True)
        self._thread.start()

    def submit(self, call: Callable[[], Any]) -> None:
        self._q.put(call)

    def close(self) -> None:
        self._q.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join(30)

    def _run(self) -> None:
        while (call := self._q.get()) is not None:
            try:
                out: Any = call()
            except Exception as exc:  # noqa: BLE001 - reported as the call's outcome
                out = exc
            self._loop.post(functools.partial(self._loop._on_message_safely, self.worker, out))
