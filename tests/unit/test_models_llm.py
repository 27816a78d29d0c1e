"""gfaas.models.llm: the Llama-style decoder against naive references and closed forms, incremental
decoding against recomputation, pipelined against single-process execution token for token, and the
packed block format (round trip, zero copy, every corrupt header refused)."""

from __future__ import annotations

import math
import struct
from functools import cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gfaas.errors import ConfigError, DependencyMissing, GfaasError, ProtocolError
from gfaas.models import LlamaConfig, LlamaModel, LlamaStage, RequestState, pack_block, unpack_block
from gfaas.models.llm import generate, random_block, random_blocks
from gfaas.models.llm_blocks import (
    ALIGN,
    aligned_buffer,
    header_length,
    packed_size,
    read_header,
    unpack_blocks,
)
from gfaas.models.llm_config import PRESETS, block_shapes, param_count, preset, split_layers
from gfaas.models.llm_ops import apply_rope, rmsnorm, rope_tables

TINY = preset("tiny")
# Six layers and three query heads per KV head: more ways to split, and a grouping other than 2.
DEEP = LlamaConfig(vocab=80, dim=48, n_layers=6, n_heads=6, n_kv_heads=2, hidden=64, max_seq=64)


@cache
def _model(cfg: LlamaConfig = DEEP, seed: int = 7) -> LlamaModel:
    return LlamaModel(cfg, seed)


@cache
def _packed(num_blocks: int, cfg: LlamaConfig = DEEP, seed: int = 7) -> tuple[bytes, ...]:
    return tuple(_model(cfg, seed).pack(num_blocks))


