"""The torch executor of a Llama-style stage (the ``torch`` extra; a CUDA GPU for ``device="cuda"``).

Same math, tensor layout, KV-cache export format and stage interface as the numpy
:class:`~gfaas.models.llm.LlamaStage`, so :func:`~gfaas.models.llm.generate` drives either and a
request's :class:`~gfaas.models.llm.RequestState` moves between them. Hidden states cross stage
boundaries as numpy arrays (they go over sockets anyway); the KV cache stays on the device and is
pre-allocated at ``max_seq`` per request, since its size is known when the request arrives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import ConfigError, require_extra
from .llm import RequestState
from .llm_blocks import unpack_blocks
from .llm_config import LlamaConfig, block_shapes, split_layers
from .llm_ops import rope_tables


def _torch() -> Any:
    return require_extra("torch", "torch")


class TorchStage:
    """Blocks ``first..last`` of a model split into ``num_blocks``, run by torch on ``device``."""

    def __init__(self, cfg: LlamaConfig, num_blocks: int, blocks: Mapping[int, Mapping[str, np.ndarray]],
                 device: str = "cuda") -> None:
        torch = _torch()
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"device {device!r}: torch sees no CUDA GPU; use device='cpu' or the numpy LlamaStage")
        order = sorted(blocks)
        if not order or order != list(range(order[0], order[-1] + 1)):
            raise ConfigError(f"a stage runs a non-empty contiguous range of blocks, got {order}")
        ranges = split_layers(cfg.n_layers, num_blocks)
        self.cfg, self.num_blocks, self.device = cfg, num_blocks, device
        self.first, self.last = order[0], order[-1]
        self.layers = range(ranges[self.first].start, ranges[self.last].stop)
        self._t = torch
        self._w: dict[str, Any] = {}
        for b in order:
            want = block_shapes(cfg, b, num_blocks)
            if set(blocks[b]) != set(want):
                raise ConfigError(f"block {b}/{num_blocks} does not have the tensors of this config")
            for name, arr in blocks[b].items():
                self._w[name] = torch.tensor(np.asarray(arr, dtype=np.float32), device=device)
        cos, sin = rope_tables(cfg.head_dim, cfg.max_seq, cfg.rope_theta)
        self._cos, self._sin = torch.tensor(cos, device=device), torch.tensor(sin, device=device)
        self._caches: dict[object, list[Any]] = {}  # request -> [k, v, length]

    @classmethod
    def from_packed(cls, cfg: LlamaConfig, buffers: Sequence[bytes | bytearray | memoryview],
                    device: str = "cuda") -> TorchStage:
        _torch()  # the missing extra is named before any buffer is read
        blocks, count = unpack_blocks(buffers, cfg)  # the numpy stage's checks, duplicates included
        return cls(cfg, count, blocks, device)

    @property
    def is_first(self) -> bool:
        return self.first == 0

    @property
    def is_last(self) -> bool:
        return self.last == self.num_blocks - 1

    def cached_len(self, request_id: object) -> int:
        c = self._caches.get(request_id)
        return int(c[2]) if c else 0

    def release(self, request_id: object) -> None:
        self._caches.pop(request_id, None)

    def _new_cache(self, request_id: object) -> list[Any]:
        cfg = self.cfg
        shape = (len(self.layers), cfg.n_kv_heads, cfg.max_seq, cfg.head_dim)
        c = [self._t.zeros(shape, device=self.device), self._t.zeros(shape, device=self.device), 0]
        self._caches[request_id] = c
        return c

    def forward(self, request_id: object, x: np.ndarray | Sequence[int], last_only: bool = False) -> np.ndarray:
        """As :meth:`gfaas.models.llm.LlamaStage.forward`."""
        torch, cfg, w = self._t, self.cfg, self._w
        if self.is_first:
            ids = np.asarray(x)
            if ids.ndim != 1 or ids.size == 0 or ids.min() < 0 or ids.max() >= cfg.vocab:
                raise ConfigError(f"the first stage takes 1-D token ids in 0..{cfg.vocab - 1}")
            h = w["tok_embeddings"][torch.as_tensor(ids, device=self.device, dtype=torch.long)]
        else:
            h = torch.as_tensor(np.asarray(x, dtype=np.float32), device=self.device)
        t = h.shape[0]
        c = self._caches.get(request_id) or self._new_cache(request_id)
        start = c[2]
        if start + t > cfg.max_seq:
            raise ConfigError(f"request {request_id!r}: {start} + {t} tokens exceed max_seq={cfg.max_seq}")
        cos, sin = self._cos[start:start + t, None, :], self._sin[start:start + t, None, :]
        hd, kvh, g = cfg.head_dim, cfg.n_kv_heads, cfg.n_heads // cfg.n_kv_heads

        def norm(v: Any, weight: Any) -> Any:
            return v / torch.sqrt(torch.mean(v * v, dim=-1, keepdim=True) + cfg.norm_eps) * weight

        def rope(v: Any) -> Any:
            out = torch.empty_like(v)
            out[..., 0::2] = v[..., 0::2] * cos - v[..., 1::2] * sin
            out[..., 1::2] = v[..., 0::2] * sin + v[..., 1::2] * cos
            return out

        future = None
        if t > 1:
            future = torch.arange(start + t, device=self.device)[None, :] > (
                start + torch.arange(t, device=self.device))[:, None]
        with torch.no_grad():
            for i, layer in enumerate(self.layers):
                p = f"layers.{layer}."
                xn = norm(h, w[p + "attention_norm"])
                q = rope((xn @ w[p + "wq"]).reshape(t, cfg.n_heads, hd))
                c[0][i, :, start:start + t] = rope((xn @ w[p + "wk"]).reshape(t, kvh, hd)).transpose(0, 1)
                c[1][i, :, start:start + t] = (xn @ w[p + "wv"]).reshape(t, kvh, hd).transpose(0, 1)
                k, v = c[0][i, :, :start + t], c[1][i, :, :start + t]
                q4 = q.reshape(t, kvh, g, hd).permute(1, 2, 0, 3)
                s = torch.matmul(q4, k.transpose(1, 2)[:, None]) / float(np.sqrt(hd))
                if future is not None:
                    s = s.masked_fill(future, float("-inf"))
                a = torch.matmul(torch.softmax(s, dim=-1), v[:, None]).permute(2, 0, 1, 3).reshape(t, -1)
                h = h + a @ w[p + "wo"]
                xn = norm(h, w[p + "ffn_norm"])
                h = h + (torch.nn.functional.silu(xn @ w[p + "w1"]) * (xn @ w[p + "w3"])) @ w[p + "w2"]
            c[2] = start + t
            if self.is_last:
                if last_only:
                    h = h[-1:]
                h = norm(h, w["norm"]) @ w["output"]
        return np.asarray(h.float().cpu().numpy())

    def export_kv(self, request_id: object) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        c = self._caches.get(request_id) or self._new_cache(request_id)
        n = c[2]
        return {layer: (c[0][i, :, :n].cpu().numpy().copy(), c[1][i, :, :n].cpu().numpy().copy())
                for i, layer in enumerate(self.layers)}

    def import_kv(self, request_id: object, state: RequestState) -> None:
        missing = [layer for layer in self.layers if layer not in state.kv]
        if missing:
            raise ConfigError(f"request state lacks the KV cache of layers {missing} that this stage runs")
        n = state.cached
        if n > self.cfg.max_seq:
            raise ConfigError(f"request state caches {n} tokens, more than max_seq={self.cfg.max_seq}")
        c = self._new_cache(request_id)
        for i, layer in enumerate(self.layers):
            k, v = state.kv[layer]
            c[0][i, :, :n] = self._t.as_tensor(k, device=self.device)
            c[1][i, :, :n] = self._t.as_tensor(v, device=self.device)
        c[2] = n
