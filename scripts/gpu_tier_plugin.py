"""pytest plugin for ``scripts/gpu_env.py all``: each failure is printed the moment it happens.

pytest prints failures (and their reasons) only at the end of the run, so a run cut off by the GPU
machine's time limit used to say which tests failed but not why. With ``-p gpu_tier_plugin`` (with
scripts/ on ``PYTHONPATH``), every failed test, setup/teardown error and collection error prints at
once, flushed::

    gpu-tier: FAILED tests/gpu/test_x.py::test_y - AssertionError: assert 1 == 2
    gpu-tier:   <the last lines of the --tb traceback, indented>

``gpu_env.py all`` reads the ``gpu-tier: FAILED|ERROR <nodeid> - <reason>`` lines into its summary.
Standard library and pytest only.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

PREFIX = "gpu-tier:"
TB_LINES = 30  # the traceback's last lines printed with the failure (the full one comes at the end)

_config: pytest.Config | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _config
    _config = config


def reason(report: Any) -> str:
    """A one-line reason: the crash message's first line, else the report text's last line."""
    lr = report.longrepr
    msg = ""
    crash = getattr(lr, "reprcrash", None)
    if crash is not None and getattr(crash, "message", ""):
        msg = crash.message
    elif isinstance(lr, tuple) and len(lr) == 3:
        msg = str(lr[2])
    else:
        text = [ln for ln in str(report.longreprtext or lr or "").splitlines() if ln.strip()]
        msg = text[-1] if text else ""
        if msg.startswith("E "):  # a traceback's error line
            msg = msg[2:]
    first = " ".join((msg.strip().splitlines() or ["(no message)"])[0].split())
    return first[:300]


def _emit(kind: str, nodeid: str, report: Any, fresh_line: bool = False) -> None:
    lines = [f"{PREFIX} {kind} {nodeid} - {reason(report)}"]
    tb = [ln for ln in str(getattr(report, "longreprtext", "") or "").splitlines()]
    if len(tb) > TB_LINES:
        lines.append(f"{PREFIX}   ... ({len(tb) - TB_LINES} lines above: see the end of the run)")
        tb = tb[-TB_LINES:]
    lines += [f"{PREFIX}   {ln}" for ln in tb]
    tr = _config.pluginmanager.get_plugin("terminalreporter") if _config is not None else None
    if tr is not None:
        if fresh_line:  # "collecting ... " is not a line the reporter knows to end
            tr.write("\n")
        tr.ensure_newline()
        for ln in lines:
            tr.write_line(ln)
        flush = getattr(tr, "flush", None)
        if flush is not None:
            flush()
        else:  # older pytest
            tr._tw.flush()
    else:
        print("\n".join(lines), flush=True)
    sys.stdout.flush()


@pytest.hookimpl(trylast=True)  # after the terminal reporter's own "nodeid FAILED" word
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed:
        _emit("FAILED" if report.when == "call" else "ERROR", report.nodeid, report)


@pytest.hookimpl(trylast=True)
def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _emit("ERROR", report.nodeid or "(collection)", report, fresh_line=True)