# ---- an independent reference: loops over positions and heads, angles from math.cos -----------------
def _naive_forward(cfg: LlamaConfig, w: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """Logits [T, vocab] of the whole sequence in float64, one position and one head at a time."""
    hd, group = cfg.head_dim, cfg.n_heads // cfg.n_kv_heads
    W = {k: v.astype(np.float64) for k, v in w.items()}

    def norm(x: np.ndarray, g: np.ndarray) -> np.ndarray:
        return x / math.sqrt(sum(float(e) * float(e) for e in x) / len(x) + cfg.norm_eps) * g

    def rot(vec: np.ndarray, pos: int) -> np.ndarray:
        out = vec.copy()
        for i in range(hd // 2):
            a = pos * cfg.rope_theta ** (-2 * i / hd)
            out[2 * i] = vec[2 * i] * math.cos(a) - vec[2 * i + 1] * math.sin(a)
            out[2 * i + 1] = vec[2 * i] * math.sin(a) + vec[2 * i + 1] * math.cos(a)
        return out

    hs = [W["tok_embeddings"][t].copy() for t in ids]
    for layer in range(cfg.n_layers):
        p = f"layers.{layer}."
        xs = [norm(h, W[p + "attention_norm"]) for h in hs]
        qs = [x @ W[p + "wq"] for x in xs]
        ks = [x @ W[p + "wk"] for x in xs]
        vs = [x @ W[p + "wv"] for x in xs]
        new = []
        for t in range(len(ids)):
            heads = []
            for h in range(cfg.n_heads):
                kvh = h // group
                q = rot(qs[t][h * hd:(h + 1) * hd], t)
                scores = [float(q @ rot(ks[j][kvh * hd:(kvh + 1) * hd], j)) / math.sqrt(hd) for j in range(t + 1)]
                m = max(scores)
                e = [math.exp(s - m) for s in scores]
                heads.append(sum(e[j] / sum(e) * vs[j][kvh * hd:(kvh + 1) * hd] for j in range(t + 1)))
            a = np.concatenate(heads) @ W[p + "wo"]
            h1 = hs[t] + a
            x = norm(h1, W[p + "ffn_norm"])
            g = x @ W[p + "w1"]
            new.append(h1 + ((g / (1 + np.exp(-g))) * (x @ W[p + "w3"])) @ W[p + "w2"])
        hs = new
    return np.stack([norm(h, W["norm"]) @ W["output"] for h in hs])


@pytest.mark.parametrize("cfg", [TINY, LlamaConfig(vocab=40, dim=24, n_layers=2, n_heads=6, n_kv_heads=6,
                                                   hidden=40, max_seq=16)])
def test_forward_matches_a_naive_per_head_per_position_reference(cfg: LlamaConfig) -> None:
    """The vectorised forward pass (grouped and plain multi-head attention) equals loops over heads."""
    w = random_block(cfg, 3, 0, 1)
    ids = [5, 17, 2, 33, 9, 1]
    got = LlamaStage(cfg, 1, {0: w}).forward("r", np.array(ids))
    np.testing.assert_allclose(got, _naive_forward(cfg, w, ids), rtol=1e-4, atol=1e-4)


# ---- closed forms and properties of the kernels -----------------------------------------------------
def test_rmsnorm_closed_form() -> None:
    """rmsnorm([3, 4]) = [3, 4] / sqrt(12.5 + eps) * weight, and a constant vector c maps to ~sign(c)."""
    got = rmsnorm(np.array([[3.0, 4.0]], np.float32), np.array([2.0, -1.0], np.float32), 1e-5)
    np.testing.assert_allclose(got, [[6 / math.sqrt(12.5 + 1e-5), -4 / math.sqrt(12.5 + 1e-5)]], rtol=1e-6)
    np.testing.assert_allclose(rmsnorm(np.full((1, 8), -7.0, np.float32), np.ones(8, np.float32), 0.0),
                               -np.ones((1, 8)), rtol=1e-6)


@settings(max_examples=60, deadline=None)
@given(m=st.integers(0, 40), n=st.integers(0, 40), shift=st.integers(0, 20), seed=st.integers(0, 2**16))
def test_rope_scores_depend_only_on_relative_position(m: int, n: int, shift: int, seed: int) -> None:
    """q at position m dotted with k at position n equals the same at m + s, n + s; norms are kept."""
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((2, 1, 1, 16)).astype(np.float32)
    cos, sin = rope_tables(16, 64, 10000.0)

    def at(x: np.ndarray, p: int) -> np.ndarray:
        return apply_rope(x, cos[p:p + 1], sin[p:p + 1])[0, 0]

    assert float(at(q, m) @ at(k, n)) == pytest.approx(float(at(q, m + shift) @ at(k, n + shift)), abs=1e-4)
    assert float(np.linalg.norm(at(q, m))) == pytest.approx(float(np.linalg.norm(q)), rel=1e-5)


def test_split_layers_is_balanced_and_refuses_impossible_splits() -> None:
    """Blocks hold whole layers, sizes differ by at most one, larger blocks first; B in 1..layers."""
    for layers in range(1, 13):
        for b in range(1, layers + 1):
            parts = split_layers(layers, b)
            assert [i for r in parts for i in r] == list(range(layers))
            sizes = [len(r) for r in parts]
            assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    for bad in (0, 7):
        with pytest.raises(ConfigError, match=f"num_blocks={bad}: must be between 1 and the layer count 6"):
            split_layers(6, bad)


@pytest.mark.parametrize(("change", "message"), [
    ({"n_heads": 5}, "dim=32 is not divisible by n_heads=5"),
    ({"n_heads": 32, "n_kv_heads": 32}, "head width dim/n_heads=1 is odd"),
    ({"n_kv_heads": 3}, "n_kv_heads=3 does not divide n_heads=4"),
    ({"vocab": 1}, "vocab=1: greedy decoding needs at least 2 tokens"),
    ({"n_layers": 0}, "n_layers=0: must be an integer >= 1"),
    ({"dtype": "bfloat16"}, "dtype='bfloat16': must be one of float32, float16"),
    ({"rope_theta": 0.0}, "rope_theta=0.0: must be > 0"),
])
def test_bad_configs_are_refused_with_the_field_named(change: dict, message: str) -> None:
    """Each inconsistent config raises ConfigError naming the field and the fix."""
    fields = {**TINY.__dict__, **change}
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        LlamaConfig(**fields)
    with pytest.raises(ConfigError, match="unknown LLM preset 'huge'"):
        preset("huge")


def test_presets_range_from_tiny_to_a_few_hundred_megabytes() -> None:
    """Parameter counts follow the closed form; the demo packs to 100-600 MB, float16 to half of it."""
    for cfg in PRESETS.values():
        d, kvd = cfg.dim, cfg.n_kv_heads * cfg.head_dim
        layer = 2 * d + 2 * d * d + 2 * d * kvd + 3 * d * cfg.hidden
        assert param_count(cfg) == 2 * cfg.vocab * d + d + cfg.n_layers * layer
    assert param_count(TINY) < 100_000
    demo = sum(packed_size(PRESETS["demo"], b, 4) for b in range(4))
    half = sum(packed_size(PRESETS["demo-half"], b, 4) for b in range(4))
    params = param_count(PRESETS["demo"])
    # Overhead: 4 headers of 64 + 84 bytes per tensor, and under 64 bytes of alignment per tensor.
    assert 100e6 < demo < 600e6 and 4 * params <= demo < 4 * params + 4 * 64 + 112 * (64 + 84)
    assert 2 * params <= half < 2 * params + 4 * 64 + 112 * (64 + 84)


# ---- decoding ----------------------------------------------------------------------------------------
def test_incremental_decoding_with_the_kv_cache_equals_recomputing_the_sequence() -> None:
    """Logits of each decoding step (cache) equal the last row of a full forward of the sequence so far."""
    m = _model()
    seq = [3, 14, 15, 9, 26]
    step_logits = m.forward("inc", np.array(seq), last_only=True)
    for _ in range(12):
        full = m.forward(("full", len(seq)), np.array(seq))[-1]
        np.testing.assert_allclose(step_logits[-1], full, rtol=1e-4, atol=1e-5)
        seq.append(int(np.argmax(full)))
        step_logits = m.forward("inc", np.array(seq[-1:]), last_only=True)
    assert m.cached_len("inc") == len(seq)


def test_weights_and_tokens_are_determined_by_the_seed() -> None:
    """Same seed: identical packed bytes and tokens; another seed: other weights and other tokens."""
    assert random_blocks(DEEP, 7, 3) == random_blocks(DEEP, 7, 3)
    assert random_blocks(DEEP, 7, 3)[1] != random_blocks(DEEP, 8, 3)[1]
    prompt = [1, 2, 3, 4]
    assert LlamaModel(DEEP, 7).generate(prompt, 16) == _model().generate(prompt, 16)
    assert LlamaModel(DEEP, 8).generate(prompt, 16) != _model().generate(prompt, 16)
    # A block's tensors do not depend on the split it belongs to.
    np.testing.assert_array_equal(random_block(DEEP, 7, 1, 3)["layers.2.wq"], random_block(DEEP, 7, 0, 1)["layers.2.wq"])


def test_activations_stay_finite_and_bounded_over_many_layers() -> None:
    """With the scaled init the residual stream's RMS stays within 0.5..2 over 48 layers."""
    cfg = LlamaConfig(vocab=64, dim=64, n_layers=48, n_heads=4, n_kv_heads=1, hidden=128, max_seq=64)
    stages = [LlamaStage(cfg, 48, {b: random_block(cfg, 0, b, 48)}) for b in range(48)]
    x: np.ndarray = np.arange(32) % cfg.vocab
    for s in stages[:-1]:
        x = s.forward("r", x)
        rms = float(np.sqrt(np.mean(np.square(x))))
        assert np.isfinite(x).all() and 0.5 < rms < 2.0, (s.first, rms)
    assert np.isfinite(stages[-1].forward("r", x)).all()


@pytest.mark.parametrize("seed", range(4))
def test_greedy_decoding_does_not_collapse_to_one_token(seed: int) -> None:
    """32 greedy tokens of the small preset have at least 8 distinct values (random weights can still
    fall into a short cycle later; this guards against a trivially degenerate init)."""
    out = _model(preset("small"), seed).generate([seed, 1, 2, 3], 32)
    assert len(set(out)) >= 8, out


def _split(num_blocks: int, cuts: list[int]) -> list[list[int]]:
    bounds = [0, *sorted({c for c in cuts if 0 < c < num_blocks}), num_blocks]
    return [list(range(a, b)) for a, b in zip(bounds, bounds[1:], strict=False)]


@settings(max_examples=40, deadline=None)
@given(num_blocks=st.integers(1, DEEP.n_layers), cuts=st.lists(st.integers(1, DEEP.n_layers - 1), max_size=5),
       prompt=st.lists(st.integers(0, DEEP.vocab - 1), min_size=1, max_size=12), n=st.integers(1, 14),
       switch=st.integers(0, 14), via_bytes=st.booleans())
def test_pipelined_execution_gives_the_tokens_of_one_process(num_blocks: int, cuts: list[int], prompt: list[int],
                                                           n: int, switch: int, via_bytes: bool) -> None:
    """Any split into blocks and stages decodes the same tokens as the whole model in one process, also
    when the request moves to local execution after ``switch`` tokens carrying its exported state."""
    want = _model().generate(prompt, n)
    bufs = _packed(num_blocks)
    stages = [LlamaStage.from_packed(DEEP, [bufs[b] for b in group]) for group in _split(num_blocks, cuts)]
    k = min(switch, n)
    got = generate(stages, "req", prompt, k)
    if k < n:
        state = RequestState.merge(prompt + got, [s.export_kv("req") for s in stages])
        assert state.cached == (len(prompt) + k - 1 if k else 0)
        if via_bytes:
            state = RequestState.from_bytes(state.to_bytes(DEEP), DEEP)
        local = LlamaStage.from_packed(DEEP, _packed(1))
        local.import_kv("req", state)
        got += generate([local], "req", state.tokens, n - k)
    assert got == want


def test_float16_storage_gives_the_same_tokens_built_or_unpacked() -> None:
    """With float16 storage, the model built from the seed and 3 stages unpacked from float16 blocks
    (half the bytes) decode the same tokens."""
    cfg = LlamaConfig(**{**DEEP.__dict__, "dtype": "float16"})
    bufs = random_blocks(cfg, 7, 3)
    assert sum(map(len, bufs)) < 0.55 * sum(map(len, _packed(3)))
    stages = [LlamaStage.from_packed(cfg, [b]) for b in bufs]
    assert generate(stages, "h", [1, 2, 3], 12) == LlamaModel(cfg, 7).generate([1, 2, 3], 12)


@cache
def _state_bytes() -> bytes:
    m = LlamaStage.from_packed(DEEP, _packed(1))
    tokens = [4, 5, *generate([m], "tr", [4, 5], 3)]
    return RequestState(tokens, m.export_kv("tr")).to_bytes(DEEP)


@settings(max_examples=60, deadline=None)
@given(cut=st.integers(0, 10_000), extra=st.binary(min_size=1, max_size=8))
def test_a_truncated_or_extended_request_state_is_refused(cut: int, extra: bytes) -> None:
    """Every strict prefix of an encoded state, and the state with bytes appended, raise ProtocolError."""
    buf = _state_bytes()
    for bad in (buf[:cut % len(buf)], buf + extra):
        with pytest.raises(ProtocolError):
            RequestState.from_bytes(bad, DEEP)


def test_a_request_state_can_also_move_from_local_execution_into_a_pipeline() -> None:
    """Exported from the whole model after 5 tokens and imported into 3 stages, decoding continues the same."""
    prompt, m = [9, 8, 7], LlamaStage.from_packed(DEEP, _packed(1))
    first = generate([m], "r", prompt, 5)
    state = RequestState(prompt + first, m.export_kv("r"))
    stages = [LlamaStage.from_packed(DEEP, [b]) for b in _packed(3)]
    for s in stages:
        s.import_kv("r", state)
    assert first + generate(stages, "r", state.tokens, 7) == _model().generate(prompt, 12)


def test_stage_and_state_misuse_is_refused() -> None:
    """Gaps between stages, stages that disagree, unknown tokens, max_seq and short states raise ConfigError."""
    bufs = _packed(3)
    with pytest.raises(ConfigError, match=r"contiguous range of blocks, got \[0, 2\]"):
        LlamaStage.from_packed(DEEP, [bufs[0], bufs[2]])
    s0, s1, s2 = (LlamaStage.from_packed(DEEP, [b]) for b in bufs)
    with pytest.raises(ConfigError, match="stages must be consecutive"):
        generate([s0, s2], "r", [1], 1)
    with pytest.raises(ConfigError, match=r"token ids must be in 0..79, got 1..80"):
        s0.forward("r", [1, 80])
    generate([s0, s1, s2], "r", [1, 2], 2)
    s1.release("r")
    with pytest.raises(ConfigError, match=r"disagree on the request's cached length: \[0, 3\]"):
        generate([s0, s1, s2], "r", [1, 2], 1)
    with pytest.raises(ConfigError, match="exceed max_seq=64"):
        _model().forward("long", np.zeros(65, dtype=np.int64))
    with pytest.raises(ConfigError, match=r"lacks the KV cache of layers \[2, 3\]"):
        s1.import_kv("x", RequestState([1], s0.export_kv("r")))
    # The one block parser both stage classes (numpy, torch) use: a repeated block or none is refused.
    with pytest.raises(ConfigError, match="block 1 given twice"):
        unpack_blocks([bufs[1], bufs[1]], DEEP)
    with pytest.raises(ConfigError, match="at least one packed block"):
        unpack_blocks([], DEEP)
    blocks, count = unpack_blocks(bufs[:2], DEEP)
    assert sorted(blocks) == [0, 1] and count == 3


def test_request_state_bytes_round_trip_and_refuse_garbage() -> None:
    """to_bytes/from_bytes is exact; truncated or inconsistent encodings raise ProtocolError."""
    m = _model()
    generate([m], "st", [4, 5, 6], 4)
    state = RequestState([4, 5, 6, *range(4)], m.export_kv("st"))
    back = RequestState.from_bytes(state.to_bytes(DEEP), DEEP)
    assert back.tokens == state.tokens and back.cached == 6 and sorted(back.kv) == list(range(6))
    for layer in range(6):
        for a, b in zip(back.kv[layer], state.kv[layer], strict=True):
            assert a.tobytes() == b.tobytes()
    buf = state.to_bytes(DEEP)
    for bad in (buf[:-4], buf[:-1], buf[:8], buf + bytes(4)):
        with pytest.raises(ProtocolError):
            RequestState.from_bytes(bad, DEEP)


# ---- packed blocks -----------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", [DEEP, LlamaConfig(**{**DEEP.__dict__, "dtype": "float16"})])
def test_pack_unpack_round_trip_is_bit_exact_and_zero_copy(cfg: LlamaConfig) -> None:
    """Unpacked tensors equal the packed ones bit for bit (float16: the float16 cast), are views into the
    buffer (64-byte aligned in an aligned buffer), and the packed size is known before packing."""
    for b in range(3):
        tensors = random_block(cfg, 1, b, 3)
        buf = pack_block(cfg, b, 3, tensors)
        assert len(buf) == packed_size(cfg, b, 3) and read_header(buf)[:2] == (b, 3)
        dst = aligned_buffer(len(buf))
        dst[:] = buf
        index, out = unpack_block(dst, cfg, 3)
        assert index == b and list(out) == list(block_shapes(cfg, b, 3))
        for name, arr in out.items():
            assert arr.tobytes() == tensors[name].astype(cfg.dtype).tobytes()
            assert arr.ctypes.data % ALIGN == 0
        name = next(iter(out))
        before = out[name].copy()
        dst[header_length(len(out)):header_length(len(out)) + 4] = b"\xff\xff\xff\x7f"
        assert not np.array_equal(out[name], before)  # a view, not a copy
        assert not unpack_block(buf, cfg)[1][name].flags.writeable


def test_a_stage_built_from_packed_float32_blocks_uses_the_buffer_in_place() -> None:
    """float32 weights are not copied into the stage: they share memory with the received buffer."""
    buf = aligned_buffer(len(_packed(2)[1]))
    buf[:] = _packed(2)[1]
    stage = LlamaStage.from_packed(DEEP, [buf])
    arr = np.frombuffer(buf, np.uint8)
    assert np.shares_memory(stage._w["output"], arr) and np.shares_memory(stage._w["layers.5.w2"], arr)


def _corrupt(buf: bytes, offset: int, fmt: str, value: object) -> bytes:
    out = bytearray(buf)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


ENTRY0 = 64  # first table entry: name 48 s, dtype u8 @48, ndim u8 @49, reserved u16 @50, dims @52, off @68, n @76


@pytest.mark.parametrize(("mutate", "error", "message"), [
    (lambda b: b[:40], ProtocolError, "truncated: 40 bytes, the header alone needs 64"),
    (lambda b: b[:-1], ProtocolError, r"its header says \d+ \+ \d+ \(truncated or padded in transit\)"),
    (lambda b: b + b"\0", ProtocolError, "truncated or padded in transit"),
    (lambda b: _corrupt(b, 0, "4s", b"GGUF"), ProtocolError, "not a packed model block: magic b'GGUF'"),
    (lambda b: _corrupt(b, 4, "<H", 2), ProtocolError, "version 2; this gfaas reads version 1"),
    (lambda b: _corrupt(b, 6, "<H", 1), ProtocolError, "reserved field is 1, must be 0"),
    (lambda b: _corrupt(b, 8, "<I", 3), ProtocolError, "index 3 of 3 blocks is out of range"),
    (lambda b: _corrupt(b, 12, "<I", 2), ConfigError, "from a split into 2 blocks, expected 3"),
    (lambda b: _corrupt(b, 16, "B", 0), ConfigError, "belongs to another model config"),
    (lambda b: _corrupt(b, 48, "<I", 99), ProtocolError, "header length 1664 does not match 99 tensors"),
    (lambda b: _corrupt(b, 56, "<Q", 2**63), ProtocolError, "truncated or padded in transit"),
    (lambda b: _corrupt(b, ENTRY0, "2s", b"wk"), ProtocolError, "tensor 0 is named b'wkk_embeddings', expected 'tok_embeddings'"),
    (lambda b: _corrupt(b, ENTRY0 + 48, "B", 2), ProtocolError, r"dtype code 2, expected 1 \(float32\)"),
    (lambda b: _corrupt(b, ENTRY0 + 49, "B", 3), ProtocolError, r"has ndim 3 dims \(80, 48, 0, 0\)"),
    (lambda b: _corrupt(b, ENTRY0 + 50, "<H", 5), ProtocolError, "reserved field 5, must be 0"),
    (lambda b: _corrupt(b, ENTRY0 + 52, "<I", 81), ProtocolError, r"dims \(81, 48, 0, 0\), expected shape \(80, 48\)"),
    (lambda b: _corrupt(b, ENTRY0 + 68, "<Q", 2**40), ProtocolError, "at offset 1099511627776, expected 1664"),
    (lambda b: _corrupt(b, ENTRY0 + 68, "<Q", 1728), ProtocolError, "at offset 1728, expected 1664"),
    (lambda b: _corrupt(b, ENTRY0 + 76, "<Q", 2**40), ProtocolError, "spans bytes 1664..1099511629440"),
    (lambda b: _corrupt(b, 1662, "B", 1), ProtocolError, "header padding bytes 1660..1664 are not zero"),
])
def test_corrupt_block_headers_are_refused(mutate, error: type[Exception], message: str) -> None:
    """Each corrupted header field raises the named error with the bad value in its message."""
    buf = _packed(3)[0]
    assert header_length(len(block_shapes(DEEP, 0, 3))) == 1664  # 64 + 84 x (1 embedding + 2 layers x 9 tensors), rounded up to 64
    with pytest.raises(error, match=message):
        unpack_block(mutate(buf), DEEP, 3)


def test_a_block_of_another_config_is_refused() -> None:
    """A well-formed block packed for another config (one field differs) raises ConfigError."""
    other = LlamaConfig(**{**DEEP.__dict__, "rope_theta": 500000.0})
    with pytest.raises(ConfigError, match="belongs to another model config"):
        unpack_block(_packed(3)[0], other)
    with pytest.raises(ConfigError, match=r"tensors missing \['norm', 'output'\], unexpected \[\]"):
        pack_block(DEEP, 2, 3, {k: v for k, v in random_block(DEEP, 0, 2, 3).items() if k not in ("norm", "output")})


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_any_single_byte_change_in_the_header_is_refused(data: st.DataObject) -> None:
    """No header byte is ignored: changing any one byte of the header region raises a GfaasError."""
    buf = _packed(4)[data.draw(st.integers(0, 3))]
    n = len(block_shapes(DEEP, read_header(buf)[0], 4))
    pos = data.draw(st.integers(0, header_length(n) - 1))
    delta = data.draw(st.integers(1, 255))
    bad = bytearray(buf)
    bad[pos] = (bad[pos] + delta) % 256
    with pytest.raises(GfaasError):
        unpack_block(bytes(bad), DEEP, 4)


def test_the_llm_loads_without_the_zoo_and_is_exported_from_gfaas_models() -> None:
    """``import gfaas.models.llm`` does not import onnx (the zoo's dependency); the package exports the
    LLM names lazily next to the zoo's, and its __all__ matches what it can resolve."""
    import subprocess
    import sys

    import gfaas.models as models

    code = "import sys, gfaas.models.llm; assert 'onnx' not in sys.modules and 'gfaas.models.zoo' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert sorted(models.__all__) == sorted(models._EXPORTS)
    assert models.LlamaModel is LlamaModel and models.pack_block is pack_block and callable(models.build)


# ---- torch ---------------------------------------------------------------------------------------------
def test_torch_path_matches_numpy_or_names_the_extra() -> None:
    """The torch stage (GPU if there is one, else CPU) decodes the numpy tokens, also across a switch
    between torch and numpy stages; without torch the error names the extra to install."""
    from gfaas.models.llm_torch import TorchStage

    try:
        import torch
    except ImportError:
        with pytest.raises(DependencyMissing, match=r"install the extra with: pip install 'gfaas\[torch\]'"):
            TorchStage.from_packed(DEEP, _packed(1))
        pytest.skip("torch is not installed (the torch extra): the torch path is not run here")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    prompt = [5, 6, 7]
    want = _model().generate(prompt, 16)
    whole = TorchStage.from_packed(DEEP, _packed(1), device=device)
    np.testing.assert_allclose(whole.forward("l", np.array(prompt)), _model().forward("l", np.array(prompt)),
                               rtol=1e-3, atol=1e-4)
    assert generate([whole], "t", prompt, 16) == want
    torch_pipe = [TorchStage.from_packed(DEEP, [b], device=device) for b in _packed(2)]
    first = generate(torch_pipe, "p", prompt, 6)
    state = RequestState.merge(prompt + first, [s.export_kv("p") for s in torch_pipe])
    local = LlamaStage.from_packed(DEEP, _packed(1))
    local.import_kv("p", state)
    assert first + generate([local], "p", state.tokens, 10) == want
