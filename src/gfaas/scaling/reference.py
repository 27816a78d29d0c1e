"""The oracle for served tokens: greedy decoding of every request by one process holding the whole
model (:class:`~gfaas.models.llm.LlamaModel`, weights drawn from the same seed).

Run as a child process (``python -m gfaas.scaling.reference``, JSON on stdin and stdout) so that it
starts with one BLAS thread, like the node processes, whatever the calling process imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict

from ..errors import ScalingError
from ..models.llm import LlamaConfig
from .workload import Request


def reference_tokens(cfg: LlamaConfig, seed: int, requests: Sequence[Request], timeout: float = 600.0
                     ) -> dict[int, list[int]]:
    """rid -> the tokens a one-process run generates for each request."""
    job = {"config": asdict(cfg), "seed": seed, "requests": [[r.rid, list(r.prompt), r.gen] for r in requests]}
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-m", "gfaas.scaling.reference"], input=json.dumps(job).encode(),
                         capture_output=True, timeout=timeout, env=env)
    if res.returncode:
        raise ScalingError(f"the reference run failed: {res.stderr.decode(errors='replace')[-2000:]}")
    return {int(k): v for k, v in json.loads(res.stdout).items()}


def main() -> int:
    from ..models.llm import LlamaModel

    job = json.load(sys.stdin)
    model = LlamaModel(LlamaConfig(**job["config"]), job["seed"])
    out = {rid: model.generate(prompt, gen) for rid, prompt, gen in job["requests"]}
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
