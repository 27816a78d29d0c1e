"""Handlers that print, log and misbehave, for the runtime's log tests (imported by worker processes)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from typing import Any

print("loading log_handlers")  # model-load time: no invocation's

log = logging.getLogger("userfn")


def chatty(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """One line on each path: print, sys.stderr, logging, fd 1 and 2 directly, and a child process."""
    x = ctx.get(inputs["x"])
    tag = int(x[0])
    print(f"print {tag}")
    sys.stderr.write(f"stderr {tag}\n")
    log.warning("record %d", tag)
    os.write(1, f"fd1 {tag}\n".encode())
    os.write(2, f"fd2 {tag}\n".encode())
    subprocess.run([sys.executable, "-c", f"print('child {tag}')"], check=True)
    print("no newline", end="")
    return {"y": x + 1}


def say(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    print("a tenant's secret: 42")
    return {"y": ctx.get(inputs["x"]) + 1}


def quiet(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    return {"y": ctx.get(inputs["x"]) + 1}


def flood(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """10 MB of output: 10,000 lines of 1 KB, then one 100 KB line, by fd and by print."""
    line = b"z" * 1023 + b"\n"
    for _ in range(5000):
        os.write(1, line)
    for _ in range(5000):
        print("p" * 1023)
    sys.stdout.write("L" * 100_000 + "\n")
    return {"y": ctx.get(inputs["x"]) + 1}


def fail_loudly(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    x = ctx.get(inputs["x"])
    print("about to fail")
    log.error("bad input %s", x.tolist())
    raise ValueError("this input is not good")


def forge(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """Print records that imitate another function's and invocation's, and tamper with the capture."""
    victim = str(ctx.params["victim"])
    fake = {"seq": 1, "time": 0.0, "workflow": "victim", "version": "", "function": "v", "invocation": victim,
            "stream": "log", "level": "ERROR", "text": "forged"}
    print(json.dumps(fake))
    os.write(2, (json.dumps(fake) + "\n").encode())
    log.error(json.dumps(fake))
    import gc

    from gfaas.runtime.logs import Capture

    gc.unfreeze()  # the worker froze its start-up heap (gcpause), which holds its Capture
    for obj in gc.get_objects():  # the worker's own capture: make its lines look like "not this task's"
        if isinstance(obj, Capture):
            obj._in_task = False
    gc.freeze()
    print("tampered")
    return {"y": ctx.get(inputs["x"]) + 1}


def read_file(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """Try to read another workflow's log file; 1: read it, 0: refused."""
    path = str(ctx.params["path"])
    try:
        with open(path, "rb") as f:
            f.read(1)
        got = 1
    except OSError:
        got = 0
    try:
        os.listdir(os.path.dirname(path))
        listed = 1
    except OSError:
        listed = 0
    # Every thread of the worker (the log reader's too) has dropped root and may gain no privileges.
    safe = 1
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
        if status["Uid"].split()[0] == "0" or status.get("NoNewPrivs", "0").strip() != "1":
            safe = 0
    threads = len(os.listdir("/proc/self/task"))
    return {"y": ctx.get(inputs["x"]) + 1, "read": got, "listed": listed, "safe": safe, "threads": threads}


# Terminal escapes a function may print: a window title (OSC 0), the clipboard (OSC 52), clear screen
# by the 8-bit CSI, a carriage return that overwrites the line, a right-to-left override.
ESCAPES = "ok\x1b]0;pwned\x07 \x1b]52;c;ZWNobyBoaQ==\x07 \x9b2J \rFAKE LINE \u202eevil\u202c"


def escapes(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    print(ESCAPES)
    log.warning("record %s", ESCAPES)
    return {"y": ctx.get(inputs["x"]) + 1}
