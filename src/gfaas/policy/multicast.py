"""Block multicast schedules: who sends which model block to whom at each step (seed 002 §4.2).

A model is cut into ``B`` blocks; nodes ``0..k-1`` (the sources) hold all of them at step 0 and the
other ``N - k`` nodes must each receive every block exactly once. Time is counted in steps under the
single-port model: in one step a node sends at most one block and receives at most one block. A
schedule is therefore a list of steps, each a list of :class:`Transfer`; :class:`Schedule` answers
per-(node, step) queries and checks those rules (:meth:`Schedule.violations`).

Schemes, each run inside one sub-group of ``L`` nodes (its source plus ``L - 1`` destinations):

``binomial``
    The binomial pipeline (Ganesan & Seshadri 2005, as used by Derecho's RDMC and by seed 002):
    nodes are the corners of an ``l``-dimensional hypercube, ``L = 2^l``; at step ``t`` every node
    pairs with its neighbour across dimension ``t mod l``. The source feeds a new block each step
    and every other node passes on a block its partner still lacks, chosen from the partner's id
    rotated by the dimension (see :func:`_hypercube_block`). It finishes in exactly
    ``B + l - 1`` steps, the lower bound for the single-port model. For ``L`` that is not a power
    of two we keep the hypercube of ``M = 2^floor(log2 L)`` corners and give each extra node
    ``j >= M`` to corner ``j - M + 1`` as its *twin* (Derecho's idea; the source corner never gets
    one). The two twins act as one corner: at each step one of them takes the corner's incoming
    block and the other sends the corner's outgoing block, and the spare ports carry a block from
    one twin to the other (:func:`_twin_roles`). One extra step at the end lets the twins swap
    their last blocks, so the schedule takes ``B + floor(log2 L)`` = ``B + ceil(log2 L) - 1``
    steps, still one send and one receive per node per step.
``tree``
    A binary tree with block pipelining (FaaSNet): node ``i`` forwards each block to child
    ``2i+1`` and then to child ``2i+2`` as soon as it has it. At most ``2B + 2*floor(log2 L)``
    steps (:func:`step_bound`).
``chain``
    Node ``i`` forwards to node ``i+1``: ``B + L - 2`` steps.
``sequential``
    The source sends the whole model to one destination after another, like a broadcast per
    process group in NCCL: ``B * (L - 1)`` steps.

k-way transmission (seed 002 Algorithm 1): the ``N`` nodes are split into ``k`` sub-groups of
nearly equal size, group ``i`` led by source ``i``; each group runs the scheme on its own, and the
blocks are fed in an order rotated per group (the block list cut into ``k`` chunks of
``ceil(B/k)``, group ``i`` starting with chunk ``i``), so that different groups get complementary
blocks first and a full model is spread over ``k`` nodes after about ``B/k`` steps.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import NamedTuple

from ..errors import ConfigError

SCHEMES: tuple[str, ...] = ("binomial", "tree", "chain", "sequential")


class Transfer(NamedTuple):
    """Node ``src`` sends block ``block`` to node ``dst`` (within one step)."""

    src: int
    dst: int
    block: int


# A step of a schedule inside one group, in group-local ids and positions in the group's order.
_Local = tuple[tuple[tuple[int, int, int], ...], ...]


@dataclass(frozen=True)
class Schedule:
    """A complete multicast plan: ``steps[t]`` lists the transfers of step ``t``.

    ``groups[i]`` lists the nodes of sub-group ``i`` (its source first) and ``orders[i]`` the
    order in which that group's source feeds the blocks.
    """

    nodes: int
    blocks: int
    sources: int
    scheme: str
    steps: tuple[tuple[Transfer, ...], ...]
    groups: tuple[tuple[int, ...], ...]
    orders: tuple[tuple[int, ...], ...]
    _send: dict[tuple[int, int], Transfer] = field(default_factory=dict, repr=False, compare=False)
    _recv: dict[tuple[int, int], Transfer] = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def num_transfers(self) -> int:
        return sum(len(s) for s in self.steps)

    def _index(self) -> None:
        if self._send or not self.num_transfers:
            return
        for t, step in enumerate(self.steps):
            for tr in step:
                self._send[(tr.src, t)] = tr
                self._recv[(tr.dst, t)] = tr

    def sends(self, node: int, step: int) -> Transfer | None:
        """What ``node`` sends at ``step`` (None: nothing)."""
        self._index()
        return self._send.get((node, step))

    def receives(self, node: int, step: int) -> Transfer | None:
        """What ``node`` receives at ``step`` (None: nothing)."""
        self._index()
        return self._recv.get((node, step))

    def arrivals(self) -> list[list[tuple[int, int]]]:
        """Per node, ``(step, block)`` for each block it receives, in step order."""
        out: list[list[tuple[int, int]]] = [[] for _ in range(self.nodes)]
        for t, step in enumerate(self.steps):
            for tr in step:
                out[tr.dst].append((t, tr.block))
        return out

    def completion_step(self) -> list[int]:
        """Per node, the number of steps after which it holds every block (0 for the sources)."""
        done = [0] * self.nodes
        for t, step in enumerate(self.steps):
            for tr in step:
                done[tr.dst] = t + 1
        return done

    def violations(self) -> list[str]:
        """Every broken rule, in words (empty: the schedule is valid).

        Rules: one send and one receive per node per step; a sender holds the block at the start
        of the step; nobody sends to a source; no block reaches a node twice; at the end every
        node holds every block.
        """
        full = (1 << self.blocks) - 1
        held = [full if n < self.sources else 0 for n in range(self.nodes)]
        bad: list[str] = []
        for t, step in enumerate(self.steps):
            senders: set[int] = set()
            receivers: set[int] = set()
            for tr in step:
                if not (0 <= tr.src < self.nodes and 0 <= tr.dst < self.nodes and 0 <= tr.block < self.blocks):
                    bad.append(f"step {t}: {tr} names a node or block out of range")
                    continue
                if tr.src in senders:
                    bad.append(f"step {t}: node {tr.src} sends twice")
                if tr.dst in receivers:
                    bad.append(f"step {t}: node {tr.dst} receives twice")
                senders.add(tr.src)
                receivers.add(tr.dst)
                if tr.dst < self.sources:
                    bad.append(f"step {t}: {tr} sends to source {tr.dst}")
                if not held[tr.src] >> tr.block & 1:
                    bad.append(f"step {t}: node {tr.src} sends block {tr.block} it does not hold yet")
                if held[tr.dst] >> tr.block & 1:
                    bad.append(f"step {t}: node {tr.dst} receives block {tr.block} a second time")
            for tr in step:  # arrivals count from the next step on
                if 0 <= tr.dst < self.nodes and 0 <= tr.block < self.blocks:
                    held[tr.dst] |= 1 << tr.block
        for n, h in enumerate(held):
            if h != full:
                missing = [b for b in range(self.blocks) if not h >> b & 1]
                bad.append(f"node {n} ends without blocks {missing}")
        return bad

    def to_json(self) -> dict[str, object]:
        """``{"num_steps": int, "steps": [[{"src", "dst", "block"}, ...], ...]}``."""
        return {
            "num_steps": self.num_steps,
            "steps": [[{"src": s, "dst": d, "block": b} for s, d, b in step] for step in self.steps],
        }


def _check_args(nodes: int, blocks: int, sources: int, scheme: str) -> None:
    for name, value in (("nodes", nodes), ("blocks", blocks), ("sources", sources)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name}={value!r} is not an integer; pass a whole number >= 1")
    if nodes < 1:
        raise ConfigError(f"nodes={nodes}: a multicast needs at least 1 node (the source); pass nodes >= 1")
    if blocks < 1:
        raise ConfigError(f"blocks={blocks}: a model has at least 1 block; pass blocks >= 1")
    if not 1 <= sources <= nodes:
        raise ConfigError(f"sources={sources} with nodes={nodes}: pass 1 <= sources <= nodes")
    if scheme not in SCHEMES:
        raise ConfigError(f"scheme={scheme!r} is unknown; pick one of {', '.join(SCHEMES)}")


def group_sizes(nodes: int, sources: int) -> list[int]:
    """Sizes of the ``sources`` sub-groups (each counting its source), as equal as possible."""
    base, extra = divmod(nodes, sources)
    return [base + (1 if i < extra else 0) for i in range(sources)]


def split_groups(nodes: int, sources: int) -> list[list[int]]:
    """Sub-group ``i``: source ``i`` then a contiguous run of destination ids (seed 002 §4.2)."""
    out: list[list[int]] = []
    nxt = sources
    for i, size in enumerate(group_sizes(nodes, sources)):
        out.append([i, *range(nxt, nxt + size - 1)])
        nxt += size - 1
    return out


def block_orders(blocks: int, sources: int) -> list[list[int]]:
    """Seed 002 Algorithm 1: cut the blocks into ``sources`` chunks of ``ceil(B/k)`` and let group
    ``i`` feed them starting from chunk ``i`` (chunks may be empty when ``B < k``)."""
    size = -(-blocks // sources)
    chunks = [list(range(size * i, min(size * (i + 1), blocks))) for i in range(sources)]
    return [[b for j in range(sources) for b in chunks[(i + j) % sources]] for i in range(sources)]


def step_bound(scheme: str, group_size: int, blocks: int) -> int:
    """Steps the scheme needs in a group of ``group_size`` nodes (exact, except ``tree``: an upper
    bound). A group of one node needs no step."""
    n, b = group_size, blocks
    if n <= 1:
        return 0
    if scheme == "binomial":
        return b + math.ceil(math.log2(n)) - 1 if n & (n - 1) else b + n.bit_length() - 2
    if scheme == "chain":
        return b + n - 2
    if scheme == "sequential":
        return b * (n - 1)
    if scheme == "tree":
        return 2 * b + 2 * (n.bit_length() - 1)
    raise ConfigError(f"scheme={scheme!r} is unknown; pick one of {', '.join(SCHEMES)}")


def plan(nodes: int, blocks: int, sources: int = 1, scheme: str = "binomial") -> Schedule:
    """The multicast schedule of ``blocks`` blocks from nodes ``0..sources-1`` to all ``nodes``."""
    _check_args(nodes, blocks, sources, scheme)
    groups = split_groups(nodes, sources)
    orders = block_orders(blocks, sources)
    steps: list[list[Transfer]] = []
    for members, order in zip(groups, orders, strict=True):
        local = _local_schedule(scheme, len(members), blocks)
        while len(steps) < len(local):
            steps.append([])
        for t, step in enumerate(local):
            steps[t].extend(Transfer(members[s], members[d], order[p]) for s, d, p in step)
    return Schedule(
        nodes=nodes,
        blocks=blocks,
        sources=sources,
        scheme=scheme,
        steps=tuple(tuple(s) for s in steps),
        groups=tuple(tuple(g) for g in groups),
        orders=tuple(tuple(o) for o in orders),
    )


@lru_cache(maxsize=64)
def _local_schedule(scheme: str, n: int, b: int) -> _Local:
    """One group's schedule in local ids (0 = the group's source) and block positions."""
    if n <= 1:
        return ()
    if scheme == "binomial":
        return _binomial(n, b)
    if scheme == "chain":
        return tuple(
            tuple((i, i + 1, t - i) for i in range(n - 1) if 0 <= t - i < b) for t in range(b + n - 2)
        )
    if scheme == "sequential":
        return tuple(((0, 1 + t // b, t % b),) for t in range(b * (n - 1)))
    return _tree(n, b)


def _tree(n: int, b: int) -> _Local:
    """Binary tree, each node forwarding block by block, first to its left then its right child."""
    have_from = [0] * n  # blocks reach a node in order: it holds positions < have_from[i]
    have_from[0] = b
    cursor = [0] * n  # index into the node's send queue: (block p, child c) in order p, then child
    kids = [[c for c in (2 * i + 1, 2 * i + 2) if c < n] for i in range(n)]
    steps: list[tuple[tuple[int, int, int], ...]] = []
    while any(have_from[i] < b for i in range(n)):
        step = []
        for i in range(n):
            if not kids[i] or cursor[i] >= b * len(kids[i]):
                continue
            p, c = divmod(cursor[i], len(kids[i]))
            if p < have_from[i]:
                step.append((i, kids[i][c], p))
                cursor[i] += 1
        for _, d, _p in step:
            have_from[d] += 1
        steps.append(tuple(step))
    return tuple(steps)


def _rotate_right(x: int, d: int, width: int) -> int:
    mask = (1 << width) - 1
    return ((x >> d) | (x << (width - d))) & mask


def _hypercube_block(receiver: int, t: int, dims: int, b: int) -> int | None:
    """Position of the block that corner ``receiver`` gets at step ``t`` of the hypercube pipeline.

    Seen from the receiver, rotated right by the step's dimension ``d``: the source's partner
    (rotated id 1) gets the source's newest block ``min(t, B-1)``; a receiver whose rotated id is
    even gets the block that entered the cube ``dims`` steps ago (``t - dims``); otherwise, with
    ``i`` the lowest set bit above bit 0 of the rotated id, it gets ``min(t - (dims - i), B-1)``.
    Negative positions mean nothing is sent yet. Nobody sends to the source (receiver 0).
    """
    if receiver == 0:
        return None
    r = _rotate_right(receiver, t % dims, dims)
    if r == 1:
        return min(t, b - 1)
    if not r & 1:
        return t - dims if t >= dims else None
    i = ((r >> 1) & -(r >> 1)).bit_length()  # position of the lowest set bit above bit 0
    return min(t - (dims - i), b - 1) if t >= dims - i else None


def _hypercube(dims: int, b: int) -> tuple[list[list[int | None]], list[list[int | None]]]:
    """Per corner and step: the block position it receives (``inn``) and sends (``out``)."""
    corners, steps = 1 << dims, b + dims - 1
    inn: list[list[int | None]] = [[None] * steps for _ in range(corners)]
    out: list[list[int | None]] = [[None] * steps for _ in range(corners)]
    for t in range(steps):
        bit = 1 << (t % dims)
        for w in range(1, corners):
            p = _hypercube_block(w, t, dims, b)
            if p is not None:
                inn[w][t] = p
                out[w ^ bit][t] = p
    return inn, out


def _binomial(n: int, b: int) -> _Local:
    dims = n.bit_length() - 1
    corners = 1 << dims
    inn, out = _hypercube(dims, b)
    steps = b + dims - 1
    if corners == n:
        return tuple(
            tuple((w ^ (1 << (t % dims)), w, inn[w][t]) for w in range(1, corners) if inn[w][t] is not None)  # type: ignore[misc]
            for t in range(steps)
        )
    # Twins: corner v (1 <= v <= n - corners) is played by nodes v and v + corners - 1.
    recv_node = [[w] * (steps + 1) for w in range(corners)]
    send_node = [[w] * (steps + 1) for w in range(corners)]
    internal: list[list[tuple[int, int, int]]] = [[] for _ in range(steps + 1)]
    for v in range(1, n - corners + 1):
        pair = (v, v + corners - 1)
        for t, (snd, rcv, moves) in enumerate(_twin_roles(inn[v], out[v], b)):
            send_node[v][t] = pair[snd]
            recv_node[v][t] = pair[rcv]
            internal[t].extend((pair[x], pair[1 - x], p) for x, p in moves)
    result = []
    for t in range(steps + 1):
        step = list(internal[t])
        if t < steps:
            bit = 1 << (t % dims)
            for w in range(1, corners):
                p = inn[w][t]
                if p is not None:
                    step.append((send_node[w ^ bit][t], recv_node[w][t], p))
        result.append(tuple(step))
    return tuple(result)


def _twin_roles(
    inn: Sequence[int | None], out: Sequence[int | None], b: int
) -> list[tuple[int, int, list[tuple[int, int]]]]:
    """How two twins play one hypercube corner, one step longer than the corner's schedule.

    Per step: which twin (0 or 1) sends the corner's outgoing block, which one receives its
    incoming block, and the moves ``(from_twin, position)`` between the twins on the ports left
    free. With both an outgoing and an incoming block, the twin that sends outward must be the one
    that receives the move (the other twin's ports are taken by the incoming block and the move),
    so each step comes down to one choice, the twin ``y`` that receives the move: it sends the
    outgoing block (it must hold it), the other twin takes the incoming block and passes ``y`` the
    block it lacks that the corner must send soonest. Greedy: a useful move first, then the most
    urgent one. In the extra last step both twins are idle and swap. Checked, not proved: it
    completes for every corner of every cube up to 2^10 corners and every B <= 64 (so for every
    N < 2048); it raises rather than return a wrong plan.
    """
    steps = len(inn)
    uses: dict[int, list[int]] = {}
    for t, p in enumerate(out):
        if p is not None:
            uses.setdefault(p, []).append(t)
    never = steps + 1

    def urgent(mask: int, t: int) -> tuple[int, int]:
        """(next step the corner sends it, position) of the most urgent block in ``mask``."""
        best = (never, b)
        while mask:
            low = mask & -mask
            mask ^= low
            p = low.bit_length() - 1
            use = uses.get(p)
            nxt = never
            if use:
                k = bisect_right(use, t)
                if k < len(use):
                    nxt = use[k]
            if (nxt, p) < best:
                best = (nxt, p)
        return best

    held = [0, 0]
    roles: list[tuple[int, int, list[tuple[int, int]]]] = []
    for t in range(steps):
        o, i_ = out[t], inn[t]
        choice: tuple[tuple[int, int, int], int] | None = None
        for y in (0, 1):
            if o is not None and not held[y] >> o & 1:
                continue
            useful = held[1 - y] & ~held[y]
            nxt, p = urgent(useful, t) if useful else (never, b)
            key = (0 if useful else 1, nxt, p)
            if choice is None or key < choice[0]:
                choice = (key, y)
        if choice is None:  # neither twin holds the block to send: the construction failed
            raise AssertionError(f"twin construction stuck at step {t} (in={list(inn)}, out={list(out)})")
        (has_none, _nxt, p), y = choice
        moves = [] if has_none else [(1 - y, p)]
        roles.append((y, 1 - y, moves))
        if i_ is not None:
            held[1 - y] |= 1 << i_
        if moves:
            held[y] |= 1 << p
    last = [(x, urgent(held[x] & ~held[1 - x], steps)[1]) for x in (0, 1) if held[x] & ~held[1 - x]]
    roles.append((0, 0, last))
    for x, p in last:
        held[1 - x] |= 1 << p
    full = (1 << b) - 1
    if held != [full, full]:
        raise AssertionError(f"twin construction left blocks behind (in={list(inn)}, out={list(out)})")
    return roles
