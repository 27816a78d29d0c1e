"""The runtime's queue hinter: sends what was marked as changed, in one batch per round; keeps what
it could not send for the next round; survives errors."""

from __future__ import annotations

import threading

from gfaas.errors import NotFound
from gfaas.runtime.hints import Batch, QueueHinter


class State:
    """A stand-in for the runtime: each invocation's entry, each queue's head; counts what collect reads."""

    def __init__(self) -> None:
        self.entries: dict[str, tuple[dict[str, tuple[str, int]], list[str], list[str]]] = {}
        self.heads: dict[str, int] = {}
        self.read: list[tuple[set[str], set[str]]] = []

    def collect(self, invocations: set[str], queues: set[str]) -> Batch:
        self.read.append((set(invocations), set(queues)))
        out = [(i, *self.entries[i]) for i in sorted(invocations) if i in self.entries]
        qs = set(queues) | {q for e in out for q, _ in e[1].values()}
        return out, {q: self.heads[q] for q in sorted(qs) if q in self.heads}


def test_a_round_sends_only_what_was_marked_in_one_batch() -> None:
    """collect is asked about the marked invocations and queues only (never all of them); a round with
    nothing marked sends nothing; ended invocations (collect leaves them out) are simply not sent."""
    st = State()
    st.entries = {"a": ({"f": ("q", 5)}, [], []), "b": ({}, ["g"], ["f"]), "c": ({}, ["f"], [])}
    st.heads = {"q": 3}
    sent: list[Batch] = []
    h = QueueHinter(st.collect, sent.append, interval_s=60.0, thread=False)
    try:
        h.changed("a")
        h.changed("b", "q")
        assert h.flush() == ["a", "b"]
        assert st.read[-1] == ({"a", "b"}, {"q"})  # c was not looked at
        assert sent == [([("a", {"f": ("q", 5)}, [], []), ("b", {}, ["g"], ["f"])], {"q": 3})]
        assert h.flush() == [] and len(sent) == 1  # nothing marked: nothing read, nothing sent
        st.heads["q"] = 6
        h.changed(None, "q")  # a dispatch: one head moves, no waiter's entry is sent
        h.flush()
        assert sent[-1] == ([], {"q": 6})
        del st.entries["a"]  # ended
        h.changed("a")
        assert h.flush() == [] and len(sent) == 2
        assert (h.sent, h.rounds) == (2, 2)
    finally:
        h.close()


def test_a_batch_that_is_refused_is_sent_again_next_round() -> None:
    fail = [True]
    sent: list[Batch] = []

    def send(batch: Batch) -> None:
        if fail[0]:
            raise NotFound("no such open invocation")
        sent.append(batch)

    st = State()
    st.entries = {"a": ({}, ["f"], [])}
    h = QueueHinter(st.collect, send, interval_s=60.0, thread=False)
    try:
        h.changed("a")
        assert h.flush() == [] and sent == []
        fail[0] = False
        assert h.flush() == ["a"] and sent == [([("a", {}, ["f"], [])], {})]
    finally:
        h.close()


def test_changed_wakes_the_thread() -> None:
    got = threading.Event()
    st = State()
    st.entries = {"a": ({}, ["f"], [])}
    h = QueueHinter(st.collect, lambda batch: got.set(), interval_s=0.0)
    try:
        h.changed("a")
        assert got.wait(5)
    finally:
        h.close()
