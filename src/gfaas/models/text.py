"""Text models: BERT-base (uncased) with a 2-class head, and GPT-2 small with a causal mask.

Weights follow the papers' init: normal(0, 0.02) everywhere, LayerNorm 1/0; GPT-2 additionally
scales its residual projections by 1/sqrt(2 * layers) (Radford et al. 2019, section 2.3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx

from .builder import GraphBuilder
from .signature import Signature

STD = 0.02


@dataclass(frozen=True)
class TextConfig:
    vocab: int
    hidden: int
    layers: int
    heads: int
    ffn: int
    max_positions: int
    seq_len: int  # default L of the example inputs and of ModelInfo.inputs


BERT = {
    "full": TextConfig(vocab=30522, hidden=768, layers=12, heads=12, ffn=3072, max_positions=512, seq_len=128),
    "small": TextConfig(vocab=1000, hidden=64, layers=2, heads=4, ffn=256, max_positions=128, seq_len=32),
}
GPT2 = {
    "full": TextConfig(vocab=50257, hidden=768, layers=12, heads=12, ffn=3072, max_positions=1024, seq_len=128),
    "small": TextConfig(vocab=1000, hidden=64, layers=2, heads=4, ffn=256, max_positions=128, seq_len=32),
}
BERT_CLASSES = 2
# BERT's additive mask value for padding (the original TF code's -10000): exp underflows to 0.
_MASKED = -10000.0


def encoder_layer(b: GraphBuilder, x: str, name: str, hidden: int, heads: int, ffn: int, mask_add: str | None,
                  eps: float = 1e-12) -> str:
    """A post-LayerNorm (BERT) encoder layer: LN(x + Attn(x)), then LN(h + FFN(h)) with exact GELU."""
    a = b.attention(x, f"{name}.attention", hidden, heads, mask_add, std=STD)
    h = b.layernorm(b.op("Add", [x, a], f"{name}.res1"), f"{name}.attention.LayerNorm", hidden, eps)
    f = b.gelu(b.linear(h, f"{name}.intermediate", hidden, ffn, STD), f"{name}.gelu")
    f = b.linear(f, f"{name}.output.dense", ffn, hidden, STD)
    return b.layernorm(b.op("Add", [h, f], f"{name}.res2"), f"{name}.output.LayerNorm", hidden, eps)


def _padding_mask(b: GraphBuilder, mask: str) -> str:
    """attention_mask [N, L] (1 = token, 0 = padding) -> additive [N, 1, 1, L]."""
    m = b.op("Cast", [mask], "mask_f", to=onnx.TensorProto.FLOAT)
    add = b.op("Mul", [b.op("Sub", [b.scalar("one", 1.0), m], "mask_inv"), b.scalar("masked", _MASKED)], "mask_add")
    return b.op("Unsqueeze", [add, b.ints("axes12", 1, 2)], "mask_4d")


def _positions(b: GraphBuilder, table: str, ids: str) -> str:
    """The first L rows of a position table, L = the sequence length of ``ids``."""
    length = b.op("Shape", [ids], "seq_len", start=1, end=2)
    return b.op("Slice", [table, b.ints("zero1", 0), length, b.ints("zero1", 0)], "positions")


def define_bert(b: GraphBuilder, scale: str, debug: bool = False) -> Signature:
    """BERT-base uncased (Devlin et al. 2019): word + position + token-type (all type 0) embeddings,
    12 post-LN encoder layers, tanh pooler on [CLS], then a linear 2-class head (1,538 parameters on
    top of the published 109,482,240)."""
    c = BERT[scale]
    h = c.hidden
    x = b.op("Gather", [b.param("embeddings.word_embeddings", (c.vocab, h), STD), "input_ids"], "word_emb")
    x = b.op("Add", [x, _positions(b, b.param("embeddings.position_embeddings", (c.max_positions, h), STD),
                                   "input_ids")], "emb_pos")
    tt = b.op("Gather", [b.param("embeddings.token_type_embeddings", (2, h), STD),
                         b.const("type0", np.asarray(0, np.int64))], "type_emb")
    x = b.layernorm(b.op("Add", [x, tt], "emb_sum"), "embeddings.LayerNorm", h, 1e-12)
    mask = _padding_mask(b, "attention_mask")
    for i in range(c.layers):
        x = encoder_layer(b, x, f"encoder.layer.{i}", h, c.heads, c.ffn, mask)
    b.rename(x, "hidden")
    first = b.op("Gather", [x, b.const("index0", np.asarray(0, np.int64))], "cls_token", axis=1)
    pooled = b.op("Tanh", [b.linear(first, "pooler.dense", h, h, STD)], "pooler")
    b.rename(pooled, "pooled")
    b.rename(b.linear(pooled, "classifier", h, BERT_CLASSES, STD), "logits")
    seq = (("N", "L"), "int64")
    return Signature({"input_ids": seq, "attention_mask": seq},
                     {"hidden": (("N", "L", h), "float32"), "pooled": (("N", h), "float32"),
                      "logits": (("N", BERT_CLASSES), "float32")},
                     {"L": c.seq_len}, vocab_size=c.vocab, max_seq_len=c.max_positions)


def define_gpt2(b: GraphBuilder, scale: str, debug: bool = False) -> Signature:
    """GPT-2 small (Radford et al. 2019): token + position embeddings, 12 pre-LN decoder blocks with
    causal self-attention and tanh-GELU MLPs, final LayerNorm, LM head tied to the token embedding
    (one initializer, used by Gather and by a Gemm with transB)."""
    c = GPT2[scale]
    h = c.hidden
    out_std = STD / math.sqrt(2 * c.layers)
    wte = b.param("wte", (c.vocab, h), STD)
    x = b.op("Add", [b.op("Gather", [wte, "input_ids"], "tok_emb"),
                     _positions(b, b.param("wpe", (c.max_positions, h), 0.01), "input_ids")], "emb")  # 0.01: OpenAI's model.py
    # Causal mask [L, L]: 0 on and below the diagonal, -1e9 above; built from L at run time so any
    # length up to max_positions works without a max_positions^2 constant in the file.
    length = b.op("Shape", ["input_ids"], "seq_len", start=1, end=2)
    ones = b.op("ConstantOfShape", [b.op("Concat", [length, length], "ll", axis=0)], "ones_ll",
                value=onnx.helper.make_tensor("v", onnx.TensorProto.FLOAT, [1], [1.0]))
    tril = b.op("Trilu", [ones], "tril", upper=0)
    causal = b.op("Mul", [b.op("Sub", [tril, b.scalar("one", 1.0)], "tril_m1"), b.scalar("big", 1e9)], "causal")
    for i in range(c.layers):
        name = f"h.{i}"
        a = b.attention(b.layernorm(x, f"{name}.ln_1", h), f"{name}.attn", h, c.heads, causal, STD, out_std)
        x = b.op("Add", [x, a], f"{name}.res1")
        m = b.gelu_tanh(b.linear(b.layernorm(x, f"{name}.ln_2", h), f"{name}.mlp.c_fc", h, c.ffn, STD),
                        f"{name}.mlp.gelu")
        x = b.op("Add", [x, b.linear(m, f"{name}.mlp.c_proj", c.ffn, h, out_std)], f"{name}.res2")
    x = b.layernorm(x, "ln_f", h)
    flat = b.op("Reshape", [x, b.ints("rows", -1, h)], "flat")
    logits = b.op("Gemm", [flat, wte], "lm_head", transB=1)
    shape = b.op("Concat", [b.op("Shape", ["input_ids"], "ids_shape"), b.ints("vocab", c.vocab)], "logit_shape",
                 axis=0)
    b.rename(b.op("Reshape", [logits, shape], "logits_nlv"), "logits")
    return Signature({"input_ids": (("N", "L"), "int64")}, {"logits": (("N", "L", c.vocab), "float32")},
                     {"L": c.seq_len}, vocab_size=c.vocab, max_seq_len=c.max_positions)


def encoder_layer_model(hidden: int = 32, heads: int = 4, ffn: int = 64, seed: int = 0) -> onnx.ModelProto:
    """One BERT encoder layer as a model (``x`` [N, L, hidden] float32 and ``attention_mask`` [N, L]
    int64 -> ``y``), for checking attention, GELU MLP and LayerNorm against an independent
    implementation. LayerNorm gains/biases are random here so a swapped pair shows."""
    b = GraphBuilder(np.random.default_rng(seed))
    y = encoder_layer(b, "x", "layer", hidden, heads, ffn, _padding_mask(b, "attention_mask"))
    rng = np.random.default_rng(seed + 1)
    for t in b.initializers:
        if t.name in b.param_shapes and ("LayerNorm" in t.name or t.name.endswith(".bias")):
            mean = 1.0 if t.name.endswith(".weight") else 0.0
            t.CopyFrom(onnx.numpy_helper.from_array(rng.normal(mean, 0.2, tuple(t.dims)).astype(np.float32),
                                                    t.name))
    b.rename(y, "y")
    return b.to_model("encoder_layer", {"x": (("N", "L", hidden), "float32"), "attention_mask": (("N", "L"), "int64")},
                      {"y": (("N", "L", hidden), "float32")})
