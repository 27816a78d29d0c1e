"""Contention-aware multi-path routing of transfers (seed 000 §6.2, seed 001 §3.2 and §4.3).

One planner serves every system the project compares: baselines and ablations are
:class:`RoutingOptions`, not separate code. The :class:`Router` keeps a live residual-bandwidth
figure for every directed edge of the topology and, for each transfer, reserves a set of paths
whose rates never add up to more than an edge's capacity. The executor (the simulator, later the
real runtime) moves a transfer's bytes over its plan's paths in proportion to their rates
(:meth:`Plan.split`) and applies the re-routings that :meth:`Router.changed` reports.

Planning one transfer (``plan``), in order:

1. **Direct path first.** The transfer's own link (NVLink between the two GPUs, the GPU's PCIe
   path to the host, the NIC on the GPU's switch) is taken first. With ``reroute_direct``, any other
   transfer that uses one of its edges as a *harvested* (indirect) hop gives that path up first and
   re-plans over what is still free afterwards (seed 001 §4.3.3: direct paths have priority).
2. **Free paths**, tier by tier (NVLink: fewer GPU hops first; host and NIC harvesting: route GPUs
   after the direct path), inside a tier widest live bottleneck first, ties by static rank. A path
   gets its narrowest residual edge (capped, for PCIe peer-to-peer, at the measured P2P rate), and
   that rate is subtracted from every edge on it. GPU-to-GPU search stops as soon as the source's
   NVLink out-bandwidth or the destination's in-bandwidth is used up (Algorithm 1, lines 1-7).
3. **Busy-path balancing** (GPU to GPU, ``balance_busy``; Algorithm 1, lines 8-14): see
   :meth:`Router._balance` for the exact rule.
4. **Fallback**: a GPU pair that got nothing over NVLink goes peer-to-peer over PCIe.

Topology-oblivious harvesting (``topology_aware=False``) reserves its whole peer set at once,
shared max-min fairly, which is how concurrent copies of DeepPlan+ would share the links.

Bandwidth freed by ``release`` is not pushed back to running transfers; later plans pick it up.
Everything here is pure bookkeeping: no clock, no I/O, no randomness.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType

from ..errors import ConfigError
from ..topology import Topology
from .paths import Route, RouteKind, RouteSet, node_route_sets, route_set
from .routing_options import RoutingOptions as RoutingOptions

MiB = 1 << 20
#: Residual at or below this (GB/s) counts as none: a path never gets a zero-rate reservation.
EPS = 1e-9
#: Path objects cached per candidate route, by rate, before the cache is cleared.
_PATH_CACHE = 64


@dataclass(frozen=True)
class Path:
    """One route of a plan. ``hops`` include both endpoints; ``gbps`` is the rate reserved on it."""

    hops: tuple[str, ...]
    gbps: float

    @property
    def edges(self) -> tuple[tuple[str, str], ...]:
        """The directed edges crossed, as consecutive ``(a, b)`` pairs."""
        h = self.hops
        return tuple(zip(h, h[1:], strict=False))


@dataclass(frozen=True)
class Plan:
    """The paths reserved for one transfer.

    ``paths == ()`` means nothing is moved over links: either ``src == dst`` (zero-copy: the data
    is already where it is wanted) or, for two different devices, every usable path is reserved
    by other transfers right now (the executor then decides how to proceed, e.g. share the
    direct link without a reservation).
    """

    transfer: Hashable
    src: str
    dst: str
    paths: tuple[Path, ...]

    @property
    def total_gbps(self) -> float:
        return sum(p.gbps for p in self.paths)

    def split(self, nbytes: int, chunk_bytes: int = 2 * MiB) -> list[int]:
        """Bytes per path, proportional to path rates, in whole chunks (the last one may be short).

        Paths of different width must finish together, so a 48 GB/s path gets twice the data of
        a 24 GB/s one (seed 001 §4.3.3). Data moves in chunks, so each path gets a whole number of
        ``chunk_bytes`` chunks, shared by largest remainder (ties to the earlier path); the one
        short chunk is taken off the path with the most chunks. The result sums to ``nbytes``
        exactly; a plan without paths returns ``[]``.
        """
        if nbytes < 0 or chunk_bytes <= 0:
            raise ConfigError(f"split({nbytes}, {chunk_bytes}): nbytes must be >= 0 and chunk_bytes > 0")
        if not self.paths:
            return []
        if len(self.paths) == 1:  # what the rule below gives one path, without its float work
            return [nbytes]
        chunks = -(-nbytes // chunk_bytes)
        total = self.total_gbps
        quota = [chunks * p.gbps / total for p in self.paths]
        counts = [int(q) for q in quota]
        while sum(counts) > chunks:  # only if float rounding pushed a quota over an integer
            i = max(range(len(counts)), key=lambda i: (counts[i] - quota[i], -i))
            counts[i] -= 1
        spare = chunks - sum(counts)
        order = sorted(range(len(quota)), key=lambda i: (-(quota[i] - counts[i]), i))
        for i in order[:spare]:
            counts[i] += 1
        out = [c * chunk_bytes for c in counts]
        if chunks:
            biggest = max(range(len(out)), key=lambda i: (out[i], -i))
            out[biggest] -= chunks * chunk_bytes - nbytes
        return out


def _mask(edges: Sequence[int]) -> int:
    m = 0
    for e in edges:
        m |= 1 << e
    return m


class _Cand:
    """A route as the router evaluates it: integer edge indices into the residual list."""

    __slots__ = ("cap", "detour", "direct", "edges", "edgeset", "get", "group", "hops", "mask", "paths", "rank",
                 "share")

    def __init__(self, route: Route, edges: tuple[int, ...], rank: int) -> None:
        self.hops = route.hops
        self.edges = edges
        self.edgeset = frozenset(edges)
        self.mask = _mask(edges)
        # min(c.get(res)) is the bottleneck; itemgetter is the fastest gather in CPython.
        self.get = operator.itemgetter(*edges) if len(edges) > 1 else operator.itemgetter(edges[0], edges[0])
        self.group = route.group
        self.cap = route.cap
        self.direct = route.direct
        #: Rate in the idle maximum flow (the first pass of a plan takes at most this).
        self.share = route.share if route.share < route.cap else route.cap
        self.rank = rank
        self.paths: dict[float, Path] = {}
        #: An idle-flow path that the pair would not take under load: it yields to newcomers.
        self.detour = False

    def path(self, gbps: float) -> Path:
        # Rates repeat (24, 48, 12 GB/s ...): reuse the immutable Path instead of building one per plan.
        p = self.paths.get(gbps)
        if p is None:
            if len(self.paths) >= _PATH_CACHE:
                self.paths.clear()
            p = self.paths[gbps] = Path(self.hops, gbps)
        return p


class _CSet:
    """A :class:`RouteSet` compiled to candidates (one candidate per distinct route)."""

    __slots__ = ("allmask", "balance", "busy", "direct", "fair", "fallback", "flow", "grouped", "idle", "kind",
                 "load", "load_busy", "load_grouped", "load_mask", "load_tiers", "stop_in", "stop_out", "tiers")

    def __init__(self, rs: RouteSet, index: Mapping[tuple[str, str], int]) -> None:
        rank = 0
        seen: dict[tuple[str, ...], _Cand] = {}

        def compile_(routes: Sequence[Route]) -> tuple[_Cand, ...]:
            # A flow path listed again in a later tier is the same candidate (one entry per plan).
            nonlocal rank
            out = []
            for r in routes:
                c = seen.get(r.hops)
                if c is None:
                    edges = tuple(index[(a, b)] for a, b in zip(r.hops, r.hops[1:], strict=False))
                    c = seen[r.hops] = _Cand(r, edges, rank)
                    rank += 1
                out.append(c)
            return tuple(out)

        self.kind: RouteKind = rs.kind
        self.direct = compile_(rs.direct)
        self.flow = compile_(rs.flow)
        self.tiers = tuple(compile_(t) for t in rs.tiers)
        #: Per tier: whether its routes carry groups (then at most one route per group is used).
        self.grouped = tuple(any(c.group is not None for c in t) for t in self.tiers)
        self.fallback = compile_(rs.fallback)
        self.fair = rs.fair
        self.balance = rs.balance
        self.busy: tuple[_Cand, ...] = tuple(dict.fromkeys(self.direct + self.flow
                                                           + tuple(c for t in self.tiers for c in t)))
        #: Once other transfers hold links: these tiers replace ``flow`` and ``tiers``.
        self.load = rs.load
        self.load_tiers = tuple(compile_(t) for t in rs.load_tiers)
        self.load_grouped = tuple(any(c.group is not None for c in t) for t in self.load_tiers)
        self.load_busy: tuple[_Cand, ...] = (
            tuple(dict.fromkeys(self.direct + tuple(c for t in self.load_tiers for c in t))) if rs.load else self.busy)
        #: Edges of the routes this pair takes under load (its direct path included).
        self.load_mask = 0
        if rs.load:
            for c in self.load_busy:
                self.load_mask |= c.mask
            keep = set(self.load_busy)
            for c in self.flow:
                c.detour = c not in keep
        self.stop_out = _mask([index[e] for e in rs.stop_out])
        self.stop_in = _mask([index[e] for e in rs.stop_in])
        #: Every edge a plan of this pair reads: while nobody holds any of them, the plan is the
        #: one computed on the idle machine, replayed from ``idle`` (recorded the first time).
        self.allmask = self.stop_out | self.stop_in
        for c in seen.values():
            self.allmask |= c.mask
        self.idle: _Idle | None = None


class _Idle:
    """A pair's plan on an idle machine, recorded once and replayed while its edges stay unused:
    the residuals and saturated edges it leaves, holdings per edge, rates per candidate, paths."""

    __slots__ = ("cnt", "held", "paths", "res", "sat", "used")

    def __init__(self, router: Router, h: _Held) -> None:
        res = router._res
        edges = sorted({e for c in h.res for e in c.edges})
        self.res = tuple((e, res[e]) for e in edges)
        self.sat = router._sat & h.cs.allmask
        self.used = _mask(edges)
        self.cnt = tuple((e, sum(e in c.edgeset for c in h.res), sum(e in c.edgeset and not c.direct for c in h.res))
                         for e in edges)
        self.held = tuple(h.res.items())
        self.paths = router._plans[h.transfer].paths


class _Held:
    """One active transfer: its candidate set and the rate reserved on each candidate it uses."""

    __slots__ = ("cs", "dst", "res", "src", "transfer")

    def __init__(self, transfer: Hashable, src: str, dst: str, cs: _CSet) -> None:
        self.transfer = transfer
        self.src = src
        self.dst = dst
        self.cs = cs
        self.res: dict[_Cand, float] = {}

    @property
    def total(self) -> float:
        return sum(self.res.values())


class Router:
    """Plans and reserves paths for transfers on one topology (see the module docstring).

    Internals are laid out for decision time (seed 001 §4.3.3 quotes under 10 us): candidate
    routes are compiled once per (source, destination) pair into tuples of integer edge indices,
    residuals live in one flat list, a bitmask marks the saturated edges (so a busy route is
    rejected with one AND), and each edge counts its holders so that its residual is reset to the
    exact capacity when the last one leaves (no float drift across releases).
    """

    def __init__(self, topology: Topology, options: RoutingOptions | None = None, *,
                 precompute: bool = True) -> None:
        self.topology = topology
        self.options = options if options is not None else RoutingOptions()
        edges = sorted(topology.edges(), key=lambda e: (e.src, e.dst))
        self._index: dict[tuple[str, str], int] = {(e.src, e.dst): i for i, e in enumerate(edges)}
        self._cap: list[float] = [e.gbps for e in edges]
        self._res: list[float] = list(self._cap)
        self._sat = 0  # bit e set <=> residual of edge e is (at most EPS above) zero
        self._used = 0  # bit e set <=> some plan holds edge e
        self._cnt: list[int] = [0] * len(edges)  # holdings per edge
        self._icnt: list[int] = [0] * len(edges)  # indirect (non-direct) holdings per edge
        self._sets: dict[tuple[str, str], _CSet] = {}
        self._held: dict[Hashable, _Held] = {}
        self._plans: dict[Hashable, Plan] = {}
        self._changed: dict[Hashable, None] = {}
        self._stale: dict[Hashable, _Held] = {}  # altered plans not yet rebuilt (built on demand)
        self._reroute = self.options.reroute_direct
        self._multipath = self.options.multipath
        # Route sets (maximum flows included) of every same-node pair, computed once per topology
        # and options and shared by every Router on them; compiled to candidates on first use.
        # precompute=False (the simulator on a cluster): compile each pair's route set when it is
        # first planned instead, the same set, so that building a Router on a 128-node cluster
        # does not solve a maximum flow for every pair of every node up front.
        self._pre = node_route_sets(topology, self.options) if precompute else {}
        # Identical nodes share route sets (see _twin_route_set); per Router, not in a global
        # cache, because looking up an equal but distinct Topology compares all of it.
        self._twins: Mapping[int, tuple[str, str]] | None = None
        self._canon: dict[tuple[str, str], RouteSet] = {}

    # ---- public -------------------------------------------------------------------------------
    @property
    def active(self) -> Mapping[Hashable, Plan]:
        """The current plan of every transfer not yet released (a view, current until the next call)."""
        self._flush()
        return MappingProxyType(self._plans)

    def residual(self, a: str, b: str) -> float:
        """Live residual GB/s on the directed edge a -> b."""
        return self._res[self._edge_index(a, b)]

    def capacity(self, a: str, b: str) -> float:
        """Capacity GB/s of the directed edge a -> b (the residual when nothing holds it)."""
        return self._cap[self._edge_index(a, b)]

    def plan(self, transfer: Hashable, src: str, dst: str) -> Plan:
        """Plan ``transfer`` from device ``src`` to ``dst`` and reserve its bandwidth."""
        h = self._register(transfer, src, dst)
        cs = h.cs
        if cs.allmask & self._used:
            victims = self._yield_detours(h) if cs.load and self._reroute else []
            self._phase_direct(h)
            self._phase_rest(h)
            for v in victims:  # after the newcomer: what it left, over the victim's short routes
                self._fill(v)
                self._mark(v)
            return self._publish(h)
        # Nobody holds an edge this plan could read: the idle plan, computed once, then replayed.
        idle = cs.idle
        if idle is None:
            self._phase_direct(h)
            self._phase_rest(h)
            plan = self._publish(h)
            cs.idle = _Idle(self, h)
            return plan
        res, cnt, icnt = self._res, self._cnt, self._icnt
        for e, r in idle.res:
            res[e] = r
        for e, n, ni in idle.cnt:
            cnt[e] += n
            icnt[e] += ni
        self._sat |= idle.sat
        self._used |= idle.used
        h.res = dict(idle.held)
        plan = self._plans[transfer] = Plan(transfer, src, dst, idle.paths)
        return plan

    def plan_many(self, requests: Sequence[tuple[Hashable, str, str]]) -> list[Plan]:
        """Plan the transfers of one workflow together (seed 001 §4.3.3), returned in input order.

        Every transfer first gets its direct path; then the rest is searched transfer by transfer,
        starting with the one that has the least bandwidth so far (weakly connected pairs first:
        they depend most on indirect paths), ties in input order. Transfers of the batch are not
        reported by :meth:`changed`; the returned plans are final.
        """
        ids = [t for t, _, _ in requests]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"plan_many got duplicate transfer ids {ids!r}; give each transfer its own id")
        for t, s, d in requests:  # validate all before reserving anything
            if t in self._held:
                raise ConfigError(f"transfer {t!r} already has a plan; release it before planning it again")
            self._cset(s, d)
        held = [self._register(t, s, d) for t, s, d in requests]
        for h in held:
            self._phase_direct(h)
        for i in sorted(range(len(held)), key=lambda i: (held[i].total, i)):
            self._phase_rest(held[i])
        plans = [self._publish(h) for h in held]
        for t in ids:
            self._changed.pop(t, None)
            self._stale.pop(t, None)
        return plans

    def release(self, transfer: Hashable) -> None:
        """Return every reservation of ``transfer``."""
        h = self._held.pop(transfer, None)
        if h is None:
            raise ConfigError(f"transfer {transfer!r} has no plan to release; plan it first (or it was released)")
        res, cap, cnt, icnt = self._res, self._cap, self._cnt, self._icnt
        freed = 0
        unused = 0
        for c, g in h.res.items():
            direct = c.direct
            freed |= c.mask
            for e in c.edges:
                n = cnt[e] - 1
                cnt[e] = n
                if not direct:
                    icnt[e] -= 1
                if n == 0:
                    res[e] = cap[e]  # no holder left: exact, whatever float drift came before
                    unused |= 1 << e
                else:
                    r = res[e] + g
                    res[e] = r if r < cap[e] else cap[e]
        # Every reservation is above EPS, so each edge it crossed has residual again.
        self._sat &= ~freed
        self._used &= ~unused
        del self._plans[transfer]
        self._changed.pop(transfer, None)
        self._stale.pop(transfer, None)

    def changed(self) -> list[Plan]:
        """Plans of other active transfers altered (re-routed, balanced) since the last call."""
        self._flush()
        out = [self._plans[t] for t in self._changed]
        self._changed.clear()
        return out

    # ---- bookkeeping --------------------------------------------------------------------------
    def _edge_index(self, a: str, b: str) -> int:
        i = self._index.get((a, b))
        if i is None:
            raise ConfigError(f"{a}->{b} is not a link of {self.topology.name!r}; name two linked devices")
        return i

    def _cset(self, src: str, dst: str) -> _CSet:
        cs = self._sets.get((src, dst))
        if cs is None:
            cs = self._sets[(src, dst)] = _CSet(self._route_set(src, dst), self._index)
        return cs

    def _route_set(self, src: str, dst: str) -> RouteSet:
        """The pair's route set: precomputed, renamed from an identical node's, or computed now."""
        rs = self._pre.get((src, dst))
        if rs is None:
            if self._twins is None:
                self._twins = _twin_nodes(self.topology)
            rs = _twin_route_set(self.topology, src, dst, self.options, self._twins, self._canon)
        if rs is None:
            rs = route_set(self.topology, src, dst, self.options)
        return rs

    def _register(self, transfer: Hashable, src: str, dst: str) -> _Held:
        if transfer in self._held:
            raise ConfigError(f"transfer {transfer!r} already has a plan; release it before planning it again")
        cs = self._sets.get((src, dst)) or self._cset(src, dst)
        h = self._held[transfer] = _Held(transfer, src, dst, cs)
        return h

    def _publish(self, h: _Held) -> Plan:
        paths = []
        for c, g in h.res.items():
            p = c.paths.get(g)
            paths.append(p if p is not None else c.path(g))
        plan = self._plans[h.transfer] = Plan(h.transfer, h.src, h.dst, tuple(paths))
        return plan

    def _mark(self, h: _Held) -> None:
        # A victim may be altered several times per plan() and is read only via changed()/active,
        # so its Plan object is rebuilt once, when asked for.
        self._stale[h.transfer] = h
        self._changed[h.transfer] = None

    def _flush(self) -> None:
        for h in self._stale.values():
            self._publish(h)
        self._stale.clear()

    def _bn(self, c: _Cand) -> float:
        b: float = min(c.get(self._res))
        return c.cap if c.cap < b else b

    def _account(self, h: _Held, c: _Cand, g: float) -> None:
        """Record that ``h`` holds ``g`` more on ``c`` (residuals already lowered)."""
        held = h.res
        if c in held:
            held[c] += g
            return
        cnt = self._cnt
        for e in c.edges:
            cnt[e] += 1
        if not c.direct:
            icnt = self._icnt
            for e in c.edges:
                icnt[e] += 1
        self._used |= c.mask
        held[c] = g

    def _reserve(self, h: _Held, c: _Cand, g: float) -> None:
        res = self._res
        for e in c.edges:
            r = res[e] - g
            if r <= EPS:
                res[e] = 0.0
                self._sat |= 1 << e
            else:
                res[e] = r
        self._account(h, c, g)

    def _drop(self, h: _Held, c: _Cand, g: float | None = None) -> None:
        """Give back ``g`` of ``h``'s rate on ``c`` (all of it when None or when little is left)."""
        res, cap, cnt = self._res, self._cap, self._cnt
        have = h.res[c]
        whole = g is None or have - g <= EPS
        amount = have if g is None or whole else g
        for e in c.edges:
            if whole:
                cnt[e] -= 1
                if not c.direct:
                    self._icnt[e] -= 1
            if cnt[e] == 0:
                res[e] = cap[e]
                self._used &= ~(1 << e)
            else:
                r = res[e] + amount
                res[e] = r if r < cap[e] else cap[e]
        self._sat &= ~c.mask
        if whole:
            del h.res[c]
        else:
            h.res[c] = have - amount

    def _stopped(self, cs: _CSet) -> bool:
        """Source NVLink out- or destination in-bandwidth used up (GPU pairs only)."""
        so, si, sat = cs.stop_out, cs.stop_in, self._sat
        return bool(so) and ((sat & so) == so or (sat & si) == si)

    # ---- planning phases ----------------------------------------------------------------------
    def _phase_direct(self, h: _Held) -> None:
        """Step 1 (and, for topology-oblivious harvesting, everything)."""
        cs = h.cs
        direct = cs.direct
        victims: list[_Held] = []
        if self._reroute:
            icnt = self._icnt
            for c in direct:
                for e in c.edges:
                    if icnt[e]:
                        victims += [v for v in self._evict(h, c) if v not in victims]
                        break
        if cs.fair:
            self._take_fair(h, cs.busy)
        elif len(direct) == 1:
            c = direct[0]
            if not c.mask & self._sat:
                self._reserve(h, c, self._bn(c))
        elif direct:
            best = max(direct, key=lambda c: (self._bn(c), -c.rank))
            if (b := self._bn(best)) > EPS:
                self._reserve(h, best, b)
            if self._multipath:  # several direct routes (unusual): take them all
                for c in direct:
                    if c is not best and (b := self._bn(c)) > EPS:
                        self._reserve(h, c, b)
        for v in victims:
            self._fill(v)
            self._mark(v)

    def _phase_rest(self, h: _Held) -> None:
        """Steps 2-4."""
        cs = h.cs
        if not cs.fair and (cs.flow or cs.tiers):
            self._fill(h)
            if cs.balance and len(self._held) > 1 and not self._stopped(cs):
                self._balance(h)
        if not h.res:
            for c in cs.fallback:
                b = self._bn(c)
                if b > EPS:
                    self._reserve(h, c, b)
                    break

    def _yield_detours(self, h: _Held) -> list[_Held]:
        """Other transfers give up their idle-flow detours that cross the routes ``h`` takes under load."""
        out = []
        mine = h.cs.load_mask
        for v in self._held.values():
            if v is h:
                continue
            hit = [d for d in v.res if d.detour and d.mask & mine]
            for d in hit:
                self._drop(v, d)
            if hit:
                out.append(v)
        return out

    def _evict(self, h: _Held, c: _Cand) -> list[_Held]:
        """Take every other transfer's indirect path off the edges of ``h``'s direct route ``c``."""
        out = []
        mine = c.mask
        for v in self._held.values():
            if v is h:
                continue
            hit = [d for d in v.res if not d.direct and d.mask & mine]
            for d in hit:
                self._drop(v, d)
            if hit:
                out.append(v)
        return out

    def _fill(self, h: _Held) -> None:
        """Free paths for ``h``, reserved for real."""
        own = 0
        for c in h.res:
            own |= c.mask
        loaded = bool(self._used & ~own & h.cs.allmask)
        picks, self._sat = self._select(h.cs, h.res, self._res, self._sat, loaded)
        for c, g in picks:
            self._account(h, c, g)

    def _select(self, cs: _CSet, held: Mapping[_Cand, float], res: list[float], sat: int, loaded: bool
                ) -> tuple[list[tuple[_Cand, float]], int]:
        """Free paths, tier by tier, widest live bottleneck first, lowering ``res`` as it goes.

        Works on any residual list (the live one, or a scratch copy for a dry run) and returns
        the picks and the updated saturation mask. Lazy greedy: a route's bottleneck can only
        fall as others are taken, so the head of the ranked list is re-evaluated and taken if it
        still ranks first, else re-inserted.
        """
        so, si = cs.stop_out, cs.stop_in
        picks: list[tuple[_Cand, float]] = []
        flow, tiers, grouped_ = cs.flow, cs.tiers, cs.grouped
        if loaded and cs.load:
            flow, tiers, grouped_ = (), cs.load_tiers, cs.load_grouped
        # The idle maximum flow's paths, in order, each up to its share of that flow: on an idle
        # machine this alone is the maximum flow; on a busy one each gets what its links have left.
        for c in flow:
            m = c.mask
            if m & sat:
                continue
            b = min(c.get(res))
            if c.share < b:
                b = c.share
            if b <= EPS:
                continue
            for e in c.edges:
                r = res[e] - b
                if r <= EPS:
                    res[e] = 0.0
                    sat |= 1 << e
                else:
                    res[e] = r
            picks.append((c, b))
            if so and ((sat & so) == so or (sat & si) == si):
                return picks, sat
        for tier, grouped in zip(tiers, grouped_, strict=True):
            if so and ((sat & so) == so or (sat & si) == si):
                break
            groups: set[str | None] | None = None
            if grouped:
                groups = {c.group for c in held} | {c.group for c, _ in picks}
                groups.discard(None)
            work: list[tuple[float, int, _Cand]] = []
            for c in tier:
                if c.mask & sat or (groups is not None and c.group in groups and c not in held):
                    continue
                b = min(c.get(res))
                work.append((-(c.cap if c.cap < b else b), c.rank, c))
            if len(work) > 1:
                work.sort()
            dirty = 0  # edges lowered since ``work`` was ranked: only routes crossing them are stale
            while work:
                nb, rank, c = work.pop(0)
                if groups is not None and c.group in groups and c not in held:
                    continue
                m = c.mask
                if m & dirty:
                    if m & sat:
                        continue
                    b = min(c.get(res))
                    if c.cap < b:
                        b = c.cap
                    if work:
                        top = work[0]
                        if b < -top[0] or (b == -top[0] and rank > top[1]):
                            bisect.insort(work, (-b, rank, c))  # another route is now wider
                            continue
                else:
                    b = -nb
                for e in c.edges:
                    r = res[e] - b
                    if r <= EPS:
                        res[e] = 0.0
                        sat |= 1 << e
                    else:
                        res[e] = r
                dirty |= m
                picks.append((c, b))
                if groups is not None and c.group is not None:
                    groups.add(c.group)
        return picks, sat

    def _take_fair(self, h: _Held, cands: Sequence[_Cand]) -> None:
        """Reserve all of ``cands`` at once, max-min fair over the residuals (progressive filling)."""
        res = self._res
        left = {e: res[e] for c in cands for e in c.edges}
        rate = {c: 0.0 for c in cands}
        live = [c for c in cands if not c.mask & self._sat]
        while live:
            users: dict[int, int] = {}
            for c in live:
                for e in c.edges:
                    users[e] = users.get(e, 0) + 1
            inc = min(left[e] / n for e, n in users.items())
            inc = min([inc] + [c.cap - rate[c] for c in live])
            for c in live:
                rate[c] += inc
                for e in c.edges:
                    left[e] -= inc
            live = [c for c in live if c.cap - rate[c] > EPS and all(left[e] > EPS for e in c.edges)]
        for c in cands:
            g = min(rate[c], self._bn(c))  # guard float drift: never beyond the live residual
            if g > EPS:
                self._reserve(h, c, g)

    def _balance(self, h: _Held) -> None:
        """Busy-path balancing (Algorithm 1, lines 8-14), after free paths ran out.

        For each of ``h``'s NVLink routes that is busy (some edge has no residual), in static rank
        order, while neither the source's out- nor the destination's in-bandwidth is used up:

        * The route is considered only if every saturated edge on it carries paths of one and the
          same other transfer V, none of which is V's direct path (direct paths are never given
          up), and V holds more bandwidth in total than ``h`` has so far (the paper compares the
          two totals). Call V's paths on those edges its *blocking* paths, of total rate L.
        * **Compensation**: if V could give up its blocking paths, let ``h`` take the route at its
          bottleneck, and still win back at least L over free paths (a dry run decides), it does
          exactly that: V "switches to another path".
        * **Fair share** otherwise: V's ``k`` blocking paths each give up ``x`` and ``h`` takes
          the route at ``x``, with ``x = min(headroom on the route's unsaturated edges, smallest
          blocking rate, (total_V - total_h) / (k + 1))`` -- the largest move that never leaves
          V below ``h``.
        * Each route is looked at once, so balancing always ends.
        """
        cs = h.cs
        owners = self._owners(h)
        others = 0
        for _, ind, dirm in owners:
            others |= ind | dirm
        mine = h.total
        for c in cs.load_busy:
            satc = c.mask & self._sat
            if not satc or satc & ~others or c in h.res:
                continue  # free, or some saturated edge is held by h alone: nobody to balance with
            # The one other transfer whose paths cross the saturated edges, if there is exactly one
            # and none of its paths there is direct (per-transfer edge masks: no per-path scan).
            victim: _Held | None = None
            for v, ind, dirm in owners:
                if satc & (ind | dirm):
                    if victim is not None or satc & dirm:
                        victim = None
                        break
                    victim = v
            if victim is None or victim.total <= mine + EPS:
                continue
            blocking = [d for d in victim.res if d.mask & satc]
            if self._compensate(h, c, victim, blocking) or self._share(h, c, victim, blocking, satc):
                if self._stopped(cs):
                    return
                owners = self._owners(h)
                others = 0
                for _, ind, dirm in owners:
                    others |= ind | dirm
                mine = h.total

    def _owners(self, h: _Held) -> list[tuple[_Held, int, int]]:
        """Every other transfer with the masks of the edges its indirect and its direct paths cross."""
        out = []
        for v in self._held.values():
            if v is not h:
                ind = dirm = 0
                for d in v.res:
                    if d.direct:
                        dirm |= d.mask
                    else:
                        ind |= d.mask
                out.append((v, ind, dirm))
        return out

    def _compensate(self, h: _Held, c: _Cand, v: _Held, blocking: list[_Cand]) -> bool:
        """Dry-run V giving up ``blocking`` and re-planning; commit only if V loses nothing."""
        cap = self._cap
        scratch = self._res[:]
        sat = self._sat
        lost = 0.0
        touched = c.mask
        for d in blocking:
            g = v.res[d]
            lost += g
            touched |= d.mask
            for e in d.edges:
                r = scratch[e] + g
                scratch[e] = r if r < cap[e] else cap[e]
        sat &= ~touched
        b = min(c.get(scratch))
        if c.cap < b:
            b = c.cap
        if b <= EPS:
            return False
        for e in c.edges:
            r = scratch[e] - b
            if r <= EPS:
                scratch[e] = 0.0
                sat |= 1 << e
            else:
                scratch[e] = r
        # Cheap bound first: V cannot win back more than its unsaturated routes' bottlenecks.
        bound = 0.0
        for d in v.cs.load_busy:
            if not d.mask & sat:
                bound += min(d.get(scratch))
        if bound < lost - EPS:
            return False
        rest = {d: g for d, g in v.res.items() if d not in blocking}
        picks, _ = self._select(v.cs, rest, scratch, sat, True)
        if sum(g for _, g in picks) < lost - EPS:
            return False
        for d in blocking:
            self._drop(v, d)
        if (b := min(b, self._bn(c))) > EPS:
            self._reserve(h, c, b)
        for d, g in picks:  # same sequence as the dry run; the guard only absorbs float noise
            g = min(g, self._bn(d))
            if g > EPS:
                self._reserve(v, d, g)
        self._mark(v)
        return True

    def _share(self, h: _Held, c: _Cand, v: _Held, blocking: list[_Cand], satc: int) -> bool:
        mine, theirs = h.total, v.total
        free = [self._res[e] for e in c.edges if not satc >> e & 1]
        x = min(free + [c.cap, min(v.res[d] for d in blocking), (theirs - mine) / (len(blocking) + 1)])
        if x <= EPS:
            return False
        for d in blocking:
            self._drop(v, d, x)
        g = min(x, self._bn(c))
        if g > EPS:
            self._reserve(h, c, g)
        self._mark(v)
        return True


