""":class:`NativeRouter`: :class:`~gfaas.policy.routing.Router` with its planning in Rust.

The route sets stay the reference's (maximum flows, identical nodes renamed, compiled per pair on
first use); each is handed to ``gfaas_native.RouterCore`` once, as candidates of integer edge indices
in the reference's rank order. ``plan``, ``plan_many``, ``release``, ``changed`` and ``active`` then run
natively and give the same plans as the reference, bit for bit
(``tests/unit/test_policy_routing_native.py``); this class maps transfer keys to the core's integer
handles and builds the ``Plan`` and ``Path`` objects. It exists only where ``gfaas_native`` is built
(``make setup``): :func:`native_router_available`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from ..errors import ConfigError
from ..native import native_class
from ..topology import Topology
from .paths import RouteSet
from .routing import Path, Plan, Router, RoutingOptions, _renaming, _twin_nodes, _twin_pair

_PATH_CACHE = 64  # Path objects kept per candidate, by rate, before that cache is cleared (as the reference)


_Core: Any = native_class("RouterCore")


def native_router_available() -> bool:
    """Whether ``gfaas_native`` (with the router) is built here."""
    return _Core is not None


class NativeRouter(Router):
    """The reference router's contract, planned natively (see the module docstring)."""

    def __init__(self, topology: Topology, options: RoutingOptions | None = None, *,
                 precompute: bool = True) -> None:
        if _Core is None:
            raise ConfigError("NativeRouter needs gfaas_native: run `make setup` (needs cargo) or "
                              "`pip install ./native`; the pure-Python Router gives the same plans")
        super().__init__(topology, options, precompute=precompute)
        self._core = _Core(list(self._cap), self._reroute, self._multipath)
        self._ncs: dict[tuple[str, str], int] = {}
        self._groups: dict[str, int] = {}  # a route group's name -> its id in the core
        self._group_names: list[str] = []  # and back
        self._spans: list[tuple[int, int, frozenset[int]]] = []  # set id -> (first candidate, count, groups)
        # Twin nodes (routing._twin_pair): (canon prefix, own prefix) -> names and edge ids, one to the other
        self._renamings: dict[tuple[str, str], tuple[Callable[[str], str], dict[str, str], int | None]] = {}
        self._node_edges: dict[str, tuple[list[str], list[tuple[int, str, str]]]] = {}  # canon prefix -> devices, edges
        self._hops: list[tuple[str, ...]] = []  # candidate id -> its route's hops
        self._paths: list[dict[float, Path]] = []  # candidate id -> its Path objects by rate
        self._handle: dict[Hashable, int] = {}
        self._who: dict[int, tuple[Hashable, str, str]] = {}
        self._next = 0

    # ---- public -------------------------------------------------------------------------------
    @property
    def active(self) -> Mapping[Hashable, Plan]:
        for n, picks in self._core.take_stale():
            self._store(n, picks)
        return MappingProxyType(self._plans)

    def residual(self, a: str, b: str) -> float:
        return float(self._core.residual(self._edge_index(a, b)))

    def plan(self, transfer: Hashable, src: str, dst: str) -> Plan:
        if transfer in self._handle:
            raise ConfigError(f"transfer {transfer!r} already has a plan; release it before planning it again")
        cs = self._ncs.get((src, dst))
        if cs is None:
            cs = self._native_cset(src, dst)
        n = self._next
        self._next = n + 1
        picks = self._core.plan(n, cs)
        self._handle[transfer] = n
        self._who[n] = (transfer, src, dst)
        plan = self._plans[transfer] = Plan(transfer, src, dst, self._built(picks))
        return plan

    def plan_many(self, requests: Sequence[tuple[Hashable, str, str]]) -> list[Plan]:
        ids = [t for t, _, _ in requests]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"plan_many got duplicate transfer ids {ids!r}; give each transfer its own id")
        sets = []
        for t, s, d in requests:  # validate all before reserving anything
            if t in self._handle:
                raise ConfigError(f"transfer {t!r} already has a plan; release it before planning it again")
            cs = self._ncs.get((s, d))
            sets.append(cs if cs is not None else self._native_cset(s, d))
        handles = list(range(self._next, self._next + len(requests)))
        self._next += len(requests)
        got = self._core.plan_many(list(zip(handles, sets, strict=True)))
        plans = []
        for n, (t, s, d), picks in zip(handles, requests, got, strict=True):
            self._handle[t] = n
            self._who[n] = (t, s, d)
            plans.append(self._store(n, picks))
        return plans

    def release(self, transfer: Hashable) -> None:
        n = self._handle.pop(transfer, None)
        if n is None:
            raise ConfigError(f"transfer {transfer!r} has no plan to release; plan it first (or it was released)")
        self._core.release(n)
        del self._who[n]
        del self._plans[transfer]

    def changed(self) -> list[Plan]:
        return [self._store(n, picks) for n, picks in self._core.take_changed()]

    # ---- internals ----------------------------------------------------------------------------
    def _store(self, n: int, picks: list[tuple[int, float]]) -> Plan:
        t, s, d = self._who[n]
        plan = self._plans[t] = Plan(t, s, d, self._built(picks))
        return plan

    def _built(self, picks: list[tuple[int, float]]) -> tuple[Path, ...]:
        out = []
        for c, g in picks:
            cache = self._paths[c]
            p = cache.get(g)
            if p is None:
                if len(cache) >= _PATH_CACHE:
                    cache.clear()
                p = cache[g] = Path(self._hops[c], g)
            out.append(p)
        return tuple(out)

    def _native_cset(self, src: str, dst: str) -> int:
        """The pair's route set in the core: for a same-node pair on a node that copies an earlier one
        (where the reference renames that node's set, ``_twin_route_set``), a copy of that node's
        compiled set with its edges and groups translated; otherwise compiled from its route set."""
        cs = None
        if (src, dst) not in self._pre:
            if self._twins is None:
                self._twins = _twin_nodes(self.topology)
            twin = _twin_pair(self.topology, src, dst, self._twins)
            if twin is not None:
                cs = self._copied_cset(*twin)
        if cs is None:
            cs = self._compiled_cset(self._route_set(src, dst))
        self._ncs[(src, dst)] = cs
        return cs

    def _compiled_cset(self, rs: RouteSet) -> int:
        """Compile a route set into the core, in the reference's rank order (``_CSet``)."""
        index = self._index
        seen: dict[tuple[str, ...], int] = {}
        cands: list[tuple[list[int], int, float, bool, float]] = []
        hops: list[tuple[str, ...]] = []
        groups: set[int] = set()

        def compile_(routes: Sequence[Any]) -> list[int]:
            out = []
            for r in routes:
                k = seen.get(r.hops)
                if k is None:
                    edges = [index[(a, b)] for a, b in zip(r.hops, r.hops[1:], strict=False)]
                    group = -1 if r.group is None else self._group(r.group)
                    groups.add(group)
                    k = seen[r.hops] = len(cands)
                    cands.append((edges, group, float(r.cap), bool(r.direct), float(r.share)))
                    hops.append(tuple(r.hops))
                out.append(k)
            return out

        direct, flow = compile_(rs.direct), compile_(rs.flow)
        tiers = [compile_(t) for t in rs.tiers]
        fallback = compile_(rs.fallback)
        load_tiers = [compile_(t) for t in rs.load_tiers]
        cs, base = self._core.add_cset(cands, direct, flow, tiers, fallback, rs.fair, rs.balance, rs.load, load_tiers,
                                       [index[e] for e in rs.stop_out], [index[e] for e in rs.stop_in])
        return self._added(cs, base, hops, groups - {-1})

    def _copied_cset(self, canon_pair: tuple[str, str], canon: str, own: str) -> int | None:
        """The core's copy of ``canon_pair``'s set for the node of prefix ``own``; None where the
        reference would not rename it (its pair is an error: compiling this pair raises it with these
        names) or the node's links do not map one to one."""
        try:
            cs = self._ncs.get(canon_pair)
            if cs is None:
                cs = self._native_cset(*canon_pair)
        except ConfigError:
            return None
        fwd, names, renaming = self._renaming(canon, own)
        if renaming is None:
            return None
        base, n, groups = self._spans[cs]
        gmap = {g: self._group(fwd(self._group_names[g])) for g in groups}
        new, first = self._core.copy_cset(cs, renaming, gmap)
        get = names.get  # get(h, h): a name of the copied node renamed, any other kept
        hops = [tuple(map(get, h, h)) for h in self._hops[base:base + n]]
        return self._added(new, first, hops, set(gmap.values()))

    def _renaming(self, canon: str, own: str) -> tuple[Callable[[str], str], dict[str, str], int | None]:
        """The reference's renaming from the node of prefix ``canon`` to the node of prefix ``own``
        (``routing._renaming``), the devices it renames, and the core's id of the map of edge ids
        (those touching that node; the others stay); None if an edge has no counterpart."""
        got = self._renamings.get((canon, own))
        if got is None:
            fwd = _renaming(canon, own)
            held = self._node_edges.get(canon)
            if held is None:  # once per copied node: its devices and the edges that touch them
                devices = [d.name for d in self.topology.devices if d.name.startswith(canon)]
                mine = set(devices)
                held = self._node_edges[canon] = (devices, [(i, a, b) for (a, b), i in self._index.items()
                                                            if a in mine or b in mine])
            names = {n: fwd(n) for n in held[0]}
            pairs = [(i, self._index.get((names.get(a, a), names.get(b, b)))) for i, a, b in held[1]]
            edges = {i: j for i, j in pairs if j is not None}
            core_id = self._core.add_renaming(edges) if len(edges) == len(pairs) else None
            got = self._renamings[(canon, own)] = (fwd, names, core_id)
        return got

    def _group(self, name: str) -> int:
        g = self._groups.get(name)
        if g is None:
            g = self._groups[name] = len(self._group_names)
            self._group_names.append(name)
        return g

    def _added(self, cs: int, base: int, hops: list[tuple[str, ...]], groups: set[int]) -> int:
        """Book a set the core added: its candidates' hops (for the plans' paths) and groups."""
        assert base == len(self._hops) and cs == len(self._spans), (base, len(self._hops), cs)
        self._hops += hops
        self._paths += [{} for _ in hops]
        self._spans.append((base, len(hops), frozenset(groups)))
        return int(cs)
