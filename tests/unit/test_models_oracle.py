"""gfaas.models against independent numpy implementations: logistic regression, a ResNet bottleneck
block, a BERT encoder layer, GPT-2's causal mask, BERT's padding mask and YOLO's in-graph decoding."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from numpy.lib.stride_tricks import sliding_window_view

import gfaas.models as models
from gfaas.models.text import encoder_layer_model
from gfaas.models.vision import bottleneck_model


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: onnx.numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}


# ---- logistic regression ----------------------------------------------------------------------------
def test_logreg_full_is_sigmoid_of_affine(tmp_path: Path) -> None:
    """logreg's prob equals 1 / (1 + exp(-(x @ w + b))) computed in numpy."""
    model = models.build("logreg", "full", seed=11)
    w = _weights(model)
    assert w["linear.weight"].shape == (32, 1) and w["linear.bias"].shape == (1,)
    assert w["linear.bias"][0] != 0.0
    x = np.random.default_rng(0).normal(0, 2, (64, 32)).astype(np.float32)
    want = 1.0 / (1.0 + np.exp(-(x.astype(np.float64) @ w["linear.weight"] + w["linear.bias"])))
    got = models.load("logreg", "full", seed=11, cache_dir=tmp_path)(features=x)["prob"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# ---- ResNet bottleneck ------------------------------------------------------------------------------
def _conv(x: np.ndarray, w: np.ndarray, stride: int) -> np.ndarray:
    k = w.shape[-1]
    p = k // 2
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    win = sliding_window_view(xp, (k, k), axis=(2, 3))[:, :, ::stride, ::stride]
    return np.einsum("nchwij,ocij->nohw", win, w)


def _bn(x: np.ndarray, w: dict[str, np.ndarray], name: str, eps: float = 1e-5) -> np.ndarray:
    def c(s: str) -> np.ndarray:
        return w[f"{name}.{s}"][None, :, None, None]

    return (x - c("running_mean")) / np.sqrt(c("running_var") + eps) * c("weight") + c("bias")


@pytest.mark.parametrize("cin,width,stride", [(16, 8, 2), (32, 8, 1), (16, 8, 1)])
def test_bottleneck_block_matches_numpy(cin: int, width: int, stride: int) -> None:
    """One v1.5 bottleneck (1x1, strided 3x3, 1x1, BN, shortcut, ReLU) equals a numpy re-implementation."""
    model = bottleneck_model(cin, width, stride, seed=3)
    w = _weights(model)
    # The block's BatchNorm statistics are random (not 0/1), so each of the four terms matters.
    assert np.ptp(w["block.bn1.running_var"]) > 0.1 and np.abs(w["block.bn3.running_mean"]).max() > 0.01
    x = np.random.default_rng(1).standard_normal((2, cin, 9, 10)).astype(np.float32)
    xd = x.astype(np.float64)
    relu = lambda a: np.maximum(a, 0.0)  # noqa: E731
    y = relu(_bn(_conv(xd, w["block.conv1.weight"], 1), w, "block.bn1"))
    y = relu(_bn(_conv(y, w["block.conv2.weight"], stride), w, "block.bn2"))
    y = _bn(_conv(y, w["block.conv3.weight"], 1), w, "block.bn3")
    if stride != 1 or cin != 4 * width:
        assert "block.downsample.0.weight" in w
        short = _bn(_conv(xd, w["block.downsample.0.weight"], stride), w, "block.downsample.1")
    else:
        assert "block.downsample.0.weight" not in w
        short = xd
    want = relu(y + short)
    got = _session(model).run(None, {"x": x})[0]
    assert got.shape == (2, 4 * width, math.ceil(9 / stride), math.ceil(10 / stride))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# ---- transformer encoder layer ----------------------------------------------------------------------
def _layernorm(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * g + b


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def test_encoder_layer_matches_numpy() -> None:
    """A BERT encoder layer (masked multi-head attention, residual + LayerNorm, erf-GELU MLP, residual +
    LayerNorm) equals a numpy re-implementation, padding included."""
    hidden, heads, ffn = 32, 4, 64
    model = encoder_layer_model(hidden, heads, ffn, seed=5)
    w = _weights(model)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 6, hidden)).astype(np.float32)
    mask = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]], np.int64)

    def lin(a: np.ndarray, n: str) -> np.ndarray:
        return a @ w[f"layer.{n}.weight"] + w[f"layer.{n}.bias"]

    xd = x.astype(np.float64)
    d = hidden // heads

    def split(a: np.ndarray) -> np.ndarray:  # [N, L, H*D] -> [N, H, L, D]
        return a.reshape(2, 6, heads, d).transpose(0, 2, 1, 3)

    q, k, v = (split(lin(xd, f"attention.{n}")) for n in ("query", "key", "value"))
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d) + ((1 - mask) * -10000.0)[:, None, None, :]
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ctx = (p @ v).transpose(0, 2, 1, 3).reshape(2, 6, hidden)
    h = _layernorm(xd + lin(ctx, "attention.output"), w["layer.attention.LayerNorm.weight"],
                   w["layer.attention.LayerNorm.bias"])
    f = lin(_gelu(lin(h, "intermediate")), "output.dense")
    want = _layernorm(h + f, w["layer.output.LayerNorm.weight"], w["layer.output.LayerNorm.bias"])
    got = _session(model).run(None, {"x": x, "attention_mask": mask})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # The LayerNorm gains were randomised, so a swapped weight/bias pair would have shown above.
    assert np.abs(w["layer.output.LayerNorm.weight"] - 1.0).max() > 0.1


