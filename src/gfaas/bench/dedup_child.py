"""One worker process of ``gfaas bench dedup``: loads what the parent says, hints on its signal, waits.

Protocol on stdin/stdout, one JSON document per line: the parent sends the job; the child loads and
answers ``{"loaded": true}``; on ``hint`` it hints (so every process of a row hints at the same
moment, after all have loaded) and answers ``{"pid", "before_private", "load_s", "hint_s",
"hint_t0", "hint_t1", "hinted_bytes", "first_call_ms"}`` (``hint_t*``: ``time.monotonic()``, one
clock for every process of the machine); then ``calls N`` gets ``{"call_ms": [...]}``; ``exit`` or end
of input ends it.
"""

from __future__ import annotations

import json
import mmap
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Systems whose processes mark what they loaded mergeable (KSM scans only opted-in memory, so the
#: KSM-at-default-settings peer gets the same hint; only its scan speed differs).
HINTING = ("ksm-default", "gfaas-merge")


@dataclass
class Loaded:
    held: Any  # keeps the memory alive
    load_s: float
    view: memoryview | None = None  # the synthetic job's bytes
    hint: Callable[[], int] | None = None  # marks or remaps what was loaded; returns the bytes
    call: Callable[[], Any] | None = None


def _private_bytes() -> int:
    with open("/proc/self/smaps_rollup", encoding="ascii") as f:
        return sum(int(line.split()[1]) * 1024 for line in f if line.startswith(("Private_Clean:", "Private_Dirty:")))


def _touch(view: memoryview) -> None:
    """A function reads what it holds: every page faulted in (after a remap too), in every row."""
    sum(view[k] for k in range(0, len(view), mmap.PAGESIZE))


def _load_bytes(job: dict[str, Any]) -> Loaded:
    """The synthetic job: the bytes of the file ``path`` in this process's memory."""
    system, path, store = job["system"], job["path"], Path(job["store_dir"])
    t0 = time.perf_counter()
    buf: Any
    if system == "gfaas-shared":
        from gfaas.dedup.shared import load_shared

        shared = load_shared(path, domain="bench", store_dir=store)
        buf, view = shared, shared.view
    else:
        buf = mmap.mmap(-1, os.path.getsize(path), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # KSM may merge it
        with open(path, "rb") as f:
            f.readinto(buf)
        view = memoryview(buf)
    _touch(view)
    out = Loaded(buf, time.perf_counter() - t0, view=view)
    if system in HINTING:
        from gfaas.dedup.hint import merge

        out.hint = lambda: merge(buf).length
    elif system == "gfaas-remap":
        from gfaas.dedup.remap import remap_shared

        out.hint = lambda: remap_shared(buf, domain="bench", store_dir=store)
    return out


def _load_model(job: dict[str, Any]) -> Loaded:
    from gfaas import models
    from gfaas.dedup.regions import track_regions

    system = job["system"]
    kw: dict[str, Any] = {}
    if system == "gfaas-shared":
        kw = {"shared": True, "domain": "bench", "store_dir": Path(job["store_dir"])}
    t0 = time.perf_counter()
    with track_regions() as tracked:
        model = models.load(job["model"], scale=job["scale"], threads=1, **kw)
    out = Loaded(model, time.perf_counter() - t0)
    if system in HINTING:
        from gfaas.dedup.hint import merge_regions

        out.hint = lambda: merge_regions(tracked.regions)
    feeds = model.example_inputs()
    out.call = lambda: model(**feeds)
    return out


def main() -> int:
    job = json.loads(sys.stdin.readline())
    # Every system imports the same modules before ``before_private`` is read, so rows differ only
    # in what the load and the hint did.
    import gfaas.dedup.hint
    import gfaas.dedup.regions
    import gfaas.dedup.remap
    import gfaas.dedup.shared  # noqa: F401

    if job["kind"] == "model":
        import gfaas.dedup.ort
        import gfaas.models  # noqa: F401
    before = _private_bytes()
    got = _load_bytes(job) if job["kind"] == "bytes" else _load_model(job)
    print(json.dumps({"loaded": True}), flush=True)
    if sys.stdin.readline().strip() != "hint":
        return 0
    t0 = time.monotonic()
    hinted = got.hint() if got.hint is not None else 0
    t1 = time.monotonic()
    if got.view is not None:
        _touch(got.view)
    first_ms = 0.0
    if got.call is not None:
        t2 = time.perf_counter()
        got.call()
        first_ms = (time.perf_counter() - t2) * 1e3
    print(json.dumps({"pid": os.getpid(), "before_private": before, "load_s": got.load_s, "hint_s": t1 - t0,
                      "hint_t0": t0, "hint_t1": t1, "hinted_bytes": hinted, "first_call_ms": first_ms}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "exit":
            break
        if cmd[0] == "calls":
            times = []
            call = got.call
            if call is not None:
                for _ in range(int(cmd[1])):
                    t3 = time.perf_counter()
                    call()
                    times.append((time.perf_counter() - t3) * 1e3)
            print(json.dumps({"call_ms": times}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
