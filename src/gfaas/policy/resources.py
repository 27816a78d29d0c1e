"""What a function's worker reserves on its node, and which idle workers make room for another.

A spec's ``resources: {cpus, memory, gpus}`` (:func:`parse_resources`) is a reservation per worker:
the runtime starts a worker only when the node's unreserved capacity covers it
(:class:`Ledger`), so workers never oversubscribe the node's cores, memory or GPUs. When a start
does not fit, idle workers of other functions (above their ``min``) may be stopped to make room,
the longest idle first (:func:`choose_evictions`); when even that does not make room the start
waits (its requests stay queued) until a worker stops.

Defaults are small on purpose, so that today's specs, which declare nothing, keep running: an idle
warm worker costs no CPU, so the default CPU reservation (0.05 of a core) only bounds how many
workers a node keeps; a function that computes should declare what it uses (``cpus: 1``). ``gpus``
is a share of the one GPU the function is placed on (0 < gpus <= 1; 0: shares it unreserved).

Pure: no clock, files or threads. The runtime holds the ledger under its own lock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..units import parse_size

__all__ = ["DEFAULT_RESOURCES", "Candidate", "Ledger", "Resources", "choose_evictions", "parse_resources"]

_EPS = 1e-9


@dataclass(frozen=True)
class Resources:
    """A worker's reservation: CPU cores (fractions allowed), memory in bytes, a share of its GPU."""

    cpus: float = 0.05
    memory: int = 128 << 20
    gpus: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.cpus, bool) or not isinstance(self.cpus, int | float) or not (
                math.isfinite(self.cpus) and self.cpus > 0):
            raise ConfigError(f"resources.cpus = {self.cpus!r}: give the cores a worker reserves, a number > 0 "
                              "(e.g. 0.5 or 2)")
        if isinstance(self.memory, bool) or not isinstance(self.memory, int) or self.memory < 0:
            raise ConfigError(f"resources.memory = {self.memory!r}: give bytes >= 0 or a size such as 512MiB")
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int | float) or not 0 <= self.gpus <= 1:
            raise ConfigError(f"resources.gpus = {self.gpus!r}: give the share of its GPU a worker reserves, "
                              "0 <= gpus <= 1 (a worker runs on one GPU; 0 shares it unreserved)")

    def describe(self) -> dict[str, Any]:
        return {"cpus": self.cpus, "memory": self.memory, "gpus": self.gpus}


DEFAULT_RESOURCES = Resources()


def parse_resources(obj: Mapping[str, Any] | None) -> Resources:
    """:class:`Resources` from a spec's ``resources:`` mapping (None or empty: the defaults)."""
    if obj is None:
        return DEFAULT_RESOURCES
    if not isinstance(obj, Mapping):
        raise ConfigError(f"resources: expected a mapping such as {{cpus: 1, memory: 512MiB}}, got {obj!r}")
    unknown = sorted(str(k) for k in obj if k not in ("cpus", "memory", "gpus"))
    if unknown:
        raise ConfigError(f"resources: unknown key(s) {', '.join(unknown)}; known keys: cpus, memory, gpus")
    args: dict[str, Any] = {}
    if "cpus" in obj:
        args["cpus"] = obj["cpus"]
    if "gpus" in obj:
        args["gpus"] = obj["gpus"]
    if "memory" in obj:
        mem = obj["memory"]
        if isinstance(mem, str):
            try:
                mem = parse_size(mem)
            except (ValueError, ConfigError):
                raise ConfigError(f"resources.memory = {mem!r}: give bytes or a size such as 512MiB or 2GiB") from None
        args["memory"] = mem
    return Resources(**args)


@dataclass(frozen=True)
class Candidate:
    """An idle worker that may be stopped to make room: its owner's key, id, reservation, GPU and
    since when it is idle."""

    key: str
    id: int
    res: Resources
    gpu: str
    idle_since: float


class Ledger:
    """One node's capacity and what its workers reserve (CPU cores, bytes, per-GPU shares)."""

    def __init__(self, cpus: float, memory: int, gpus: Sequence[str] = ()) -> None:
        if not cpus > 0 or memory <= 0:
            raise ConfigError(f"a node needs cpus > 0 and memory > 0 to place workers, got {cpus} and {memory}")
        self.cpus, self.memory = float(cpus), int(memory)
        self.gpus = {g: 1.0 for g in gpus}
        self.used_cpus, self.used_memory = 0.0, 0
        self.used_gpus = {g: 0.0 for g in gpus}

    def fits(self, res: Resources, gpu: str = "", freed: Sequence[Candidate] = ()) -> bool:
        """Whether ``res`` (on ``gpu``) fits, counting ``freed`` workers as gone."""
        cpus = self.used_cpus - sum(c.res.cpus for c in freed) + res.cpus
        mem = self.used_memory - sum(c.res.memory for c in freed) + res.memory
        if cpus > self.cpus + _EPS or mem > self.memory:
            return False
        if res.gpus > 0 and gpu in self.gpus:
            used = self.used_gpus[gpu] - sum(c.res.gpus for c in freed if c.gpu == gpu)
            return used + res.gpus <= self.gpus[gpu] + _EPS
        return True

    def check_ever_fits(self, res: Resources, what: str) -> None:
        """Refuse a reservation the empty node could not hold (it would wait forever)."""
        if res.cpus > self.cpus + _EPS or res.memory > self.memory:
            raise ConfigError(f"{what}: resources {res.describe()} exceed the node's capacity (cpus {self.cpus:g}, "
                              f"memory {self.memory} bytes); lower them or give the runtime more "
                              "(RuntimeConfig.node_cpus / node_memory_bytes)")

    def reserve(self, res: Resources, gpu: str = "") -> None:
        self.used_cpus += res.cpus
        self.used_memory += res.memory
        if res.gpus > 0 and gpu in self.used_gpus:
            self.used_gpus[gpu] += res.gpus

    def release(self, res: Resources, gpu: str = "") -> None:
        self.used_cpus = max(0.0, self.used_cpus - res.cpus)
        self.used_memory = max(0, self.used_memory - res.memory)
        if res.gpus > 0 and gpu in self.used_gpus:
            self.used_gpus[gpu] = max(0.0, self.used_gpus[gpu] - res.gpus)

    def describe(self) -> dict[str, Any]:
        return {"cpus": self.cpus, "memory": self.memory, "used_cpus": round(self.used_cpus, 6),
                "used_memory": self.used_memory, "gpus": dict(self.gpus), "used_gpus": dict(self.used_gpus)}


def choose_evictions(ledger: Ledger, res: Resources, gpu: str, candidates: Sequence[Candidate]) -> list[Candidate] | None:
    """The fewest longest-idle candidates whose stopping makes ``res`` fit (``[]`` if it fits now;
    None if even stopping all of them would not)."""
    if ledger.fits(res, gpu):
        return []
    chosen: list[Candidate] = []
    for c in sorted(candidates, key=lambda c: (c.idle_since, c.key, c.id)):
        chosen.append(c)
        if ledger.fits(res, gpu, chosen):
            return chosen
    return None
