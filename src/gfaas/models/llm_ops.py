"""The numpy kernels of the Llama-style decoder, vectorised over heads and positions (float32).

Each is a small function so that tests can hold it against an independent reference.
"""

from __future__ import annotations

import numpy as np


def rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis."""
    ms = np.mean(np.square(x), axis=-1, keepdims=True)
    return (x / np.sqrt(ms + np.float32(eps))) * weight


def rope_tables(head_dim: int, max_seq: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of angle p * theta^(-2i/head_dim) for positions p and pairs i: [max_seq, head_dim/2].

    Computed in float64 so that long positions keep their precision, then stored as float32."""
    inv = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ang = np.outer(np.arange(max_seq, dtype=np.float64), inv)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate channel pairs (2i, 2i+1) of x [T, heads, head_dim] by the angles of its T positions
    (``cos``/``sin`` [T, head_dim/2], already sliced to those positions); Meta's Llama pairing."""
    c, s = cos[:, None, :], sin[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int) -> np.ndarray:
    """Causal grouped-query attention of T new queries at positions start..start+T-1.

    q [T, H, hd]; k, v [KV, S, hd] with S = start + T cached keys (the new ones included). Query head h
    reads KV head h // (H // KV). Returns [T, H * hd]."""
    t, h, hd = q.shape
    kv, s, _ = k.shape
    g = h // kv
    q4 = q.reshape(t, kv, g, hd).transpose(1, 2, 0, 3)  # [KV, G, T, hd]
    scores = np.matmul(q4, k.transpose(0, 2, 1)[:, None]) * np.float32(1.0 / np.sqrt(hd))  # [KV, G, T, S]
    if t > 1:
        future = np.arange(s)[None, :] > (start + np.arange(t))[:, None]  # [T, S]
        scores = np.where(future, np.float32(-np.inf), scores)
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    out = np.matmul(p, v[:, None])  # [KV, G, T, hd]
    return out.transpose(2, 0, 1, 3).reshape(t, h * hd)


def swiglu(x: np.ndarray, w1: np.ndarray, w3: np.ndarray, w2: np.ndarray) -> np.ndarray:
    """(silu(x @ w1) * (x @ w3)) @ w2; sigmoid via tanh, which cannot overflow."""
    a = x @ w1
    return ((a * (0.5 * (1.0 + np.tanh(0.5 * a)))) * (x @ w3)) @ w2
