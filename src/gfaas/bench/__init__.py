"""Benchmarks that run gfaas against real peers in one run (``gfaas bench ...``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def emit(doc: dict[str, Any], out: str | None, as_json: bool) -> bool:
    """Write a benchmark's document to ``out`` (if given) and print it with ``as_json``; True when
    printed (the command is done), False when the caller prints its own table."""
    text = json.dumps(doc, indent=2)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n")
    if as_json:
        print(text)
    return as_json
