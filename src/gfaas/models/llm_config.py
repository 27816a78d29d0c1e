"""The shape of a Llama-style decoder: a frozen config, named presets and the tensor layout.

The layout (tensor names, shapes, which block holds which tensor) is a pure function of the config
and the block count, so a node that receives a packed block can check it against what it expects
before using a single byte of it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from ..errors import ConfigError

#: Storage dtypes of the weights. Compute is always float32; float16 halves the bytes on the wire.
DTYPES = ("float32", "float16")


@dataclass(frozen=True)
class LlamaConfig:
    """A decoder-only Llama-style transformer (Touvron et al. 2023): pre-RMSNorm, rotary positions,
    grouped KV heads, SwiGLU MLP, untied LM head.

    Fields: ``vocab`` tokens; ``dim`` model width; ``n_layers`` decoder layers; ``n_heads`` query
    heads (``dim`` divisible by it, head width even for the rotary pairs); ``n_kv_heads`` key/value
    heads (dividing ``n_heads``: each serves ``n_heads // n_kv_heads`` query heads); ``hidden`` SwiGLU
    width; ``max_seq`` longest sequence (prompt plus generated tokens); ``rope_theta`` the rotary base;
    ``norm_eps`` RMSNorm's epsilon; ``dtype`` the weights' storage dtype.
    """

    vocab: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    hidden: int
    max_seq: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    dtype: str = "float32"

    def __post_init__(self) -> None:
        for name in ("vocab", "dim", "n_layers", "n_heads", "n_kv_heads", "hidden", "max_seq"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"LlamaConfig.{name}={v!r}: must be an integer >= 1")
        if self.vocab < 2:
            raise ConfigError(f"LlamaConfig.vocab={self.vocab}: greedy decoding needs at least 2 tokens")
        if self.dim % self.n_heads:
            raise ConfigError(f"LlamaConfig.dim={self.dim} is not divisible by n_heads={self.n_heads}; "
                              f"choose n_heads dividing dim")
        if self.head_dim % 2:
            raise ConfigError(f"LlamaConfig head width dim/n_heads={self.head_dim} is odd; rotary embeddings "
                              f"rotate pairs of channels, so choose dim/n_heads even")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"LlamaConfig.n_kv_heads={self.n_kv_heads} does not divide n_heads={self.n_heads}; "
                              f"each KV head must serve a whole group of query heads")
        if not self.rope_theta > 0:
            raise ConfigError(f"LlamaConfig.rope_theta={self.rope_theta!r}: must be > 0")
        if not self.norm_eps > 0:
            raise ConfigError(f"LlamaConfig.norm_eps={self.norm_eps!r}: must be > 0")
        if self.dtype not in DTYPES:
            raise ConfigError(f"LlamaConfig.dtype={self.dtype!r}: must be one of {', '.join(DTYPES)}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def itemsize(self) -> int:
        return 4 if self.dtype == "float32" else 2

    def digest(self) -> bytes:
        """32 bytes identifying the architecture (every field): packed blocks carry it, and a block
        packed for another config is refused."""
        text = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).digest()


PRESETS: dict[str, LlamaConfig] = {
    # Tests: a forward pass in well under a millisecond.
    "tiny": LlamaConfig(vocab=96, dim=32, n_layers=4, n_heads=4, n_kv_heads=2, hidden=96, max_seq=128),
    "small": LlamaConfig(vocab=1024, dim=128, n_layers=8, n_heads=8, n_kv_heads=2, hidden=352, max_seq=512),
    "medium": LlamaConfig(vocab=8192, dim=512, n_layers=8, n_heads=8, n_kv_heads=2, hidden=1408, max_seq=1024),
    # Demo: GPT-2-small-sized (about 125M parameters, 3 query heads per KV head); 500 MB in float32.
    "demo": LlamaConfig(vocab=32000, dim=768, n_layers=12, n_heads=12, n_kv_heads=4, hidden=2048, max_seq=1024),
    "demo-half": LlamaConfig(vocab=32000, dim=768, n_layers=12, n_heads=12, n_kv_heads=4, hidden=2048,
                             max_seq=1024, dtype="float16"),
}


def preset(name: str) -> LlamaConfig:
    """A named config (``tiny``, ``small``, ``medium``, ``demo``, ``demo-half``)."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown LLM preset {name!r}; choose one of {', '.join(PRESETS)}") from None


def layer_shapes(cfg: LlamaConfig, layer: int) -> dict[str, tuple[int, ...]]:
    """The tensors of one decoder layer. Linear weights are stored [in, out] (``x @ w``)."""
    p, d, hd = f"layers.{layer}.", cfg.dim, cfg.head_dim
    return {
        p + "attention_norm": (d,),
        p + "wq": (d, cfg.n_heads * hd),
        p + "wk": (d, cfg.n_kv_heads * hd),
        p + "wv": (d, cfg.n_kv_heads * hd),
        p + "wo": (cfg.n_heads * hd, d),
        p + "ffn_norm": (d,),
        p + "w1": (d, cfg.hidden),  # gate
        p + "w3": (d, cfg.hidden),  # up
        p + "w2": (cfg.hidden, d),  # down
    }


def split_layers(n_layers: int, num_blocks: int) -> list[range]:
    """Balanced blocks of whole layers: the first ``n_layers % num_blocks`` blocks get one extra."""
    if not isinstance(num_blocks, int) or not 1 <= num_blocks <= n_layers:
        raise ConfigError(f"num_blocks={num_blocks!r}: must be between 1 and the layer count {n_layers} "
                          f"(a block holds whole layers)")
    base, extra = divmod(n_layers, num_blocks)
    out, start = [], 0
    for b in range(num_blocks):
        n = base + (1 if b < extra else 0)
        out.append(range(start, start + n))
        start += n
    return out


def block_shapes(cfg: LlamaConfig, index: int, num_blocks: int) -> dict[str, tuple[int, ...]]:
    """The tensors of block ``index`` of ``num_blocks``, in packing order: block 0 also holds the token
    embedding, the last block also the final norm and the LM head."""
    layers = split_layers(cfg.n_layers, num_blocks)
    if not isinstance(index, int) or not 0 <= index < num_blocks:
        raise ConfigError(f"block index {index!r}: must be in 0..{num_blocks - 1}")
    shapes: dict[str, tuple[int, ...]] = {}
    if index == 0:
        shapes["tok_embeddings"] = (cfg.vocab, cfg.dim)
    for layer in layers[index]:
        shapes.update(layer_shapes(cfg, layer))
    if index == num_blocks - 1:
        shapes["norm"] = (cfg.dim,)
        shapes["output"] = (cfg.dim, cfg.vocab)
    return shapes


def param_count(cfg: LlamaConfig) -> int:
    """Number of parameters (embedding and LM head are separate tensors)."""
    total = 0
    for shape in block_shapes(cfg, 0, 1).values():
        n = 1
        for s in shape:
            n *= s
        total += n
    return total
