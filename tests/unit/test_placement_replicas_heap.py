"""``place_replicas(layout="pack")`` keeps the nodes a replica fits on in a heap: the same nodes, in
the same order, as taking ``min`` over every fitting node per replica (the rule as first written)."""

import random

from gfaas.policy.placement import group_nodes, place_replicas


def _reference(functions: list[str], edges: list[tuple[str, str, int]], replicas: int, slots: dict[int, int],
               used: dict[int, int]) -> list[dict[str, int]]:
    taken = dict.fromkeys(slots, 0)
    taken.update(used)
    nodes = sorted(nd for nd, n in slots.items() if n > 0)
    f = len(functions)

    def load(nd: int) -> tuple[float, int]:
        return taken[nd] / slots[nd], nd

    out = []
    biggest = max(slots[nd] for nd in nodes)
    for _ in range(replicas):
        fits = [nd for nd in nodes if slots[nd] - taken[nd] >= f]
        if fits:
            nd = min(fits, key=load)
            placed = dict.fromkeys(functions, nd)
        elif f > biggest:
            free = {nd: max(0, slots[nd] - taken[nd]) for nd in nodes}
            if sum(free.values()) < f:
                k = -(-f // sum(slots[nd] for nd in nodes))
                free = {nd: slots[nd] * k for nd in nodes}
            placed = group_nodes(functions, edges, free)
        else:
            nd = min((nd for nd in nodes if slots[nd] >= f), key=load)
            placed = dict.fromkeys(functions, nd)
        for nd in placed.values():
            taken[nd] += 1
        out.append(placed)
    return out


def test_pack_matches_min_per_replica() -> None:
    rng = random.Random(3)
    for _ in range(400):
        nf = rng.randint(1, 5)
        functions = [f"f{i}" for i in range(nf)]
        edges = [(functions[i], functions[i + 1], rng.randint(0, 10)) for i in range(nf - 1)]
        slots = {nd: rng.choice([0, 1, 2, 3, 4, 8]) for nd in rng.sample(range(20), rng.randint(1, 12))}
        if not any(slots.values()):
            slots[next(iter(slots))] = 4
        used = {nd: rng.randint(0, n) for nd, n in slots.items() if rng.random() < 0.5}
        replicas = rng.randint(1, 40)
        got = place_replicas(functions, edges, replicas, slots, used=used)
        assert got == _reference(functions, edges, replicas, slots, used), (functions, slots, used, replicas)
