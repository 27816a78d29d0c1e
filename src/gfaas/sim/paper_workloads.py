"""What the seed papers state about their workloads, read from ``data/paper_workloads.toml``.

The table is data, kept apart from the code that uses it (:mod:`gfaas.sim.workflows`), and every entry
names the section of the paper it restates. So far it holds one kind of statement: which functions of
the runtime's specs the papers run on a GPU (their pre- and post-processing, with CV-CUDA) where the
specs, written for CPU machines, run them on the host.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources

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


def parse(text: str, name: str = FILE) -> tuple[OnGpu, ...]:
    """The ``on_gpu`` entries of every paper in ``text`` (TOML), checked."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{name}: not valid TOML: {exc}") from None
    out: list[OnGpu] = []
    seen: set[tuple[str, str]] = set()
    for key, sec in doc.items():
        if not isinstance(sec, dict) or not isinstance(sec.get("paper"), str):
            raise ConfigError(f"{name}: [{key}] needs paper = \"the paper it restates\"")
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
    text = resources.files("gfaas.sim").joinpath("data", FILE).read_text(encoding="utf-8")
    return {(e.workflow, e.function): e for e in parse(text)}
