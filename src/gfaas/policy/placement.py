"""Where a workflow's functions run: GPUs on a node, and nodes in a cluster.

``place_workflow`` follows the idea of MAPA (Ranganath et al., SC'21, which seed 000 §6.2 applies
before routing): put functions that exchange many bytes on GPUs joined by wide NVLink. The score
of a mapping is the time its edges would take on idle links, ``sum(bytes / pair bandwidth)``,
where two functions on one GPU cost nothing, an NVLink pair moves at its NVLink rate and any other
pair at the PCIe peer-to-peer rate. The best mapping is found by exhaustive branch-and-bound (a
node of 8 GPUs is small), with a cap on the work done.

``group_nodes`` splits a workflow across nodes the FaaSFlow way (seed 000 §9.3): keep it on one
node if it fits, else cut its topological order into consecutive pieces so that as few edges as
possible -- ideally one -- cross the network.

``place_replicas`` places many replicas of a workflow on a cluster: each replica whole on one node
where it fits (no bytes cross the network), replicas dealt to the least-loaded node first, so a
cluster of N nodes at N times the load sees the same per-node layout as one node. The
``spread`` layout instead spreads every replica over all the given nodes (the inter-node
experiments of seed 001 study exactly that case).
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Mapping, Sequence
from typing import Literal

from ..errors import ConfigError
from ..topology import GB, Topology

#: Branch-and-bound search nodes before the best mapping found so far is returned.
SEARCH_BUDGET = 50_000


def pair_gbps(topology: Topology, a: str, b: str) -> float:
    """Bandwidth between two GPUs for placement: inf on one GPU, NVLink rate, else PCIe P2P."""
    if a == b:
        return math.inf
    nv = topology.nvlink_gbps(a, b)
    return nv if nv > 0 else topology.pcie_p2p_gbps


def placement_cost(topology: Topology, mapping: Mapping[str, str], edges: Sequence[tuple[str, str, int]]) -> float:
    """Seconds the workflow's edges would take on idle links under ``mapping`` (lower is better)."""
    total = 0.0
    for u, v, nbytes in edges:
        total += nbytes / GB / pair_gbps(topology, mapping[u], mapping[v])
    return total


def _check(functions: Sequence[str], edges: Sequence[tuple[str, str, int]]) -> None:
    if len(set(functions)) != len(functions):
        raise ConfigError(f"function names repeat in {list(functions)!r}; give each function a unique name")
    known = set(functions)
    for u, v, nbytes in edges:
        for f in (u, v):
            if f not in known:
                raise ConfigError(f"edge {u}->{v} names unknown function {f!r}; list it in functions")
        if nbytes < 0:
            raise ConfigError(f"edge {u}->{v} carries {nbytes} bytes; it must be >= 0")


