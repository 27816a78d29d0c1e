"""What a refusal costs the gateway, answered by the server's protocol or through the guard, one run.

Part of ``gfaas bench overload`` (``refusal_cost`` in its document). A gateway in this process serves
the overload workflow with its admission limit held full (one place, taken; nobody may wait), so
every invocation request is refused with 429; the load generator, a process of its own, sends them
from ``connections`` keep-alive connections that retry at once (``hold_refused`` off, so nothing
holds them). Each mode runs ``pairs`` times, interleaved: ``early`` (the default: the server's
httptools protocol answers as the headers arrive, ``GatewayLimits.early_refusals``) and ``guard`` (the
same answer made by the guard behind uvicorn's ASGI cycle). What counts is this process's CPU per
refusal, the gateway's event loop being all that runs here then (the runtime's threads sleep).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from .loadgen import LoadSpec
from .overload_handlers import SPEC, WORKFLOW

MODES = ("early", "guard")


def refusal_cost(connections: int = 64, duration_s: float = 3.0, pairs: int = 2,
                 run_loadgen: Any = None) -> dict[str, Any]:
    """``{mode: {"cpu_us_per_refusal", "refusals_per_s", "runs"}, "ratio_guard_to_early", ...}``;
    ``run_loadgen(spec)`` runs one row of load in another process (``overload._run_loadgen``)."""
    from ..runtime.gateway import serve
    from ..runtime.gateway.admission import Admissions
    from ..runtime.gateway.limits import GatewayLimits
    from ..runtime.local import LocalRuntime, RuntimeConfig

    runs: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
    with LocalRuntime(RuntimeConfig(workers_per_function=1)) as rt:
        rt.deploy(SPEC)
        for _ in range(pairs):
            for mode in MODES:
                limits = GatewayLimits(hold_refused=False, early_refusals=mode == "early")
                with serve(rt, authenticate=False, limits=limits, access_log=False, sweep_interval_s=3600) as gw:
                    adm = Admissions(rt.workflows, initial=1, min_limit=1, max_limit=1, max_waiting=0)
                    gw.app.state.gateway.admissions = adm
                    gate = adm._gate(WORKFLOW)  # the one place, taken for the run: every request is refused
                    assert gate is not None and gate.lim.admit(time.monotonic()).ok
                    spec = LoadSpec(f"{gw.url}/v1/workflows/{WORKFLOW}/invocations?timeout=30", "{\"seed\": 1}",
                                    connections, duration_s, drain_s=10, request_timeout_s=10,
                                    retry_after_cap_s=0.0, retry_jitter=0.0)
                    c0 = time.process_time()
                    row = run_loadgen(spec)
                    cpu_s = time.process_time() - c0
                refused = row["rejected_by_status"].get("429", 0)
                if refused == 0 or row["ok"] or row["failed"]:
                    raise RuntimeError(f"the refusal run ({mode}) answered {row['ok']} ok, {refused} refused, "
                                       f"{row['failed']} failed: every request should have been refused")
                runs[mode].append((cpu_s / refused * 1e6, refused / row["wall_s"]))
    out: dict[str, Any] = {"connections": connections, "duration_s": duration_s, "pairs": pairs}
    for mode in MODES:
        cpu = [c for c, _ in runs[mode]]
        out[mode] = {"cpu_us_per_refusal": round(float(np.median(cpu)), 1),
                     "refusals_per_s": round(float(np.median([r for _, r in runs[mode]])), 1),
                     "runs": [{"cpu_us_per_refusal": round(c, 1), "refusals_per_s": round(r, 1)} for c, r in runs[mode]]}
    out["ratio_guard_to_early"] = round(out["guard"]["cpu_us_per_refusal"] / out["early"]["cpu_us_per_refusal"], 2)
    return out