# ---- masks of the text models -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpt(tmp_path_factory: pytest.TempPathFactory) -> models.Model:
    return models.load("gpt2_small", "small", cache_dir=tmp_path_factory.mktemp("gpt"))


def test_gpt2_later_tokens_do_not_change_earlier_logits(gpt: models.Model) -> None:
    """Changing token j leaves the logits at positions < j bit-for-bit close and changes those >= j."""
    ids = np.random.default_rng(3).integers(0, 1000, (2, 16)).astype(np.int64)
    base = gpt(input_ids=ids)["logits"]
    for j in (0, 5, 15):
        changed = ids.copy()
        changed[:, j] = (changed[:, j] + 1 + np.arange(2)) % 1000
        out = gpt(input_ids=changed)["logits"]
        np.testing.assert_allclose(out[:, :j], base[:, :j], rtol=1e-5, atol=1e-6)
        assert (np.abs(out[:, j:] - base[:, j:]).max(axis=-1) > 1e-4).all()


def test_gpt2_prefix_logits_equal_the_full_sequence_logits(gpt: models.Model) -> None:
    """Running on ids[:, :k] gives the first k positions of running on all of ids (causality, any L)."""
    ids = np.random.default_rng(4).integers(0, 1000, (1, 12)).astype(np.int64)
    full = gpt(input_ids=ids)["logits"]
    for k in (1, 4, 11):
        np.testing.assert_allclose(gpt(input_ids=ids[:, :k])["logits"], full[:, :k], rtol=1e-4, atol=1e-5)


