"""A Llama-style decoder with seeded random weights, split into blocks of whole layers.

* :func:`random_block` draws a block's weights; every tensor has its own generator seeded by
  (seed, tensor name), so a block is the same whichever split it comes from and a node can draw only
  the blocks it needs.
* :class:`LlamaStage` runs a contiguous range of blocks with its own per-request KV cache: the first
  block takes token ids, the last returns logits, the others pass hidden states [T, dim] on.
  :class:`LlamaModel` is the stage that holds every block.
* :func:`generate` decodes greedily through a chain of stages (one stage: local execution; several:
  an execution pipeline).
* :class:`RequestState` is what a request carries when it moves: its tokens so far and, per layer,
  the KV cache of the tokens already processed; stages export and import their layers' part, so a
  request decoded by a pipeline can continue on a node that has since received the whole model.

Weights are outputs of a random generator: the text is meaningless, the compute and bytes are real.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..errors import ConfigError, ProtocolError
from .llm_blocks import aligned_buffer, pack_block, packed_size, unpack_block, unpack_blocks
from .llm_config import PRESETS, LlamaConfig, block_shapes, param_count, preset, split_layers
from .llm_ops import apply_rope, attention, rmsnorm, rope_tables, swiglu

__all__ = [
    "PRESETS",
    "LlamaConfig",
    "LlamaModel",
    "LlamaStage",
    "RequestState",
    "Stage",
    "aligned_buffer",
    "block_shapes",
    "generate",
    "pack_block",
    "packed_size",
    "param_count",
    "preset",
    "random_block",
    "random_blocks",
    "split_layers",
    "unpack_block",
]


def _init_std(cfg: LlamaConfig, name: str) -> float:
    """Scaled init: unit-variance projections of a normalised input; the two projections that write
    into the residual stream are further scaled by 1/sqrt(2 * layers) (GPT-2's rule), so the stream's
    variance grows by a bounded factor over the depth instead of with the layer count."""
    kind = name.rsplit(".", 1)[-1]
    residual = 1.0 / math.sqrt(2 * cfg.n_layers)
    return {
        "tok_embeddings": 1.0,
        "wq": 1 / math.sqrt(cfg.dim), "wk": 1 / math.sqrt(cfg.dim), "wv": 1 / math.sqrt(cfg.dim),
        "wo": residual / math.sqrt(cfg.n_heads * cfg.head_dim),
        "w1": 1 / math.sqrt(cfg.dim), "w3": 1 / math.sqrt(cfg.dim),
        "w2": residual / math.sqrt(cfg.hidden),
        "output": 1 / math.sqrt(cfg.dim),
    }[kind]


def random_block(cfg: LlamaConfig, seed: int, index: int, num_blocks: int) -> dict[str, np.ndarray]:
    """The weights of block ``index`` of ``num_blocks`` in the config's storage dtype, drawn from the
    seed and each tensor's name (drawn in float32, then rounded once for float16 storage, so that a
    model built here and one unpacked from packed blocks hold the same values)."""
    out: dict[str, np.ndarray] = {}
    for name, shape in block_shapes(cfg, index, num_blocks).items():
        if name.endswith("norm"):
            out[name] = np.ones(shape, dtype=cfg.dtype)
            continue
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        w = rng.standard_normal(shape, dtype=np.float32)
        w *= np.float32(_init_std(cfg, name))
        out[name] = w if cfg.dtype == "float32" else w.astype(cfg.dtype)
    return out


def random_blocks(cfg: LlamaConfig, seed: int, num_blocks: int) -> list[bytes]:
    """Every block of the model, packed (:func:`gfaas.models.llm_blocks.pack_block`)."""
    return [pack_block(cfg, b, num_blocks, random_block(cfg, seed, b, num_blocks)) for b in range(num_blocks)]


@dataclass
class RequestState:
    """A request's decoding state: ``tokens`` (prompt and generated so far) and ``kv``, per layer, the
    keys and values ([n_kv_heads, cached, head_dim] each, float32) of the first ``cached`` tokens.
    After greedy step i the last token has not been fed yet, so ``cached == len(tokens) - 1``."""

    tokens: list[int]
    kv: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    @property
    def cached(self) -> int:
        lengths = {k.shape[1] for k, _ in self.kv.values()} | {v.shape[1] for _, v in self.kv.values()}
        if len(lengths) > 1:
            raise ConfigError(f"request state has KV caches of different lengths {sorted(lengths)}")
        return lengths.pop() if lengths else 0

    @classmethod
    def merge(cls, tokens: Sequence[int], parts: Sequence[Mapping[int, tuple[np.ndarray, np.ndarray]]]
              ) -> RequestState:
        """One state from the KV parts exported by the stages of a pipeline."""
        kv: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for part in parts:
            overlap = set(kv) & set(part)
            if overlap:
                raise ConfigError(f"two stages exported the KV cache of layers {sorted(overlap)}")
            kv.update(part)
        return cls(list(tokens), kv)

    def to_bytes(self, cfg: LlamaConfig) -> bytes:
        """A flat encoding for moving the state between processes: u32 count, tokens (u32 each), u32
        layer count, u32 cached, then per layer its index (u32) and k, v (float32, C order)."""
        cached = self.cached
        head = np.array([len(self.tokens), *self.tokens, len(self.kv), cached], dtype="<u4").tobytes()
        body = [np.array([layer], dtype="<u4").tobytes() + np.ascontiguousarray(k, "<f4").tobytes()
                + np.ascontiguousarray(v, "<f4").tobytes() for layer, (k, v) in sorted(self.kv.items())]
        for layer, (k, v) in self.kv.items():
            want = (cfg.n_kv_heads, cached, cfg.head_dim)
            if k.shape != want or v.shape != want or not 0 <= layer < cfg.n_layers:
                raise ConfigError(f"layer {layer} KV of shapes {k.shape}/{v.shape} does not fit the config {want}")
        return head + b"".join(body)

    @classmethod
    def from_bytes(cls, buf: bytes, cfg: LlamaConfig) -> RequestState:
        """The inverse of :meth:`to_bytes` (copies; checks every length against ``cfg``)."""
        words = len(buf) // 4
        if len(buf) % 4 or words < 3:
            raise ProtocolError(f"request state of {len(buf)} bytes is truncated or not word-aligned")
        u = np.frombuffer(buf, dtype="<u4")
        n_tok = int(u[0])
        if n_tok + 3 > words:
            raise ProtocolError(f"request state lists {n_tok} tokens but holds {len(buf)} bytes")
        tokens = [int(t) for t in u[1:1 + n_tok]]
        n_layers, cached = int(u[1 + n_tok]), int(u[2 + n_tok])
        per = cfg.n_kv_heads * cached * cfg.head_dim
        if (n_layers > cfg.n_layers or cached > cfg.max_seq or (n_layers == 0 and cached != 0)
                or words != 3 + n_tok + n_layers * (1 + 2 * per)):
            raise ProtocolError(f"request state of {len(buf)} bytes does not hold {n_layers} layers of "
                                f"{cached} cached tokens for this config")
        kv: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        pos = 3 + n_tok
        shape = (cfg.n_kv_heads, cached, cfg.head_dim)
        f = np.frombuffer(buf, dtype="<f4")
        for _ in range(n_layers):
            layer = int(u[pos])
            if not 0 <= layer < cfg.n_layers or layer in kv:
                raise ProtocolError(f"request state names layer {layer} twice or out of 0..{cfg.n_layers - 1}")
            k = f[pos + 1:pos + 1 + per].reshape(shape).copy()
            v = f[pos + 1 + per:pos + 1 + 2 * per].reshape(shape).copy()
            kv[layer] = (k, v)
            pos += 1 + 2 * per
        return cls(tokens, kv)


class Stage(Protocol):
    """What :func:`generate` needs of a stage: the numpy :class:`LlamaStage` and the torch
    :class:`gfaas.models.llm_torch.TorchStage` both provide it."""

    first: int
    last: int

    @property
    def is_first(self) -> bool: ...

    @property
    def is_last(self) -> bool: ...

    def cached_len(self, request_id: object) -> int: ...

    def forward(self, request_id: object, x: np.ndarray, last_only: bool = False) -> np.ndarray: ...


class _Cache:
    """One request's keys and values for a stage's layers: [layers, KV, capacity, hd], grown by
    doubling (up to max_seq) so that decoding appends in place."""

    def __init__(self, n_layers: int, cfg: LlamaConfig, capacity: int) -> None:
        shape = (n_layers, cfg.n_kv_heads, capacity, cfg.head_dim)
        self.k = np.zeros(shape, dtype=np.float32)
        self.v = np.zeros(shape, dtype=np.float32)
        self.length = 0

    def reserve(self, need: int, max_seq: int) -> None:
        cap = self.k.shape[2]
        if need <= cap:
            return
        new = min(max(need, 2 * cap), max_seq)
        for name in ("k", "v"):
            old = getattr(self, name)
            grown = np.zeros(old.shape[:2] + (new, old.shape[3]), dtype=np.float32)
            grown[:, :, :self.length] = old[:, :, :self.length]
            setattr(self, name, grown)


class LlamaStage:
    """Blocks ``first..last`` of a model split into ``num_blocks``, with a KV cache per request."""

    def __init__(self, cfg: LlamaConfig, num_blocks: int, blocks: Mapping[int, Mapping[str, np.ndarray]]) -> None:
        if not blocks:
            raise ConfigError("a stage needs at least one block")
        order = sorted(blocks)
        if order != list(range(order[0], order[-1] + 1)):
            raise ConfigError(f"a stage runs a contiguous range of blocks, got {order}")
        ranges = split_layers(cfg.n_layers, num_blocks)
        self.cfg, self.num_blocks = cfg, num_blocks
        self.first, self.last = order[0], order[-1]
        self.layers = range(ranges[self.first].start, ranges[self.last].stop)
        w: dict[str, np.ndarray] = {}
        for b in order:
            want = block_shapes(cfg, b, num_blocks)
            got = blocks[b]
            if set(got) != set(want) or any(got[n].shape != s for n, s in want.items()):
                raise ConfigError(f"block {b}/{num_blocks} does not have the tensors and shapes of this config")
            # float32 weights are used in place (zero copy from a packed buffer); float16 storage is
            # widened once here, since numpy has no fast float16 matmul.
            w.update({n: np.asarray(a, dtype=np.float32) for n, a in got.items()})
        self._w = w
        self._cos, self._sin = rope_tables(cfg.head_dim, cfg.max_seq, cfg.rope_theta)
        self._caches: dict[object, _Cache] = {}

    @classmethod
    def from_packed(cls, cfg: LlamaConfig, buffers: Sequence[bytes | bytearray | memoryview]) -> LlamaStage:
        """A stage over packed blocks (zero-copy for float32 storage); all from the same split."""
        blocks, count = unpack_blocks(buffers, cfg)
        return cls(cfg, count, blocks)

    @property
    def is_first(self) -> bool:
        return self.first == 0

    @property
    def is_last(self) -> bool:
        return self.last == self.num_blocks - 1

    def cached_len(self, request_id: object) -> int:
        """Tokens of ``request_id`` already processed by this stage (0 for an unknown request)."""
        c = self._caches.get(request_id)
        return c.length if c else 0

    def release(self, request_id: object) -> None:
        """Drop a finished request's KV cache."""
        self._caches.pop(request_id, None)

    def forward(self, request_id: object, x: np.ndarray | Sequence[int], last_only: bool = False) -> np.ndarray:
        """Process the next T tokens of a request: token ids [T] if this stage holds block 0, else
        hidden states [T, dim]. Returns logits [T, vocab] (or [1, vocab] with ``last_only``) if this
        stage holds the last block, else hidden states [T, dim]."""
        cfg = self.cfg
        if self.is_first:
            ids = np.asarray(x)
            if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
                raise ConfigError(f"the first stage takes a non-empty 1-D array of token ids, got {ids.dtype} "
                                  f"{ids.shape}")
            if ids.min() < 0 or ids.max() >= cfg.vocab:
                raise ConfigError(f"token ids must be in 0..{cfg.vocab - 1}, got {ids.min()}..{ids.max()}")
            h = self._w["tok_embeddings"][ids]
        else:
            h = np.asarray(x, dtype=np.float32)
            if h.ndim != 2 or h.shape[1] != cfg.dim or h.shape[0] == 0:
                raise ConfigError(f"stage {self.first}..{self.last} takes hidden states [T, {cfg.dim}], "
                                  f"got {h.shape}")
        t = h.shape[0]
        cache = self._caches.get(request_id)
        if cache is None:
            cache = self._caches[request_id] = _Cache(len(self.layers), cfg, min(cfg.max_seq, max(64, t)))
        start = cache.length
        if start + t > cfg.max_seq:
            raise ConfigError(f"request {request_id!r}: {start} + {t} tokens exceed max_seq={cfg.max_seq}")
        cache.reserve(start + t, cfg.max_seq)
        cos, sin = self._cos[start:start + t], self._sin[start:start + t]
        for i, layer in enumerate(self.layers):
            h = self._layer(h, layer, cache.k[i], cache.v[i], start, cos, sin)
        cache.length = start + t
        if not self.is_last:
            return h
        if last_only:
            h = h[-1:]
        return rmsnorm(h, self._w["norm"], cfg.norm_eps) @ self._w["output"]

    def _layer(self, h: np.ndarray, layer: int, kc: np.ndarray, vc: np.ndarray, start: int,
               cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        cfg, w, p = self.cfg, self._w, f"layers.{layer}."
        t, hd = h.shape[0], cfg.head_dim
        x = rmsnorm(h, w[p + "attention_norm"], cfg.norm_eps)
        q = apply_rope((x @ w[p + "wq"]).reshape(t, cfg.n_heads, hd), cos, sin)
        k = apply_rope((x @ w[p + "wk"]).reshape(t, cfg.n_kv_heads, hd), cos, sin)
        kc[:, start:start + t] = k.transpose(1, 0, 2)
        vc[:, start:start + t] = (x @ w[p + "wv"]).reshape(t, cfg.n_kv_heads, hd).transpose(1, 0, 2)
        a = attention(q, kc[:, :start + t], vc[:, :start + t], start)
        h = h + a @ w[p + "wo"]
        x = rmsnorm(h, w[p + "ffn_norm"], cfg.norm_eps)
        return h + swiglu(x, w[p + "w1"], w[p + "w3"], w[p + "w2"])

    def export_kv(self, request_id: object) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Copies of this stage's KV cache of ``request_id``, per layer ([KV, cached, hd] each)."""
        c = self._caches.get(request_id)
        if c is None:
            return {layer: (np.zeros((self.cfg.n_kv_heads, 0, self.cfg.head_dim), np.float32),) * 2
                    for layer in self.layers}
        return {layer: (c.k[i, :, :c.length].copy(), c.v[i, :, :c.length].copy())
                for i, layer in enumerate(self.layers)}

    def import_kv(self, request_id: object, state: RequestState) -> None:
        """Take this stage's layers' KV cache from ``state`` (a state may hold more layers)."""
        missing = [layer for layer in self.layers if layer not in state.kv]
        if missing:
            raise ConfigError(f"request state lacks the KV cache of layers {missing} that this stage runs")
        n = state.cached
        if n > self.cfg.max_seq:
            raise ConfigError(f"request state caches {n} tokens, more than max_seq={self.cfg.max_seq}")
        cache = _Cache(len(self.layers), self.cfg, min(self.cfg.max_seq, max(64, 2 * n)))
        want = (self.cfg.n_kv_heads, n, self.cfg.head_dim)
        for i, layer in enumerate(self.layers):
            k, v = state.kv[layer]
            if k.shape != want or v.shape != want:
                raise ConfigError(f"layer {layer} KV shapes {k.shape}/{v.shape}, expected {want}")
            cache.k[i, :, :n], cache.v[i, :, :n] = k, v
        cache.length = n
        self._caches[request_id] = cache


class LlamaModel(LlamaStage):
    """The whole model in one stage, weights drawn from ``seed``."""

    def __init__(self, cfg: LlamaConfig, seed: int = 0) -> None:
        self.seed = seed
        super().__init__(cfg, 1, {0: random_block(cfg, seed, 0, 1)})

    def pack(self, num_blocks: int) -> list[bytes]:
        """This model's weights as ``num_blocks`` packed blocks."""
        return [pack_block(self.cfg, b, num_blocks, {n: self._w[n] for n in block_shapes(self.cfg, b, num_blocks)})
                for b in range(num_blocks)]

    def generate(self, prompt: Sequence[int], n: int, request_id: object = None) -> list[int]:
        """Greedy decoding of ``n`` tokens after ``prompt`` (a fresh request unless ``request_id``
        names one already in progress); the request's cache is released afterwards."""
        rid = object() if request_id is None else request_id
        try:
            return generate([self], rid, prompt, n)
        finally:
            if request_id is None:
                self.release(rid)


def generate(stages: Sequence[Stage], request_id: object, tokens: Sequence[int], n: int) -> list[int]:
    """Greedy decoding of ``n`` more tokens through a chain of stages covering the whole model.

    ``tokens`` is the request's sequence so far; the stages' caches must already hold the same prefix
    of it (none for a new request, ``cached`` after importing a :class:`RequestState`), and the rest is
    fed first (the prefill). Returns the new tokens."""
    if not stages or not stages[0].is_first or not stages[-1].is_last:
        raise ConfigError("generate needs stages from the first block to the last")
    for a, b in zip(stages, stages[1:], strict=False):
        if b.first != a.last + 1:
            raise ConfigError(f"stages must be consecutive: blocks ..{a.last} then {b.first}..")
    cached = {s.cached_len(request_id) for s in stages}
    if len(cached) != 1:
        raise ConfigError(f"the stages disagree on the request's cached length: {sorted(cached)}")
    done = cached.pop()
    seq = list(tokens)
    if done >= len(seq) and n > 0:
        raise ConfigError(f"nothing to feed: {done} tokens cached of a {len(seq)}-token sequence")
    out: list[int] = []
    for _ in range(n):
        x: np.ndarray = np.asarray(seq[done:], dtype=np.int64)
        for s in stages:
            x = s.forward(request_id, x, last_only=True)
        done = len(seq)
        nxt = int(np.argmax(x[-1]))
        seq.append(nxt)
        out.append(nxt)
    return out
