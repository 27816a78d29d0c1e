"""The two-hop pipe floor of ``gfaas bench overload``: both relays carry every byte and end cleanly."""

from __future__ import annotations

import pytest

from gfaas.bench.overload import relay_samples
from gfaas.proctree import descendants


@pytest.mark.parametrize("poll", [False, True], ids=["blocking", "polling"])
def test_the_relay_times_each_round_trip_and_leaves_no_process(poll: bool) -> None:
    import os

    before = set(descendants(os.getpid()))
    ts = relay_samples(40, 5, size=300, poll=poll)
    assert ts.shape == (40,) and (ts > 0).all()
    assert set(descendants(os.getpid())) <= before  # both relays saw their pipe close and exited
