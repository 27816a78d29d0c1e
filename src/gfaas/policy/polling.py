"""How long a thread that waits for the next message polls before it sleeps.

A thread blocked in ``recv`` or ``epoll_wait`` gives its CPU back; the message that ends the wait
must then wake it, and on a virtual machine with idle vCPUs a wake-up is an inter-processor
interrupt and a vCPU leaving its halt: tens of microseconds, against a few for a round trip between
two processes that are both awake (``make profile-results`` measures both: ``wake`` in
``benchmarks/results/profile-after-cpu.json``). A tiny invocation waits twice on its critical path
(its worker for the task, the invoker for the reply).

Polling for a short window first (asking without blocking, over and over) keeps the thread awake
for a message that comes soon and costs CPU for one that does not. The rule here bounds that cost:

* never on a single core, where the poller would hold the CPU its sender needs;
* only while the runtime has one invocation unresolved, the latency-bound case of a caller that
  waits for each result: under load (several unresolved) the CPU a poller would burn is the
  gateway's and the other workers', and tasks queue anyway, so nobody polls;
* only around light tasks, whose values ride in the messages: a task that uses the node's data
  plane needs the node daemon's CPU too (and the next step's worker), and on two cores a poller
  takes it;
* a worker polls only while its tasks come close together: if the last gap between its reply and
  its next task was longer than the window, it sleeps at once (arrivals are sparse, and polling
  would burn the whole window for nothing). A gap measured asleep includes the wake-up itself, which
  can keep it over the window although tasks come close again, so every ``PROBE_EVERY``-th wait
  polls anyway and measures the gap awake;
* a poller yields its CPU between looks (``sched_yield``, in the runtime's loops): with two
  pollers on two vCPUs, a process woken while it slept is queued on its waker's CPU, behind the
  poller that waits for it, and without the yield it runs only when the scheduler preempts that
  poller (whole runs of tiny invocations at 0.5 ms instead of 0.15; a yield costs nothing when
  no one is queued);
* for the invoker, one unresolved invocation matters twice: with more, other threads of its
  process need the interpreter's lock to submit theirs, and a poller that takes it back after every
  look slows them.

Pure: the caller measures the gap and the cores, and passes them in.
"""

from __future__ import annotations

DEFAULT_POLL_US = 300  # RuntimeConfig.poll_us: about 3x the gap of a closed loop of tiny invocations here
MAX_POLL_US = 10_000
PROBE_EVERY = 8  # a worker that sleeps at once polls on this many-th wait all the same


def worker_poll_s(window_s: float, cores: int, last_gap_s: float | None, light: bool = True,
                  slept: int = 0) -> float:
    """Seconds a worker asks for its next task without blocking before it sleeps on its socket.

    ``window_s``: the configured window (0: never poll); ``cores``: the CPUs this process may run on;
    ``last_gap_s``: from its last reply to the task after it (None: no task came after a reply yet);
    ``light``: its last task ran on carried values alone (it never asked for the data plane), and
    was its invocation's while that was the runtime's only one unresolved (``Task.alone``);
    ``slept``: how many waits in a row it slept at once because of the gap."""
    if window_s <= 0 or cores < 2 or not light:
        return 0.0
    if last_gap_s is not None and last_gap_s > window_s and slept + 1 < PROBE_EVERY:
        return 0.0
    return window_s


def worker_wait(window_s: float, cores: int, last_gap_s: float | None, light: bool, slept: int) -> tuple[float, int]:
    """:func:`worker_poll_s`, and what ``slept`` becomes for the wait after this one: one more when
    this wait sleeps at once because of the gap alone, 0 otherwise (it polls, or sleeps for another
    reason, which a probe would not change)."""
    poll_s = worker_poll_s(window_s, cores, last_gap_s, light, slept)
    gapped = window_s > 0 and cores >= 2 and light and last_gap_s is not None and last_gap_s > window_s
    return poll_s, slept + 1 if gapped and not poll_s else 0


def invoker_polls(window_s: float, cores: int, unresolved: int, tasks_out: int, light: bool = True) -> bool:
    """Whether the invoker's loop polls for replies rather than sleeping on them: a window is set,
    there are two cores or more, exactly one invocation is unresolved, it has a task out, and every
    task out is light (sent on values alone, and has not asked for the data plane)."""
    return window_s > 0 and cores >= 2 and unresolved == 1 and tasks_out > 0 and light
