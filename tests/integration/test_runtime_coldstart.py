"""Cold starts are counted and reported (issue 22, item 2's reporting): a call that had to wait for its
worker to start carries ``cold_start_s`` (part of its queue time) in its record, the invocation's
breakdown sums them, and the result document round-trips them; warm calls carry none."""

from __future__ import annotations

import numpy as np
import pytest
from test_runtime_local import SEQ  # pytest puts this directory on sys.path

from gfaas.runtime.local import LocalRuntime, RuntimeConfig
from gfaas.runtime.wire import result_document, result_from_document

pytestmark = pytest.mark.usefixtures("rt_handlers")


def test_the_first_call_after_deploy_without_prewarm_is_a_cold_start() -> None:
    with LocalRuntime(RuntimeConfig(prewarm=False, queue_hints=False)) as rt:
        rt.deploy(SEQ)
        cold = rt.invoke("seq", {"x": np.ones(3)}, timeout=60)
        warm = rt.invoke("seq", {"x": np.ones(3)}, timeout=60)
        pools = {k: p.cold_starts for k, p in rt.deployments.pools.items()}
    assert cold.ok and warm.ok
    for r in cold.functions:  # each function's worker started for this call: part of its wait
        assert 0 < r.cold_start_s <= r.queued_s, r
    assert cold.breakdown.cold_start_s == pytest.approx(sum(r.cold_start_s for r in cold.functions))
    assert cold.breakdown.as_dict()["cold_start_s"] == cold.breakdown.cold_start_s
    assert all(r.cold_start_s == 0.0 for r in warm.functions) and "cold_start_s" not in warm.breakdown.as_dict()
    assert pools == {"seq/a": 1, "seq/b": 1}
    back = result_from_document(result_document(cold))  # what the gateway sends and GatewayClient reads
    assert [r.cold_start_s for r in back.functions] == [r.cold_start_s for r in cold.functions]
    assert back.breakdown.cold_start_s == cold.breakdown.cold_start_s


def test_prewarmed_workers_are_not_cold_starts() -> None:
    with LocalRuntime(RuntimeConfig(queue_hints=False)) as rt:
        rt.deploy(SEQ)
        res = rt.invoke("seq", {"x": np.ones(3)}, timeout=60)
        assert res.ok and res.breakdown.cold_start_s == 0.0
        assert {p.cold_starts for p in rt.deployments.pools.values()} == {0}
