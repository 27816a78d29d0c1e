"""What the cross-node parts (transfer server, puller) need of the node daemon, typed.

They run on their own threads and reach the store only under the daemon's lock. A transfer that
reads or writes a segment through a view pins it, so the segment is not handed to another object
meanwhile.
"""

from __future__ import annotations

import threading
from typing import Protocol

from .store import Segment, Session, Store


class NodeAccess(Protocol):
    """The node daemon as the transfer server and the puller see it."""

    @property
    def lock(self) -> threading.RLock: ...

    @property
    def store(self) -> Store: ...


def pin_for_transfer(store: Store, seg: Segment, invocation: str) -> Session:
    """Pin ``seg`` for a transfer that reads or writes it through a view (call under the daemon lock),
    so that it is not handed to another object meanwhile; :func:`unpin` when done."""
    holder = Session(-1, invocation, "<transfer>", ())
    store.pin(holder, seg)
    return holder


def unpin(store: Store, holder: Session) -> None:
    store.release_all(holder)
