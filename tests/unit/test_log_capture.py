"""The worker's capture of fds 1 and 2 (runtime.logs.Capture), driven directly in a child process (it
redirects that process's own stdout and stderr). What a task gets must not depend on whether the
capture's reader thread or the task's own ``take`` read the pipe first: a take that finds the pipes
empty skips its work, and must still end a line the reader thread left unfinished."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = r"""
import json, os, sys, time
from gfaas.runtime.logs import Capture, MAX_LINE

cap = Capture()
cap.install()
out = {}

def lines(batch):
    return [[line.text, line.task] for line in batch]

os.write(1, b"before the first task\n")
time.sleep(0.05)
cap.begin()
os.write(1, b"half a line, read by the reader thread")
time.sleep(0.05)  # the reader thread has it, the pipe is empty again: take must still end it
out["reader_read_partial"] = lines(cap.take())

os.write(2, b"between tasks\n")
cap.begin()
os.write(1, b"in the task\n")
out["between_then_task"] = lines(cap.take())

cap.begin()
out["quiet_task"] = lines(cap.take())

cap.begin()
os.write(1, b"x" * (MAX_LINE + 10))  # a line cut at MAX_LINE, its rest dropped up to the newline...
time.sleep(0.05)
os.write(1, b"rest of the long line\nnext line\n")
out["cut_line"] = [[t[:20], len(t), task] for t, task in lines(cap.take())]

cap.begin()
cap.take()
cap.resume()  # a chain's next function: no drain, its lines are its own
os.write(1, b"the follower's line")
out["after_resume"] = lines(cap.take())
os.write(cap.console, (json.dumps(out) + "\n").encode())
"""


def _run() -> dict[str, list[list[object]]]:
    p = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stderr.strip().splitlines()[-1])  # the child's console is its original stderr


def test_a_task_gets_exactly_its_own_lines_whoever_read_the_pipe() -> None:
    out = _run()
    # the line before the first task is not the task's; the half line the reader thread read is
    # ended by the task's take, though the pipe was empty by then
    assert out["reader_read_partial"] == [["before the first task", False],
                                          ["half a line, read by the reader thread", True]]
    assert out["between_then_task"] == [["between tasks", False], ["in the task", True]]
    assert out["quiet_task"] == []
    from gfaas.runtime.logs import MAX_LINE

    cut = out["cut_line"]
    assert [c[2] for c in cut] == [True, True], cut
    assert cut[0][0] == "x" * 20 and cut[0][1] > MAX_LINE  # the head, with the marker
    assert cut[1][:2] == ["next line", len("next line")]  # the cut line's rest was dropped
    assert out["after_resume"] == [["the follower's line", True]]
