"""Child processes that end with their owner, however the owner ends (SIGKILL included).

The owner makes a pipe and keeps its only write end (close-on-exec, so no other child inherits it);
the child gets the read end. The kernel closes the write end when the owner dies, and the child's read
then returns end-of-file: :func:`watch` turns that into a call (the node daemon stops itself). A native
program cannot watch a pipe, so ``python -m gfaas.lifeline FD -- CMD ...`` supervises it: it runs CMD
as its child, kills it when the pipe closes, and exits with CMD's status (start it in a session of its
own and stop both with ``killpg``).

Why a pipe and not ``PR_SET_PDEATHSIG``: that signal follows the *thread* that forked, and the runtime
starts helpers from short-lived threads (a gateway request's), which would kill them at once.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable

from .pyexec import module_argv

log = logging.getLogger("gfaas.lifeline")


def pipe() -> tuple[int, int]:
    """A new lifeline: ``(read_end, write_end)``, both close-on-exec (pass the read end explicitly)."""
    return os.pipe2(os.O_CLOEXEC)


def watch(fd: int, on_close: Callable[[], None], what: str = "this process") -> threading.Thread:
    """Call ``on_close`` once the lifeline ``fd`` reports end-of-file (its owner is gone)."""
    def run() -> None:
        try:
            while os.read(fd, 64):
                pass
        except OSError:
            pass
        log.warning("the process that started %s is gone (its lifeline closed): stopping", what)
        on_close()

    t = threading.Thread(target=run, name="gfaas-lifeline", daemon=True)
    t.start()
    return t


def command(fd: int, cmd: list[str]) -> list[str]:
    """``cmd`` run under a supervisor that kills it when the lifeline ``fd`` closes."""
    return module_argv("gfaas.lifeline", str(fd), "--", *cmd)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or not argv[0].isdigit() or argv[1] != "--":
        print("usage: python -m gfaas.lifeline FD -- CMD [ARG ...]", file=sys.stderr)
        return 2
    child = subprocess.Popen(argv[2:])
    done = threading.Event()

    def kill() -> None:
        if not done.is_set():
            child.kill()

    watch(int(argv[0]), kill, what=os.path.basename(argv[2]))
    code = child.wait()
    done.set()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