def place_workflow(topology: Topology, functions: Sequence[str], edges: Sequence[tuple[str, str, int]],
                   free: Sequence[str], *, topology_aware: bool = True, seed: int = 0) -> dict[str, str]:
    """Map each function to one of the ``free`` GPUs (all on one node).

    More functions than GPUs: functions time-share GPUs, at most ``ceil(F / G)`` per GPU, so the
    load stays even (otherwise putting everything on one GPU would always look free of transfer
    cost); heavy edges then end up inside one GPU. With ``topology_aware=False`` the GPUs are
    shuffled by ``random.Random(seed)`` and dealt round-robin: what placement without topology
    knowledge (NVSHMEM+, DeepPlan+) amounts to.
    """
    _check(functions, edges)
    if not functions:
        return {}
    if not free:
        raise ConfigError(f"no free GPU to place {len(functions)} functions on; free at least one GPU")
    if len(set(free)) != len(free):
        raise ConfigError(f"free GPUs repeat in {list(free)!r}; list each GPU once")
    nodes = set()
    for g in free:
        d = topology.device(g)
        if d.kind != "gpu":
            raise ConfigError(f"{g!r} is a {d.kind}, not a GPU; list only GPUs as free")
        nodes.add(d.node)
    if len(nodes) > 1:
        raise ConfigError(f"free GPUs {list(free)!r} span nodes {sorted(nodes)}; place per node (see group_nodes)")
    per_gpu = -(-len(functions) // len(free))
    if not topology_aware:
        order = list(free)
        random.Random(seed).shuffle(order)
        return {f: order[i % len(order)] for i, f in enumerate(functions)}
    return _search(topology, list(functions), edges, list(free), per_gpu)


def _search(topology: Topology, functions: list[str], edges: Sequence[tuple[str, str, int]],
            free: list[str], per_gpu: int) -> dict[str, str]:
    n, g = len(functions), len(free)
    idx = {f: i for i, f in enumerate(functions)}
    weight: dict[tuple[int, int], float] = {}
    for u, v, nbytes in edges:
        a, b = idx[u], idx[v]
        if a != b and nbytes:
            key = (min(a, b), max(a, b))
            weight[key] = weight.get(key, 0.0) + nbytes / GB
    # Seconds per GB between GPU slots (0 on the same GPU).
    sec = [[0.0 if i == j else 1.0 / pair_gbps(topology, free[i], free[j]) for j in range(g)] for i in range(g)]
    cheapest = 0.0 if per_gpu > 1 else min((sec[i][j] for i in range(g) for j in range(g) if i != j), default=0.0)
    # Heaviest functions first: their choices decide most of the cost, so bounds bite early.
    heft = [0.0] * n
    for (a, b), w in weight.items():
        heft[a] += w
        heft[b] += w
    order = sorted(range(n), key=lambda i: (-heft[i], i))
    pos = {f: k for k, f in enumerate(order)}
    # For the k-th placed function: its edges to functions placed before it, as (earlier, weight).
    back: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    # open_after[m]: weight of edges not complete once the first m functions are placed.
    open_after = [0.0] * (n + 1)
    for (a, b), w in weight.items():
        first, last = sorted((pos[a], pos[b]))
        back[last].append((order[first], w))
        for m in range(last + 1):
            open_after[m] += w

    at = [-1] * n
    load = [0] * g

    def step_cost(k: int, slot: int) -> float:
        return sum(w * sec[slot][at[j]] for j, w in back[k])

    # Greedy start: each function where it adds least, so a budget cut still returns something sound.
    cost = 0.0
    for k, f in enumerate(order):
        slot = min((s for s in range(g) if load[s] < per_gpu), key=lambda s: (step_cost(k, s), s))
        cost += step_cost(k, slot)
        at[f] = slot
        load[slot] += 1
    best_cost, best = cost, at[:]
    at = [-1] * n
    load = [0] * g
    budget = [SEARCH_BUDGET]

    def dfs(k: int, cost: float) -> None:
        nonlocal best_cost, best
        if k == n:
            if cost < best_cost - 1e-15:
                best_cost, best = cost, at[:]
            return
        budget[0] -= 1
        if budget[0] < 0:
            return
        f = order[k]
        for slot in range(g):
            if load[slot] >= per_gpu:
                continue
            c = cost + step_cost(k, slot)
            if c + open_after[k + 1] * cheapest >= best_cost - 1e-15:
                continue
            at[f] = slot
            load[slot] += 1
            dfs(k + 1, c)
            load[slot] -= 1
            at[f] = -1

    dfs(0, 0.0)
    return {functions[i]: free[best[i]] for i in range(n)}


def _topo_order(functions: Sequence[str], edges: Sequence[tuple[str, str, int]]) -> list[str]:
    """Kahn's algorithm; among ready functions the one listed first goes first."""
    indeg = dict.fromkeys(functions, 0)
    succ: dict[str, list[str]] = {f: [] for f in functions}
    for u, v, _ in edges:
        if u != v:
            succ[u].append(v)
            indeg[v] += 1
    rank = {f: i for i, f in enumerate(functions)}
    ready = sorted((f for f in functions if indeg[f] == 0), key=rank.__getitem__)
    out: list[str] = []
    while ready:
        f = ready.pop(0)
        out.append(f)
        for v in succ[f]:
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
                ready.sort(key=rank.__getitem__)
    if len(out) != len(functions):
        stuck = [f for f in functions if f not in out]
        raise ConfigError(f"the workflow has a cycle through {stuck!r}; a workflow must be a DAG")
    return out


def group_nodes(functions: Sequence[str], edges: Sequence[tuple[str, str, int]], slots: Mapping[int, int]
                ) -> dict[str, int]:
    """Assign functions to nodes (``slots``: node -> how many functions it can take).

    The functions' topological order is cut into consecutive pieces, one per node, nodes taken in
    order of most slots (ties: lower id). Among all such cuts the one chosen has the fewest edges
    crossing nodes, then the fewest bytes crossing, then the fewest nodes: a workflow that fits on
    one node stays there, and one that does not usually crosses the network exactly once.
    """
    _check(functions, edges)
    for node, n in slots.items():
        if n < 0:
            raise ConfigError(f"node {node} has {n} slots; slots must be >= 0")
    total = sum(slots.values())
    if total < len(functions):
        raise ConfigError(
            f"{len(functions)} functions need {len(functions)} slots but the nodes have {total};"
            " add nodes or free slots"
        )
    if not functions:
        return {}
    order = _topo_order(functions, edges)
    pos = {f: i for i, f in enumerate(order)}
    nodes = sorted((nd for nd, n in slots.items() if n > 0), key=lambda nd: (-slots[nd], nd))
    n = len(order)
    # into[p]: (count, bytes) of edges whose later end is at position p, by earlier end's position.
    into: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for u, v, nbytes in edges:
        a, b = sorted((pos[u], pos[v]))
        if a != b:
            into[b].append((a, nbytes))

    def cut_cost(q: int, p: int) -> tuple[int, int]:
        """Edges entering the piece [q, p) from before q."""
        cnt = byt = 0
        for x in range(q, p):
            for a, nbytes in into[x]:
                if a < q:
                    cnt += 1
                    byt += nbytes
        return cnt, byt

    inf = (math.inf, math.inf, math.inf)
    # best[k][p]: cost of covering the first p functions with the first k nodes, and the cut used.
    best: list[list[tuple[float, float, float]]] = [[inf] * (n + 1) for _ in range(len(nodes) + 1)]
    cut: list[list[int]] = [[0] * (n + 1) for _ in range(len(nodes) + 1)]
    best[0][0] = (0, 0, 0)
    for k, nd in enumerate(nodes, start=1):
        cap = slots[nd]
        for p in range(n + 1):
            for q in range(max(0, p - cap), p + 1):
                prev = best[k - 1][q]
                if prev[0] == math.inf:
                    continue
                if q == p:
                    cand = prev
                else:
                    c, b = cut_cost(q, p)
                    cand = (prev[0] + c, prev[1] + b, prev[2] + 1)
                if cand < best[k][p]:
                    best[k][p] = cand
                    cut[k][p] = q
    out: dict[str, int] = {}
    p = n
    for k in range(len(nodes), 0, -1):
        q = cut[k][p]
        for f in order[q:p]:
            out[f] = nodes[k - 1]
        p = q
    return out


Layout = Literal["pack", "spread"]


def place_replicas(functions: Sequence[str], edges: Sequence[tuple[str, str, int]], replicas: int,
                   slots: Mapping[int, int], *, used: Mapping[int, int] | None = None,
                   layout: Layout = "pack") -> list[dict[str, int]]:
    """Node per function for each of ``replicas`` copies of a workflow (pure, no clock).

    ``slots``: node -> GPU slots it has; ``used``: node -> slots already taken (default none).
    Within a node, :func:`place_workflow` then picks the GPUs.

    ``layout="pack"``, one replica at a time:

    1. on a node with enough free slots for the whole replica, the least loaded one (taken / slots,
       ties: lower id), so replicas spread across nodes and none of their bytes crosses the network;
    2. else, if the replica is larger than every node, cut by :func:`group_nodes` over the free
       slots (over all slots, GPUs shared evenly, when the free ones are too few);
    3. else (the cluster is full) whole on the least-loaded node that could hold it, sharing GPUs.

    ``layout="spread"``: every replica cut by :func:`group_nodes` into even shares of all the
    given nodes, whatever they run already; replica ``r`` takes the cut with the nodes turned by ``r``
    places (so replicas of a workflow smaller than the nodes use them all in turn).
    """
    _check(functions, edges)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise ConfigError(f"replicas={replicas!r}; give a whole number >= 0")
    if layout not in ("pack", "spread"):
        raise ConfigError(f"layout={layout!r}; use 'pack' or 'spread'")
    for node, n in slots.items():
        if n < 0:
            raise ConfigError(f"node {node} has {n} slots; slots must be >= 0")
    taken = dict.fromkeys(slots, 0)
    for node, n in (used or {}).items():
        if node not in slots:
            raise ConfigError(f"used names node {node}, which is not in slots {sorted(slots)}; list it in slots")
        if n < 0:
            raise ConfigError(f"node {node} has {n} slots used; it must be >= 0")
        taken[node] = n
    nodes = sorted(nd for nd, n in slots.items() if n > 0)
    if not functions or replicas == 0:
        return [{} for _ in range(replicas)]
    if not nodes:
        raise ConfigError(f"no node has a slot for {len(functions)} functions; give slots > 0")
    f = len(functions)
    if layout == "spread":
        share = -(-f // len(nodes))
        one = group_nodes(functions, edges, {nd: share for nd in nodes})
        # Replica r is the same cut with the nodes turned by r places: a workflow whose cut leaves
        # nodes out (one GPU function over two nodes) still uses every node's GPUs across its replicas.
        pos = {nd: i for i, nd in enumerate(nodes)}
        return [{fn: nodes[(pos[nd] + r) % len(nodes)] for fn, nd in one.items()} for r in range(replicas)]

    def load(nd: int) -> tuple[float, int]:
        return taken[nd] / slots[nd], nd

    out: list[dict[str, int]] = []
    biggest = max(slots[nd] for nd in nodes)
    # The nodes a whole replica fits on, least loaded first: a heap of load(nd), the key `min` would
    # use (distinct, as nodes are). A node that cannot take a replica never can again (loads only
    # grow), so it leaves for good; the one chosen goes back with its new load.
    fits = [load(nd) for nd in nodes if slots[nd] - taken[nd] >= f]
    heapq.heapify(fits)
    for _ in range(replicas):
        while fits and slots[fits[0][1]] - taken[fits[0][1]] < f:
            heapq.heappop(fits)
        chosen = fits[0][1] if fits else None
        if chosen is not None:
            placed = dict.fromkeys(functions, chosen)
        elif f > biggest:
            free = {nd: max(0, slots[nd] - taken[nd]) for nd in nodes}
            if sum(free.values()) < f:  # GPUs are shared: each slot takes up to k functions
                k = -(-f // sum(slots[nd] for nd in nodes))
                free = {nd: slots[nd] * k for nd in nodes}
            placed = group_nodes(functions, edges, free)
        else:
            nd = min((nd for nd in nodes if slots[nd] >= f), key=load)
            placed = dict.fromkeys(functions, nd)
        for nd in placed.values():
            taken[nd] += 1
        if chosen is not None:
            heapq.heapreplace(fits, load(chosen))  # back with its new load
        out.append(placed)
    return out