# ---- route sets of identical nodes ------------------------------------------------------------------
# A cluster built by Topology.replicate has N identical nodes: a same-node pair's route set on node i
# is node 0's with every name renamed (names compare within one node as they do on node 0, since they
# share the prefix), so it is computed once per shape instead of solving the same maximum flows on
# every node. tests/unit/test_policy_routing_twins.py checks the renamed sets against route_set.
def _twin_nodes(topo: Topology) -> Mapping[int, tuple[str, str]]:
    """node -> (prefix of an earlier node it copies, its own prefix), for nodes that are renamed
    copies (devices, their attributes and out-edges in the same order) of an earlier node."""
    by_node: dict[int, list[str]] = {}
    for d in topo.devices:
        by_node.setdefault(d.node, []).append(d.name)
    first: dict[tuple[object, ...], str] = {}
    out: dict[int, tuple[str, str]] = {}
    for node, names in by_node.items():
        prefix = f"n{node}."
        if not all(n.startswith(prefix) for n in names):
            continue
        k = len(prefix)

        def strip(n: str, prefix: str = prefix, k: int = k) -> str:
            return n[k:] if n.startswith(prefix) else "/" + n  # "/": a name outside the node

        shape: list[object] = []
        for n in names:
            d = topo.device(n)
            shape.append((n[k:], d.kind, d.model, d.memory_bytes))
            shape += [(strip(e.dst), e.kind, e.gbps, e.bricks) for e in topo.out_edges(n)]
        key = tuple(shape)
        canon = first.setdefault(key, prefix)
        if canon != prefix:
            out[node] = (canon, prefix)
    return MappingProxyType(out)


