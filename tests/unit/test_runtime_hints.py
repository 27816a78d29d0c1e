"""The runtime's queue hinter: sends only what changed, forgets ended invocations, survives errors."""

from __future__ import annotations

from gfaas.errors import NotFound
from gfaas.runtime.hints import Hint, QueueHinter


def test_flush_sends_changes_only_and_forgets_ended_invocations() -> None:
    hints: list[Hint] = [("a", {"f": 2}, []), ("b", {"g": 0}, ["f"])]
    sent: list[Hint] = []
    h = QueueHinter(lambda: list(hints), sent.append, interval_s=0.0)
    try:
        assert h.flush() == 2 and sent == hints
        assert h.flush() == 0  # nothing changed: nothing sent
        hints[0] = ("a", {"f": 1}, [])
        assert h.flush() == 1 and sent[-1] == ("a", {"f": 1}, [])
        del hints[1]  # b ended ...
        h.flush()
        hints.append(("b", {"g": 0}, ["f"]))  # ... and an invocation of that id is hinted afresh
        assert h.flush() == 1 and sent[-1] == ("b", {"g": 0}, ["f"])
    finally:
        h.close()


def test_a_hint_the_daemon_refuses_is_tried_again_next_time() -> None:
    fail = [True]
    sent: list[Hint] = []

    def send(hint: Hint) -> None:
        if fail[0]:
            raise NotFound("no such open invocation")
        sent.append(hint)

    h = QueueHinter(lambda: [("a", {"f": 0}, [])], send, interval_s=0.0)
    try:
        assert h.flush() == 0 and sent == []
        fail[0] = False
        assert h.flush() == 1 and sent == [("a", {"f": 0}, [])]
    finally:
        h.close()


def test_poke_wakes_the_thread() -> None:
    import threading

    got = threading.Event()
    h = QueueHinter(lambda: [("a", {"f": 0}, [])], lambda hint: got.set(), interval_s=0.0)
    try:
        h.poke()
        assert got.wait(5)
    finally:
        h.close()
