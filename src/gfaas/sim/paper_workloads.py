"""What the seed papers state about their workloads, read from ``data/paper_workloads.toml``.

The table is data, kept apart from the code that uses it (:mod:`gfaas.sim.workflows`), and every entry
names the section of the paper it restates. It holds two kinds of statement: which functions of the
runtime's specs the papers run on a GPU (their pre- and post-processing, with CV-CUDA) where the specs,
written for CPU machines, run them on the host (``on_gpu``); and how many requests an experiment's
burst holds where the paper says (``burst``).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from ..errors import ConfigError

FILE = "paper_workloads.toml"


@dataclass(frozen=True)
class OnGpu:
    """A function the paper runs on a GPU: ``step`` says what it is, ``where`` where the paper says so."""

    workflow: str
    function: str
    step: str
    where: str
    paper: str


@dataclass(frozen=True)
class Burst:
    """The number of requests in an experiment's burst, as the paper states it (``where``)."""

    experiment: str
    requests: int
    where: str
    paper: str


def _load(text: str, name: str) -> dict[str, dict[str, Any]]:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{name}: not valid TOML: {exc}") from None
    for key, sec in doc.items():
        if not isinstance(sec, dict) or not isinstance(sec.get("paper"), str):
            raise ConfigError(f"{name}: [{key}] needs paper = \"the paper it restates\"")
    return doc


def parse_bursts(text: str, name: str = FILE) -> tuple[Burst, ...]:
    """The ``burst`` entries of every paper in ``text`` (TOML), checked."""
    out: list[Burst] = []
    for key, sec in _load(text, name).items():
        for k, e in enumerate(sec.get("burst", [])):
            e = e if isinstance(e, dict) else {}
            exp, where, n = e.get("experiment"), e.get("where"), e.get("requests")
            if not isinstance(exp, str) or not exp or not isinstance(where, str) or not where:
                raise ConfigError(f"{name}: [[{key}.burst]] entry {k + 1} needs experiment and where (non-empty strings)")
            if type(n) is not int or n < 1:
                raise ConfigError(f"{name}: [[{key}.burst]] {exp}: requests = {n!r}; give a whole number >= 1")
            if any(b.experiment == exp for b in out):
                raise ConfigError(f"{name}: the burst of {exp} is listed twice; keep one entry")
            out.append(Burst(exp, n, where, str(sec["paper"])))
    return tuple(out)


@cache
def bursts() -> dict[str, Burst]:
    """experiment -> the number of requests in its burst, as its paper states it."""
    return {b.experiment: b for b in parse_bursts(_shipped())}


def _shipped() -> str:
    return resources.files("gfaas.sim").joinpath("data", FILE).read_text(encoding="utf-8")


def parse(text: str, name: str = FILE) -> tuple[OnGpu, ...]:
    """The ``on_gpu`` entries of every paper in ``text`` (TOML), checked."""
    doc = _load(text, name)
    out: list[OnGpu] = []
    seen: set[tuple[str, str]] = set()
    for key, sec in doc.items():
        for k, e in enumerate(sec.get("on_gpu", [])):
            fields = {f: e.get(f) if isinstance(e, dict) else None for f in ("workflow", "function", "step", "where")}
            bad = [f for f, v in fields.items() if not isinstance(v, str) or not v]
            if bad:
                raise ConfigError(f"{name}: [[{key}.on_gpu]] entry {k + 1} lacks {', '.join(bad)} (each a non-empty string)")
            vals: dict[str, str] = {f: str(v) for f, v in fields.items()}
            pair = (vals["workflow"], vals["function"])
            if pair in seen:
                raise ConfigError(f"{name}: {pair[0]}.{pair[1]} is listed twice; keep one entry")
            seen.add(pair)
            out.append(OnGpu(**vals, paper=sec["paper"]))
    return tuple(out)


@cache
def on_gpu() -> dict[tuple[str, str], OnGpu]:
    """(workflow, function) -> the paper's statement that it runs on a GPU."""
    return {(e.workflow, e.function): e for e in parse(_shipped())}
