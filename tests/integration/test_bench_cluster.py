"""``gfaas bench cluster`` from the command line: a lab without two worker machines is refused before
anything starts. The measurement itself runs on the multi-machine tests' lab (test_cluster_ray.py): a lab
of its own would cost another minute."""

from __future__ import annotations

import subprocess
import sys


def test_bench_cluster_refuses_a_lab_without_two_worker_machines() -> None:
    res = subprocess.run([sys.executable, "-m", "gfaas", "bench", "cluster", "--machines", "2"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "give 3" in res.stderr, res.stderr