def _twin_route_set(topo: Topology, src: str, dst: str, opts: RoutingOptions,
                    twins: Mapping[int, tuple[str, str]] | None = None,
                    canon_sets: dict[tuple[str, str], RouteSet] | None = None) -> RouteSet | None:
    """The route set of a same-node pair on a node that copies an earlier one, renamed from that
    node's (kept in ``canon_sets``); None where that does not apply (then ``route_set`` computes it)."""
    twin = _twin_pair(topo, src, dst, twins if twins is not None else _twin_nodes(topo))
    if twin is None:
        return None
    key, canon, own = twin
    rs = None if canon_sets is None else canon_sets.get(key)
    if rs is None:
        try:
            rs = route_set(topo, key[0], key[1], opts)
        except ConfigError:
            return None  # let route_set raise it with this pair's names
        if canon_sets is not None:
            canon_sets[key] = rs
    return _renamed(rs, _renaming(canon, own))


def _twin_pair(topo: Topology, src: str, dst: str, twins: Mapping[int, tuple[str, str]]
               ) -> tuple[tuple[str, str], str, str] | None:
    """For a same-node pair on a node that copies an earlier one: (the same pair on that node, its
    prefix, this node's prefix); None for any other pair."""
    if src == dst or src not in topo or dst not in topo:
        return None
    node = topo.device(src).node
    twin = twins.get(node)
    if twin is None or topo.device(dst).node != node:
        return None
    canon, own = twin
    k = len(own)
    return (canon + src[k:], canon + dst[k:]), canon, own


