"""``Topology.nvlink_gbps`` is kept per pair and walks out-edges directly: the same answers as the
plain rule (a direct NVLink, else the first NVSwitch among the NVLink neighbours that reaches b)."""

import pytest

from gfaas.errors import ConfigError
from gfaas.topology import preset
from gfaas.topology.model import Topology


def _reference(t: Topology, a: str, b: str) -> float:
    if a == b:
        return 0.0
    e = t.edge(a, b)
    if e is not None and e.kind == "nvlink":
        return e.gbps
    for s in [x for x in t.neighbours(a, "nvlink") if t.device(x).kind == "nvswitch"]:
        back = t.edge(s, b)
        if back is not None:
            return min(t.edge(a, s).gbps, back.gbps)  # type: ignore[union-attr]
    return 0.0


@pytest.mark.parametrize("name", ["dgx-v100", "dgx-a100", "4xa10", "h100-x1", "h800x8", "dgx-a100*2"])
def test_nvlink_gbps_matches_the_rule(name: str) -> None:
    t = preset(name)
    names = [d.name for d in t.devices]
    for _ in range(2):  # computed, then kept
        for a in names:
            for b in names:
                assert t.nvlink_gbps(a, b) == _reference(t, a, b), (a, b)


def test_nvlink_gbps_unknown_device_still_raises() -> None:
    t = preset("dgx-a100")
    for _ in range(2):
        with pytest.raises(ConfigError):
            t.nvlink_gbps("nope", t.gpus[0])