def test_bert_padding_tokens_are_ignored(tmp_path: Path) -> None:
    """With attention_mask 0 at the tail, the ids there do not affect real tokens, pooled or logits;
    with mask 1 they do."""
    bert = models.load("bert_base", "small", cache_dir=tmp_path)
    ids = np.random.default_rng(5).integers(0, 1000, (2, 10)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[:, 6:] = 0
    other = ids.copy()
    other[:, 6:] = (other[:, 6:] + 17) % 1000
    a = bert(input_ids=ids, attention_mask=mask)
    b = bert(input_ids=other, attention_mask=mask)
    np.testing.assert_allclose(a["hidden"][:, :6], b["hidden"][:, :6], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a["pooled"], b["pooled"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a["logits"], b["logits"], rtol=1e-5, atol=1e-6)
    c = bert(input_ids=other, attention_mask=np.ones_like(ids))
    d = bert(input_ids=ids, attention_mask=np.ones_like(ids))
    assert np.abs(c["hidden"][:, :6] - d["hidden"][:, :6]).max() > 1e-3


# ---- YOLO decoding ----------------------------------------------------------------------------------
def _decode(raw: np.ndarray, anchors: tuple[tuple[float, float], ...], stride: int) -> tuple[np.ndarray, np.ndarray]:
    """Darknet's yolo layer, written out per anchor and cell."""
    n, _, g, _ = raw.shape
    a = len(anchors)
    t = raw.astype(np.float64).reshape(n, a, 5 + models.NUM_CLASSES, g, g)
    sig = lambda z: 1.0 / (1.0 + np.exp(-z))  # noqa: E731
    boxes = np.zeros((n, a, g, g, 4))
    scores = np.zeros((n, a, g, g, models.NUM_CLASSES))
    for i in range(a):
        for gy in range(g):
            for gx in range(g):
                c = t[:, i, :, gy, gx]
                boxes[:, i, gy, gx] = np.stack([(sig(c[:, 0]) + gx) * stride, (sig(c[:, 1]) + gy) * stride,
                                                np.exp(c[:, 2]) * anchors[i][0], np.exp(c[:, 3]) * anchors[i][1]],
                                               axis=1)
                scores[:, i, gy, gx] = sig(c[:, 4:5]) * sig(c[:, 5:])
    return boxes.reshape(n, -1, 4), scores.reshape(n, -1, models.NUM_CLASSES)


def test_yolo_decode_matches_numpy() -> None:
    """boxes and scores equal darknet-style decoding of the raw heads (exposed by a debug build), head
    0 (stride 32) first; the debug outputs do not change the model."""
    debug = models.build("yolo", "small", seed=2, debug=True)
    sess = _session(debug)
    x = np.random.default_rng(6).standard_normal((2, 3, 64, 64)).astype(np.float32)
    names = [o.name for o in sess.get_outputs()]
    assert names == ["boxes", "scores", "raw0", "raw1"]
    out = dict(zip(names, sess.run(None, {"image": x}), strict=True))
    anchors = models.yolo_anchors("small")
    assert out["raw0"].shape == (2, 255, 2, 2) and out["raw1"].shape == (2, 255, 4, 4)
    raw = [out["raw0"], out["raw1"]]
    b0, s0 = _decode(raw[0], anchors[0], models.STRIDES[0])
    b1, s1 = _decode(raw[1], anchors[1], models.STRIDES[1])
    np.testing.assert_allclose(out["boxes"], np.concatenate([b0, b1], axis=1), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(out["scores"], np.concatenate([s0, s1], axis=1), rtol=1e-4, atol=1e-6)
    plain = _session(models.build("yolo", "small", seed=2)).run(None, {"image": x})
    np.testing.assert_array_equal(plain[0], out["boxes"])
    np.testing.assert_array_equal(plain[1], out["scores"])


def test_yolo_decode_with_large_head_values() -> None:
    """The decode subgraph alone, fed raw maps of std 2 (where a wrong exp/sigmoid or cell order shows
    plainly), matches the numpy decoding."""
    debug = models.build("yolo", "small", seed=0, debug=True)
    g = debug.graph
    # Cut the graph at the raw heads: the tensors that raw0/raw1 expose become the graph's inputs.
    heads = {n.input[0]: n.output[0] for n in sorted(g.node, key=lambda n: n.output[0])
             if n.output[0] in ("raw0", "raw1")}
    producers = {o: n for n in g.node for o in n.output}
    keep: list[onnx.NodeProto] = []
    needed = {"boxes", "scores"}
    for node in reversed(list(g.node)):
        if set(node.output) & needed:
            keep.append(node)
            needed |= {i for i in node.input if i in producers and i not in heads}
    keep.reverse()
    used = {i for n in keep for i in n.input}
    assert set(heads) <= used and "image" not in used
    inits = [t for t in g.initializer if t.name in used]
    raw_in = [onnx.helper.make_tensor_value_info(src, onnx.TensorProto.FLOAT, ["N", 255, s, s])
              for src, s in zip(heads, (2, 4), strict=True)]
    cut = onnx.helper.make_model(onnx.helper.make_graph(keep, "decode", raw_in, list(g.output)[:2], inits),
                                 opset_imports=list(debug.opset_import))
    cut.ir_version = debug.ir_version
    rng = np.random.default_rng(7)
    raw = [rng.normal(0, 2, (3, 255, s, s)).astype(np.float32) for s in (2, 4)]
    boxes, scores = _session(cut).run(None, dict(zip(heads, raw, strict=True)))
    anchors = models.yolo_anchors("small")
    b0, s0 = _decode(raw[0], anchors[0], models.STRIDES[0])
    b1, s1 = _decode(raw[1], anchors[1], models.STRIDES[1])
    np.testing.assert_allclose(boxes, np.concatenate([b0, b1], axis=1), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(scores, np.concatenate([s0, s1], axis=1), rtol=1e-4, atol=1e-6)
