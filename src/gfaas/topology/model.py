"""The machine model: devices and the directed links between them.

A topology is a graph. Vertices are devices (``host`` memory, ``gpu``, ``pcie`` switch, ``nic``,
``nvswitch``, and the ``fabric`` joining the nodes of a cluster); every physical link becomes two
directed edges with their own capacity, because PCIe, NVLink and network links are full duplex and
the papers' contention happens per direction.

Capacities are in GB/s (10^9 bytes per second). Names are unique strings: ``gpu3`` on a single
machine, ``n1.gpu3`` in a cluster built by :meth:`Topology.replicate`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, TypeVar

from ..errors import ConfigError

DeviceKind = Literal["host", "gpu", "pcie", "nic", "nvswitch", "fabric"]
LinkKind = Literal["pcie", "nvlink", "nic", "net"]
DEVICE_KINDS: tuple[str, ...] = ("host", "gpu", "pcie", "nic", "nvswitch", "fabric")
LINK_KINDS: tuple[str, ...] = ("pcie", "nvlink", "nic", "net")

_T = TypeVar("_T")

#: Bytes per GB as the papers count bandwidth.
GB = 1e9


@dataclass(frozen=True)
class Device:
    """One vertex. ``memory_bytes`` is the GPU's memory (0 for other kinds)."""

    name: str
    kind: DeviceKind
    node: int = 0
    model: str = ""
    memory_bytes: int = 0

    def __post_init__(self) -> None:
        if not self.name or any(c.isspace() for c in self.name):
            raise ConfigError(f"device name {self.name!r} must be non-empty and contain no spaces")
        if self.kind not in DEVICE_KINDS:
            raise ConfigError(f"device {self.name!r} has kind {self.kind!r}; use one of {', '.join(DEVICE_KINDS)}")
        if self.memory_bytes < 0 or self.node < 0:
            raise ConfigError(f"device {self.name!r}: memory_bytes and node must be >= 0")


@dataclass(frozen=True)
class Link:
    """A full-duplex physical link; ``gbps`` per direction (``gbps_back`` if asymmetric).

    ``bricks`` counts NVLink bricks (the V100 hybrid cube mesh has pairs with one or two).
    """

    a: str
    b: str
    kind: LinkKind
    gbps: float
    gbps_back: float | None = None
    bricks: int = 0

    def __post_init__(self) -> None:
        if self.a == self.b:
            raise ConfigError(f"link {self.a}-{self.b} joins a device to itself; give two different devices")
        if self.kind not in LINK_KINDS:
            raise ConfigError(f"link {self.a}-{self.b} has kind {self.kind!r}; use one of {', '.join(LINK_KINDS)}")
        if self.bricks < 0:
            raise ConfigError(f"link {self.a}-{self.b} has {self.bricks} NVLink bricks; give a count >= 0")
        for v in (self.gbps, self.gbps_back if self.gbps_back is not None else self.gbps):
            if not 0 < v < float("inf"):
                raise ConfigError(f"link {self.a}-{self.b} has bandwidth {v} GB/s; it must be > 0")

    @property
    def reverse_gbps(self) -> float:
        return self.gbps if self.gbps_back is None else self.gbps_back


@dataclass(frozen=True)
class Edge:
    """One direction of a link: what flows and path planners reason about."""

    src: str
    dst: str
    kind: LinkKind
    gbps: float
    bricks: int = 0


