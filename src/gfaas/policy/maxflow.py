"""Maximum flow on a small directed graph, and its decomposition into paths with rates.

The planner computes, once per (source, destination) pair, the set of paths that carries the
most data an idle machine can move between the two (see :func:`gfaas.policy.paths.flow_paths`).
Graphs are tiny (a node has tens of devices), so a plain Edmonds-Karp is enough: augmenting paths
with the fewest edges first (the widest of those), over residual capacities kept per direction.
An edge a -> b and its reverse b -> a are separate capacities (a link's ``gbps`` and
``gbps_back``); flow is kept *net* (what goes a -> b cancels what goes b -> a), so the result
never sends data both ways over one link.

Pure: no clock, no I/O; deterministic (neighbours are visited in the order the edges are given).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

#: Flow or residual at or below this (GB/s) counts as none.
FLOW_EPS = 1e-9

Hops = tuple[str, ...]


class _Net:
    """Capacities and net flow of a directed graph, with adjacency in first-seen order."""

    def __init__(self, edges: Iterable[tuple[str, str, float]]) -> None:
        self.cap: dict[tuple[str, str], float] = {}
        self.flow: dict[tuple[str, str], float] = {}
        self.adj: dict[str, list[str]] = {}
        for a, b, c in edges:
            if a == b or not c > 0:
                continue
            self.cap[(a, b)] = self.cap.get((a, b), 0.0) + c
            for x, y in ((a, b), (b, a)):
                nb = self.adj.setdefault(x, [])
                if y not in nb:
                    nb.append(y)

    def residual(self, a: str, b: str) -> float:
        return self.cap.get((a, b), 0.0) - self.flow.get((a, b), 0.0)

    def push(self, hops: Sequence[str], amount: float) -> None:
        fl = self.flow
        for a, b in zip(hops, hops[1:], strict=False):
            fl[(a, b)] = fl.get((a, b), 0.0) + amount
            fl[(b, a)] = fl.get((b, a), 0.0) - amount

    def shortest_widest(self, src: str, dst: str, weight: Callable[[str, str], float]) -> Hops | None:
        """Among the paths src -> dst with the fewest edges of positive ``weight``, the one whose
        narrowest edge is widest (ties: the larger sum of widths, then neighbours in edge order);
        None if dst is unreachable.

        Breadth-first levels, then the widest bottleneck level by level: preferring wide routes
        leaves the narrow links (one-brick NVLink) to other transfers when it costs nothing.
        """
        level = {src: 0}
        layers = [[src]]
        while layers[-1] and dst not in level:
            nxt: list[str] = []
            for x in layers[-1]:
                for y in self.adj.get(x, ()):
                    if y not in level and weight(x, y) > FLOW_EPS:
                        level[y] = len(layers)
                        nxt.append(y)
            layers.append(nxt)
        if dst not in level:
            return None
        # (narrowest edge, sum of edge widths): the sum breaks ties towards wider links overall.
        best: dict[str, tuple[float, float]] = {src: (float("inf"), 0.0)}
        prev: dict[str, str] = {}
        for k in range(1, level[dst] + 1):
            for x in layers[k - 1]:
                bx, sx = best[x]
                for y in self.adj.get(x, ()):
                    if level.get(y) != k:
                        continue
                    w = weight(x, y)
                    if w <= FLOW_EPS:
                        continue
                    v = (bx if bx < w else w, sx + w)
                    if y not in best or v > best[y]:
                        best[y] = v
                        prev[y] = x
        out = [dst]
        while out[-1] != src:
            out.append(prev[out[-1]])
        return tuple(reversed(out))


def _bottleneck(hops: Sequence[str], weight: Callable[[str, str], float]) -> float:
    return min(weight(a, b) for a, b in zip(hops, hops[1:], strict=False))


def _fill_first(net: _Net, first: Sequence[Hops]) -> tuple[list[tuple[Hops, float]], float]:
    """Push each of ``first`` (routes whose every edge exists) to its bottleneck, in order: the
    routes a flow keeps whole (the direct link first). Returns them with their rates, and the total."""
    fixed: list[tuple[Hops, float]] = []
    value = 0.0
    for hops in first:
        if len(hops) < 2 or any((a, b) not in net.cap for a, b in zip(hops, hops[1:], strict=False)):
            continue
        b = _bottleneck(hops, net.residual)
        if b > FLOW_EPS:
            net.push(hops, b)
            fixed.append((tuple(hops), b))
            value += b
    return fixed, value


def max_flow(edges: Iterable[tuple[str, str, float]], src: str, dst: str,
             first: Sequence[Hops] = ()) -> tuple[float, list[tuple[Hops, float]]]:
    """Maximum flow ``src -> dst`` over directed ``edges`` ``(a, b, capacity)``, as paths.

    Returns the flow value and a decomposition into loop-free paths ``(hops, rate)`` whose rates
    add up to it (no directed edge carries more than its capacity, summing all paths). Routes in
    ``first`` (e.g. the direct link) are filled first, each to its bottleneck, and kept whole; the
    rest of the flow is the maximum over what they leave (for a direct link that is the overall
    maximum: every cut between the two ends contains it). Paths come out in that order, then by
    number of edges (shortest first).
    """
    net = _Net(edges)
    fixed, value = _fill_first(net, first)
    # The fixed routes are taken out of the graph: augmenting paths may not cancel them.
    for hops, b in fixed:
        for a, c in zip(hops, hops[1:], strict=False):
            net.cap[(a, c)] -= b
            net.flow[(a, c)] -= b
            net.flow[(c, a)] += b

    while (path := net.shortest_widest(src, dst, net.residual)) is not None:
        b = _bottleneck(path, net.residual)
        net.push(path, b)
        value += b

    def carried(a: str, b: str) -> float:
        return net.flow.get((a, b), 0.0)

    rest: list[tuple[Hops, float]] = []
    while (path := net.shortest_widest(src, dst, carried)) is not None:  # flow cycles are left out
        b = _bottleneck(path, carried)
        net.push(path, -b)
        rest.append((path, b))
    return value, fixed + rest


def min_cost_max_flow(edges: Iterable[tuple[str, str, float]], src: str, dst: str,
                      first: Sequence[Hops] = ()) -> tuple[float, list[tuple[Hops, float]]]:
    """Like :func:`max_flow`, but among the maximum flows the one with the fewest link-uses.

    Cost is 1 per GB/s per directed edge, so the flow minimises ``sum(rate * edges)`` over its
    paths: no detour is longer than the maximum forces. Successive shortest paths: each augmenting
    path is a cheapest one in the residual graph (Bellman-Ford, since cancelling flow on an edge
    costs -1; there is never a negative cycle, the invariant of the method), the widest of the
    cheapest ones when several tie. ``first`` routes are filled first and kept whole, as in
    :func:`max_flow`. The decomposition takes the flow's shortest paths first (fewest edges,
    then widest), so a caller that stops early keeps the short ones.
    """
    net = _Net(edges)
    fixed, value = _fill_first(net, first)
    for hops, g in fixed:
        for a, c in zip(hops, hops[1:], strict=False):
            net.cap[(a, c)] -= g
    net.flow.clear()
    cap = net.cap
    x: dict[tuple[str, str], float] = {}  # flow per directed edge (both directions kept apart)

    # Ties between equally short flows go to wide links (the narrow ones stay free for others):
    # the second, additive, cost is minus the link's width (in integer MB/s, so sums are exact).
    width = {e: round(c * 1000) for e, c in cap.items()}

    def option(a: str, b: str) -> tuple[int, int, float]:
        """Cheapest way to move more a -> b, as (link-uses, -width, room): cancel flow on b -> a
        (costs (-1, +width)), else use a -> b (costs (+1, -width)); (0, 0, 0.0) if neither."""
        back = x.get((b, a), 0.0)
        if back > FLOW_EPS:
            return -1, width[(b, a)], back
        fwd = cap.get((a, b), 0.0) - x.get((a, b), 0.0)
        return (1, -width[(a, b)], fwd) if fwd > FLOW_EPS else (0, 0, 0.0)

    nodes = list(net.adj)
    while True:
        # Bellman-Ford on (link-uses, -widths, -bottleneck), rounds in node order.
        best: dict[str, tuple[int, int, float]] = {src: (0, 0, -float("inf"))}
        prev: dict[str, str] = {}
        for _ in range(len(nodes)):
            moved = False
            for a in nodes:
                if a not in best:
                    continue
                ca, da, wa = best[a]
                for b in net.adj[a]:
                    k, d, w = option(a, b)
                    if k == 0:
                        continue
                    v = (ca + k, da + d, wa if wa > -w else -w)
                    if b not in best or v < best[b]:
                        best[b] = v
                        prev[b] = a
                        moved = True
            if not moved:
                break
        if dst not in best:
            break
        path = [dst]
        while path[-1] != src:
            path.append(prev[path[-1]])
            if len(path) > len(nodes):  # cannot happen without a negative cycle; never loop
                raise AssertionError(f"min_cost_max_flow: cycle in the shortest-path tree {path}")
        path.reverse()
        amount = -best[dst][2]
        for a, b in zip(path, path[1:], strict=False):
            amount = min(amount, option(a, b)[2])
        if amount <= FLOW_EPS:
            break
        for a, b in zip(path, path[1:], strict=False):
            if x.get((b, a), 0.0) > FLOW_EPS:
                x[(b, a)] -= amount
            else:
                x[(a, b)] = x.get((a, b), 0.0) + amount
        value += amount

    for (a, b), f in x.items():
        net.flow[(a, b)] = net.flow.get((a, b), 0.0) + f
        net.flow[(b, a)] = net.flow.get((b, a), 0.0) - f

    def carried(a: str, b: str) -> float:
        return net.flow.get((a, b), 0.0)

    rest: list[tuple[Hops, float]] = []
    while (path2 := net.shortest_widest(src, dst, carried)) is not None:
        g = _bottleneck(path2, carried)
        net.push(path2, -g)
        rest.append((path2, g))
    return value, fixed + rest
