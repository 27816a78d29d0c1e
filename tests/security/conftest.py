"""Fixtures the attack suite shares."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from gfaas.dataplane.local import LocalNode


@pytest.fixture
def support_node(make_config: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalNode]:
    """A node daemon whose runtime's workers can import the hostile handlers of ``tests/support``
    (on this process's path and, through PYTHONPATH, on the workers')."""
    support = os.path.join(os.path.dirname(__file__), "..", "support")
    monkeypatch.syspath_prepend(support)
    monkeypatch.setenv("PYTHONPATH", os.path.abspath(support))
    with LocalNode(make_config()) as n:
        yield n