@dataclass(frozen=True)
class Topology:
    """A validated, immutable machine or cluster.

    ``pcie_p2p_gbps`` is the rate of a GPU-to-GPU copy that has no NVLink and goes through the
    PCIe root complex (7.9 GB/s measured on p3.16xlarge, seed 000 §3.2); ``pageable_gbps`` is a
    host link's rate when the host buffer is not pinned (about 3 GB/s in seed 000 Fig. 5b).
    """

    name: str
    devices: tuple[Device, ...]
    links: tuple[Link, ...]
    pcie_p2p_gbps: float = 7.9
    pageable_gbps: float = 3.0
    description: str = ""
    _by_name: MappingProxyType[str, Device] = field(init=False, repr=False, compare=False)
    _out: MappingProxyType[str, tuple[Edge, ...]] = field(init=False, repr=False, compare=False)
    _edge: MappingProxyType[tuple[str, str], Edge] = field(init=False, repr=False, compare=False)
    # (kind, node) -> device names in declaration order, and (kind, None) for every node; node ->
    # edges with both ends on it. Lookups the simulator makes per request, so that they do not scan
    # a whole cluster.
    _kind: MappingProxyType[tuple[str, int | None], tuple[str, ...]] = field(init=False, repr=False,
                                                                           compare=False)
    _node_edges: MappingProxyType[int, tuple[Edge, ...]] = field(init=False, repr=False, compare=False)
    _hash: int = field(init=False, repr=False, compare=False)
    _nvlink: dict[tuple[str, str], float] = field(init=False, repr=False, compare=False)  # nvlink_gbps's

    def __post_init__(self) -> None:
        by_name: dict[str, Device] = {}
        for d in self.devices:
            if d.name in by_name:
                raise ConfigError(f"topology {self.name!r} names device {d.name!r} twice; names must be unique")
            by_name[d.name] = d
        out: dict[str, list[Edge]] = {n: [] for n in by_name}
        edges: dict[tuple[str, str], Edge] = {}
        for ln in self.links:
            for end in (ln.a, ln.b):
                if end not in by_name:
                    raise ConfigError(
                        f"topology {self.name!r}: link {ln.a}-{ln.b} names unknown device {end!r};"
                        " declare it under devices first"
                    )
            if (ln.a, ln.b) in edges:
                raise ConfigError(f"topology {self.name!r} has two links between {ln.a} and {ln.b}; merge them")
            for src, dst, gbps in ((ln.a, ln.b, ln.gbps), (ln.b, ln.a, ln.reverse_gbps)):
                e = _unchecked(Edge, src=src, dst=dst, kind=ln.kind, gbps=gbps, bricks=ln.bricks)  # Edge checks nothing
                edges[(src, dst)] = e
                out[src].append(e)
        if not (self.pcie_p2p_gbps > 0 and self.pageable_gbps > 0):
            raise ConfigError(f"topology {self.name!r}: pcie_p2p_gbps and pageable_gbps must be > 0")
        object.__setattr__(self, "_by_name", MappingProxyType(by_name))
        object.__setattr__(self, "_out", MappingProxyType({k: tuple(v) for k, v in out.items()}))
        object.__setattr__(self, "_edge", MappingProxyType(edges))
        kinds: dict[tuple[str, int | None], list[str]] = {}
        for d in self.devices:
            kinds.setdefault((d.kind, d.node), []).append(d.name)
            kinds.setdefault((d.kind, None), []).append(d.name)
        object.__setattr__(self, "_kind", MappingProxyType({k: tuple(v) for k, v in kinds.items()}))
        per_node: dict[int, list[Edge]] = {}
        for e in edges.values():
            a, b = by_name[e.src].node, by_name[e.dst].node
            if a == b:
                per_node.setdefault(a, []).append(e)
        object.__setattr__(self, "_node_edges", MappingProxyType({k: tuple(v) for k, v in per_node.items()}))
        object.__setattr__(self, "_nvlink", {})
        object.__setattr__(self, "_hash", hash((self.name, self.devices, self.links, self.pcie_p2p_gbps,
                                                self.pageable_gbps, self.description)))

    def __hash__(self) -> int:
        # Path planners cache per topology (functools.lru_cache); hashing every device and link on
        # each lookup made a 128-node Router take seconds. Same fields as the dataclass hash, once.
        return self._hash

    # ---- lookup ---------------------------------------------------------------------------------
    def device(self, name: str) -> Device:
        try:
            return self._by_name[name]
        except KeyError:
            raise ConfigError(
                f"topology {self.name!r} has no device {name!r}; it has {', '.join(sorted(self._by_name))}"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def edge(self, src: str, dst: str) -> Edge | None:
        """The directed edge src -> dst, or None if the two are not linked."""
        return self._edge.get((src, dst))

    def edges(self) -> Iterator[Edge]:
        return iter(self._edge.values())

    def out_edges(self, name: str) -> tuple[Edge, ...]:
        return self._out[self.device(name).name]

    def neighbours(self, name: str, kind: LinkKind | None = None) -> list[str]:
        return [e.dst for e in self.out_edges(name) if kind is None or e.kind == kind]

    def of_kind(self, kind: DeviceKind, node: int | None = None) -> list[str]:
        return list(self._kind.get((kind, node), ()))

    def node_edges(self, node: int) -> tuple[Edge, ...]:
        """The directed edges with both ends on ``node``, in :meth:`edges` order."""
        return self._node_edges.get(node, ())

    @property
    def gpus(self) -> list[str]:
        return self.of_kind("gpu")

    @property
    def nodes(self) -> list[int]:
        return sorted({d.node for d in self.devices})

    def host_of(self, node: int) -> str:
        hosts = self._kind.get(("host", node))
        if not hosts:
            raise ConfigError(f"topology {self.name!r} has no host device on node {node}")
        return hosts[0]

    def pcie_switch_of(self, gpu: str) -> str | None:
        """The PCIe switch a GPU (or NIC) hangs off, or None if it has no PCIe link."""
        for e in self.out_edges(gpu):
            if e.kind in ("pcie", "nic") and self.device(e.dst).kind == "pcie":
                return e.dst
        return None

    def nvlink_gbps(self, a: str, b: str) -> float:
        """Direct NVLink bandwidth a -> b (through an NVSwitch counts as direct); 0 if none or a == b."""
        got = self._nvlink.get((a, b))
        if got is None:  # kept per pair: placement asks for every pair of a node's GPUs per replica
            got = self._nvlink[(a, b)] = self._nvlink_gbps(a, b)
        return got

    def _nvlink_gbps(self, a: str, b: str) -> float:
        if a == b:
            return 0.0
        e = self._edge.get((a, b))
        if e is not None and e.kind == "nvlink":
            return e.gbps
        by_name = self._by_name
        for up in self.out_edges(a):  # through an NVSwitch: a's first one that reaches b
            if up.kind == "nvlink" and by_name[up.dst].kind == "nvswitch":
                back = self._edge.get((up.dst, b))
                if back is not None:
                    return min(up.gbps, back.gbps)
        return 0.0

    def nics_of(self, node: int) -> list[str]:
        return self.of_kind("nic", node)

    # ---- construction helpers -------------------------------------------------------------------
    def replicate(self, n: int, fabric_gbps: float | None = None) -> Topology:
        """``n`` copies of this single-node topology joined by a non-blocking network fabric.

        Device ``x`` of node ``i`` is renamed ``n<i>.x``; every NIC gets a ``net`` link to the
        fabric at its own rate (or ``fabric_gbps``).
        """
        if n < 1:
            raise ConfigError(f"cannot replicate a topology {n} times; give n >= 1")
        if fabric_gbps is not None and not fabric_gbps > 0:
            raise ConfigError(f"fabric bandwidth {fabric_gbps} GB/s must be > 0 (or None for each NIC's own rate)")
        if len(self.nodes) != 1:
            raise ConfigError(f"topology {self.name!r} already spans {len(self.nodes)} nodes; replicate a single node")
        if n == 1:
            return self
        nic_rate = {ln.b: ln.gbps for ln in self.links if ln.kind == "nic"}
        nic_rate.update({ln.a: ln.gbps for ln in self.links if ln.kind == "nic"})
        devices: list[Device] = []
        links: list[Link] = []
        # Each copy is valid because its original is (a prefix adds no space and keeps a link's two
        # ends apart), so copies skip the constructors' checks: at 128 nodes they were most of the work.
        for i in range(n):
            p = f"n{i}."
            devices += [_unchecked(Device, name=p + d.name, kind=d.kind, node=i, model=d.model,
                                   memory_bytes=d.memory_bytes) for d in self.devices]
            links += [_unchecked(Link, a=p + ln.a, b=p + ln.b, kind=ln.kind, gbps=ln.gbps, gbps_back=ln.gbps_back,
                                 bricks=ln.bricks) for ln in self.links]
        devices.append(Device("fabric", "fabric", 0))
        for i in range(n):
            for nic in self.of_kind("nic"):
                links.append(Link(f"n{i}.{nic}", "fabric", "net",
                                  fabric_gbps if fabric_gbps is not None else nic_rate.get(nic, 12.5)))
        return Topology(f"{self.name}x{n}", tuple(devices), tuple(links), self.pcie_p2p_gbps,
                        self.pageable_gbps, f"{n} x {self.name}: {self.description}".strip())

    def summary(self) -> dict[str, object]:
        """A JSON-ready overview (what ``gfaas topo show`` prints)."""
        gpus = self.gpus
        return {
            "name": self.name,
            "description": self.description,
            "nodes": len(self.nodes),
            "gpus": [{"name": g, "model": self.device(g).model, "memory_bytes": self.device(g).memory_bytes,
                      "pcie_switch": self.pcie_switch_of(g), "node": self.device(g).node} for g in gpus],
            "nvlink_gbps": {a: {b: self.nvlink_gbps(a, b) for b in gpus if b != a and
                                self.device(b).node == self.device(a).node} for a in gpus},
            "links": [{"a": ln.a, "b": ln.b, "kind": ln.kind, "gbps": ln.gbps, "gbps_back": ln.reverse_gbps,
                       "bricks": ln.bricks} for ln in self.links],
            "pcie_p2p_gbps": self.pcie_p2p_gbps,
            "pageable_gbps": self.pageable_gbps,
            "unit": "GB/s",
        }


def _unchecked(cls: type[_T], **fields: object) -> _T:
    """``cls(**fields)`` for a frozen dataclass whose ``__post_init__`` is known to pass (or which has
    none), without calling it: the same object (fields in declaration order, as ``__init__`` sets them)
    for a fraction of the cost."""
    obj = object.__new__(cls)
    obj.__dict__.update(fields)
    return obj


def build(name: str, devices: Iterable[Device], links: Iterable[Link], **kw: object) -> Topology:
    """Construct and validate a topology (a convenience for presets and loaders)."""
    return Topology(name, tuple(devices), tuple(links), **kw)  # type: ignore[arg-type]
