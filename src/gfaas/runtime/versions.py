"""Workflow versions: each deploy of a name makes a new version; invocations run on the version that
was current when they were submitted, so an update never cuts one short.

:class:`VersionTable` is the bookkeeping only (numbers, specs, code packages, which is current); the
runtime starts and drains the workers. A deploy whose spec text and code are those of the current
version makes no new version (deploying twice is harmless); a rollback makes a new version with an old
one's content, so the history only grows and every number keeps meaning one thing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..errors import NotFound
from .codepkg import StoredPackage
from .spec import WorkflowSpec


@dataclass(frozen=True)
class WorkflowVersion:
    number: int
    spec: WorkflowSpec
    code: StoredPackage | None = None
    created: float = field(default_factory=time.time)
    note: str = ""  # "rollback to N" for a rollback

    def same_content(self, spec: WorkflowSpec, code: str | None) -> bool:
        return self.spec.text == spec.text and (self.code.digest if self.code else None) == code

    def describe(self, current: bool) -> dict[str, object]:
        return {"version": self.number, "current": current, "created": self.created, "note": self.note,
                "code": None if self.code is None else {"digest": self.code.digest, "files": self.code.files,
                                                         "bytes": self.code.nbytes}}


class VersionTable:
    """Versions by workflow name (callers hold the runtime's lock)."""

    def __init__(self) -> None:
        self._versions: dict[str, list[WorkflowVersion]] = {}
        self._current: dict[str, int] = {}

    def next_number(self, name: str) -> int:
        history = self._versions.get(name)
        return history[-1].number + 1 if history else 1

    def current(self, name: str) -> WorkflowVersion | None:
        number = self._current.get(name)
        return None if number is None else self.get(name, number)

    def get(self, name: str, number: int) -> WorkflowVersion:
        for v in self._versions.get(name, ()):
            if v.number == number:
                return v
        known = [v.number for v in self._versions.get(name, ())]
        raise NotFound(f"workflow {name!r} has no version {number!r}; its versions: {known or 'none (not deployed)'}")

    def add(self, version: WorkflowVersion) -> int | None:
        """Record ``version`` as current; returns the version it replaces (None for a first deploy)."""
        name = version.spec.name
        old = self._current.get(name)
        self._versions.setdefault(name, []).append(version)
        self._current[name] = version.number
        return old

    def drop(self, name: str) -> list[WorkflowVersion]:
        """Forget every version of ``name`` (undeploy); returns them."""
        self._current.pop(name, None)
        return self._versions.pop(name, [])

    def describe(self, name: str) -> list[dict[str, object]]:
        if name not in self._current:
            raise NotFound(f"no workflow {name!r} is deployed")
        return [v.describe(v.number == self._current[name]) for v in self._versions[name]]
