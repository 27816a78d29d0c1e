"""``Topology.replicate`` builds its copies without the constructors' checks: they must be the very
objects the constructors would build (fields, equality, hash, repr), and so must the topology."""

from gfaas.topology import preset
from gfaas.topology.model import Device, Edge, Link, Topology


def _checked(base: Topology, n: int) -> Topology:
    """What replicate built before: every copy through its constructor."""
    devices: list[Device] = []
    links: list[Link] = []
    for i in range(n):
        devices += [Device(f"n{i}.{d.name}", d.kind, i, d.model, d.memory_bytes) for d in base.devices]
        links += [Link(f"n{i}.{ln.a}", f"n{i}.{ln.b}", ln.kind, ln.gbps, ln.gbps_back, ln.bricks) for ln in base.links]
    fast = base.replicate(n)
    devices.append(Device("fabric", "fabric", 0))
    links += [ln for ln in fast.links[len(links):]]  # the fabric's links go through Link itself
    return Topology(fast.name, tuple(devices), tuple(links), base.pcie_p2p_gbps, base.pageable_gbps, fast.description)


def test_replicated_copies_are_constructed_ones() -> None:
    for name in ("dgx-a100", "dgx-v100", "h800x8"):
        base = preset(name)
        fast, slow = base.replicate(3), _checked(base, 3)
        assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
        for a, b in zip(fast.devices + fast.links, slow.devices + slow.links, strict=True):
            assert type(a) is type(b) and a == b and hash(a) == hash(b) and repr(a) == repr(b)
            assert vars(a) == vars(b) and list(vars(a)) == list(vars(b))
        fe = sorted(fast.edges(), key=lambda e: (e.src, e.dst))
        se = sorted(slow.edges(), key=lambda e: (e.src, e.dst))
        assert fe == se and [list(vars(e)) for e in fe] == [list(vars(e)) for e in se]
        for e in fe:
            ref = Edge(e.src, e.dst, e.kind, e.gbps, e.bricks)
            assert type(e) is Edge and e == ref and list(vars(e).items()) == list(vars(ref).items())
        for d in fast.devices:
            assert fast.out_edges(d.name) == slow.out_edges(d.name)
