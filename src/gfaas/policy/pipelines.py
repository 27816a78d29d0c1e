"""Execution pipelines over partly loaded nodes (seed 002 §4.3, Algorithm 2).

While blocks are being multicast, a set of destination nodes that holds every block between them
can already serve: node ``j`` of the pipeline runs a consecutive range of blocks (layers) and
passes activations on to node ``j + 1``. :class:`PipelinePlanner` is driven by block arrivals
(:meth:`PipelinePlanner.on_blocks`) and answers with the changes they cause:

* ``local``: a node now holds the whole model and serves on its own from here on;
* ``retired``: a pipeline one of whose nodes went local is taken down; its other nodes return to
  the pool (the runtime moves their requests' state to the node that went local);
* ``formed``: a new pipeline. Following Algorithm 2, when idle nodes remain in several sub-groups,
  candidates are taken one per sub-group, at the same position in each (the nodes that received
  complementary blocks at the same time, since groups feed rotated block orders); when only one
  sub-group has idle nodes, the candidates are all of them. A pipeline forms from the candidates
  when they hold every block between them, with as few stages as possible
  (:func:`assign_stages`), and its ranges balanced so that the largest stage is as small as it
  can be.

Pure and deterministic: the same arrivals give the same changes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ..errors import ConfigError

if TYPE_CHECKING:
    from .multicast import Schedule

#: Branches the fewest-stages search may try per call before it keeps the best cover found so far.
SEARCH_BUDGET = 2_000
#: Nodes reaching equally far that the search tries at one position (the others differ only in
#: which node is left for later; with many candidates, trying them all would only burn the budget).
TIES = 3


@dataclass(frozen=True)
class Stage:
    """Node ``node`` runs blocks ``start .. stop - 1``."""

    node: int
    start: int
    stop: int


@dataclass(frozen=True)
class Pipeline:
    """A model-serving instance spread over several nodes, stages in block order."""

    id: int
    stages: tuple[Stage, ...]

    @property
    def nodes(self) -> tuple[int, ...]:
        return tuple(s.node for s in self.stages)


@dataclass(frozen=True)
class PipelineChange:
    """One planner decision: a pipeline ``formed`` or ``retired``, or a ``node`` gone ``local``."""

    step: int
    kind: Literal["formed", "retired", "local"]
    pipeline: Pipeline | None = None
    node: int | None = None


def _run_end(mask: int, pos: int) -> int:
    """First block at or after ``pos`` missing from ``mask``."""
    gaps = ~mask >> pos
    return pos + (gaps & -gaps).bit_length() - 1


def assign_stages(candidates: Sequence[int], holdings: Mapping[int, int], blocks: int) -> tuple[Stage, ...] | None:
    """Stages covering blocks ``0..blocks-1`` in order, each on a distinct candidate that holds its
    whole range; as few stages as possible, then the largest stage as small as possible. None if
    the candidates do not hold every block between them. ``holdings`` maps node -> bitmask.

    With a cap ``S`` on the blocks per stage, it is never worse to let a node run as far as it
    can (to the end of its run of held blocks, or ``S`` blocks) -- what is left to cover only
    shrinks -- so a depth-first search over "which unused node covers the next block" decides
    whether ``m`` stages of at most ``S`` blocks exist. Iterative deepening on ``m`` (from a
    lower bound that lets nodes serve twice) gives the fewest stages, then a binary search on
    ``S`` the balance. Exact for small candidate sets (checked against brute force); with many
    candidates the search tries at most :data:`TIES` equally far-reaching nodes per position and
    :data:`SEARCH_BUDGET` branches per call, then keeps the best cover found so far (the greedy
    one, furthest reach first, at worst).
    """
    full = (1 << blocks) - 1
    order = list(dict.fromkeys(candidates))
    masks = {n: holdings.get(n, 0) & full for n in order}
    union = 0
    for m in masks.values():
        union |= m
    if union != full:
        return None
    budget = [SEARCH_BUDGET]
    holders: dict[int, list[tuple[int, list[int]]]] = {}

    def reach(pos: int) -> list[tuple[int, list[int]]]:
        """Candidates holding ``pos`` grouped by the end of their run from there, furthest first."""
        if pos not in holders:
            by_end: dict[int, list[int]] = {}
            for n in order:
                if masks[n] >> pos & 1:
                    by_end.setdefault(min(_run_end(masks[n], pos), blocks), []).append(n)
            holders[pos] = sorted(by_end.items(), reverse=True)
        return holders[pos]

    def search(cap: int, depth: int) -> list[tuple[int, int]] | None:
        failed: set[tuple[int, frozenset[int], int]] = set()

        def dfs(pos: int, used: frozenset[int], left: int) -> list[tuple[int, int]] | None:
            if pos >= blocks:
                return []
            if left == 0 or budget[0] <= 0 or (pos, used, left) in failed:
                return None
            tried: dict[int, int] = {}
            for run_end, nodes in reach(pos):
                end = min(run_end, pos + cap)
                for n in nodes:
                    if tried.get(end, 0) >= TIES:
                        break
                    if n in used:
                        continue
                    tried[end] = tried.get(end, 0) + 1
                    budget[0] -= 1
                    rest = dfs(end, used | {n}, left - 1)
                    if rest is not None:
                        return [(n, pos), *rest]
            failed.add((pos, used, left))
            return None

        return dfs(0, frozenset(), depth)

    best = search(blocks, len(order))  # greedy first: the first branch of the search
    if best is None:
        return None
    for depth in range(_cover_lower_bound(order, masks, blocks), len(best)):
        found = search(blocks, depth)
        if found is not None:
            best = found
            break
    stages = len(best)
    low, high = -(-blocks // stages), _largest(best, blocks)
    while low < high and budget[0] > 0:
        mid = (low + high) // 2
        found = search(mid, stages)
        if found is None:
            low = mid + 1
        else:
            best, high = found, _largest(found, blocks)
    bounds = [pos for _, pos in best] + [blocks]
    return tuple(Stage(n, bounds[j], bounds[j + 1]) for j, (n, _) in enumerate(best))


def _largest(path: list[tuple[int, int]], blocks: int) -> int:
    bounds = [pos for _, pos in path] + [blocks]
    return max(b - a for a, b in itertools.pairwise(bounds))


def _cover_lower_bound(nodes: Sequence[int], holdings: Mapping[int, int], blocks: int) -> int:
    """Fewest runs covering every block when a node may serve twice (a lower bound)."""
    pos = count = 0
    while pos < blocks:
        pos = max(min(_run_end(holdings[n], pos), blocks) for n in nodes if holdings[n] >> pos & 1)
        count += 1
    return count


class PipelinePlanner:
    """Forms and retires execution pipelines as blocks arrive (see the module docstring).

    ``groups[i]`` lists the destination nodes of sub-group ``i`` in their group order (the sources
    hold the whole model from the start and serve locally, so they are not listed).
    """

    def __init__(self, groups: Sequence[Sequence[int]], blocks: int) -> None:
        if blocks < 1:
            raise ConfigError(f"blocks={blocks}: a model has at least 1 block; pass blocks >= 1")
        seen: set[int] = set()
        for g in groups:
            for n in g:
                if n in seen:
                    raise ConfigError(f"node {n} is listed in two sub-groups; give each node one group")
                seen.add(n)
        self.groups = tuple(tuple(g) for g in groups)
        self.blocks = blocks
        self._full = (1 << blocks) - 1
        self._held: dict[int, int] = dict.fromkeys(seen, 0)
        self._local: set[int] = set()
        self._active: dict[int, Pipeline] = {}
        self._member: dict[int, int] = {}  # node -> id of its pipeline
        self._next_id = 0

    @classmethod
    def for_schedule(cls, schedule: Schedule) -> PipelinePlanner:
        """A planner for a multicast schedule's sub-groups (their sources left out)."""
        return cls([g[1:] for g in schedule.groups], schedule.blocks)

    @property
    def active(self) -> tuple[Pipeline, ...]:
        return tuple(self._active[i] for i in sorted(self._active))

    @property
    def local(self) -> frozenset[int]:
        return frozenset(self._local)

    def holds(self, node: int) -> frozenset[int]:
        mask = self._held[node]
        return frozenset(b for b in range(self.blocks) if mask >> b & 1)

    def on_blocks(self, step: int, arrived: Mapping[int, Iterable[int]]) -> list[PipelineChange]:
        """Record blocks that reached nodes (usable from ``step`` on); return the changes."""
        for node, blks in arrived.items():
            if node not in self._held:
                raise ConfigError(f"node {node} is in no sub-group of this planner; list it in groups")
            for b in blks:
                if not 0 <= b < self.blocks:
                    raise ConfigError(f"block {b} at node {node} is out of range 0..{self.blocks - 1}")
                self._held[node] |= 1 << b
        changes: list[PipelineChange] = []
        for node in sorted(arrived):
            if self._held[node] == self._full and node not in self._local:
                self._local.add(node)
                pid = self._member.get(node)
                if pid is not None:
                    pipe = self._active.pop(pid)
                    for n in pipe.nodes:
                        del self._member[n]
                    changes.append(PipelineChange(step, "retired", pipeline=pipe))
                changes.append(PipelineChange(step, "local", node=node))
        changes.extend(self._form(step))
        return changes

    def _idle(self) -> list[list[int]]:
        return [[n for n in g if n not in self._local and n not in self._member] for g in self.groups]

    def _form(self, step: int) -> list[PipelineChange]:
        formed: list[PipelineChange] = []
        while True:
            avail = [g for g in self._idle() if g]
            if not avail:
                return formed
            if len(avail) == 1:
                batches = [avail[0]]
            else:
                width = min(len(g) for g in avail)
                batches = [[g[t] for g in avail] for t in range(width)]
            made = False
            for cand in batches:
                stages = assign_stages(cand, self._held, self.blocks)
                if stages is None:
                    continue
                pipe = Pipeline(self._next_id, stages)
                self._next_id += 1
                self._active[pipe.id] = pipe
                for n in pipe.nodes:
                    self._member[n] = pipe.id
                formed.append(PipelineChange(step, "formed", pipeline=pipe))
                made = True
            if not made:
                return formed


def pipeline_changes(schedule: Schedule) -> list[PipelineChange]:
    """Replay a multicast schedule through a :class:`PipelinePlanner`; blocks sent at step ``t``
    count from ``t + 1``, which is the step recorded in the changes."""
    planner = PipelinePlanner.for_schedule(schedule)
    changes: list[PipelineChange] = []
    for t, step in enumerate(schedule.steps):
        arrived: dict[int, list[int]] = {}
        for tr in step:
            arrived.setdefault(tr.dst, []).append(tr.block)
        changes.extend(planner.on_blocks(t + 1, arrived))
    return changes