def _renaming(canon: str, own: str) -> Callable[[str], str]:
    """A name on the node of prefix ``canon`` -> the same device's on the node of prefix ``own``
    (a name outside that node stays)."""
    kc = len(canon)

    def fwd(n: str) -> str:
        return own + n[kc:] if n.startswith(canon) else n

    return fwd


def _renamed(rs: RouteSet, f: Callable[[str], str]) -> RouteSet:
    names: dict[str, str] = {}  # a name's new name, and a route's renamed copy, each made once per set
    routes: dict[int, Route] = {}  # id(route) -> its copy: the routes are held by rs for the call

    def name(n: str) -> str:
        m = names.get(n)
        if m is None:
            m = names[n] = f(n)
        return m

    def route(r: Route) -> Route:
        x = routes.get(id(r))
        if x is None:
            x = routes[id(r)] = Route(tuple(map(name, r.hops)), r.tier, None if r.group is None else name(r.group),
                                      r.cap, r.direct, r.share)
        return x

    def tier(t: tuple[Route, ...]) -> tuple[Route, ...]:
        return tuple(map(route, t))

    return replace(rs, direct=tier(rs.direct), flow=tier(rs.flow), tiers=tuple(map(tier, rs.tiers)),
                   fallback=tier(rs.fallback), stop_out=tuple((name(a), name(b)) for a, b in rs.stop_out),
                   stop_in=tuple((name(a), name(b)) for a, b in rs.stop_in),
                   load_tiers=tuple(map(tier, rs.load_tiers)))
