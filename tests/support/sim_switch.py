"""What the simulator prints with one of its native switches set one way (``GFAAS_SIM_DATAPLANE``,
``GFAAS_SIM_DAG``, ...): the tests that hold a native part to its reference run whole experiments
each way, each in a process of its own (a switch is read once, at import)."""

from __future__ import annotations

import os
import subprocess
import sys


def printed_with(var: str, value: str, experiments: str) -> str:
    """The JSON that ``gfaas sim run EXPERIMENTS --quick --json`` prints with ``var=value``, under the
    default (native where built) core."""
    code = ("import sys; from gfaas.cli import main; "
            f"sys.exit(main(['sim', 'run', {experiments!r}, '--quick', '--json']))")
    env = dict(os.environ, **{var: value})
    env.pop("GFAAS_SIM_CORE", None)
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout
