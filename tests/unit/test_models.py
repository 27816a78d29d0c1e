"""gfaas.models: the zoo's names, parameter counts, contracts of every small model, determinism,
the on-disk cache, feed validation and errors. Numerical oracles are in test_models_oracle.py."""

from __future__ import annotations

import logging
import math
import os
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import gfaas.models as models
from gfaas.errors import ConfigError, DependencyMissing, NotFound
from gfaas.models import cache, zoo
from gfaas.models.builder import GraphBuilder

NAMES = ["resnet50", "yolo", "fcn", "efficientnet_b0", "alexnet", "vit_b16", "bert_base", "gpt2_small", "logreg"]

# What param_count("X", "full") must return: the published counts (sources in zoo.py and
# docs/models.md); bert_base is the published 109,482,240 plus its 2-class head (768 * 2 + 2).
FULL_COUNTS = {
    "resnet50": 25_557_032,
    "yolo": 8_852_366,
    "fcn": 32_957_013,
    "efficientnet_b0": 5_288_548,
    "alexnet": 61_100_840,
    "vit_b16": 86_567_656,
    "bert_base": 109_482_240 + 1_538,
    "gpt2_small": 124_439_808,
    "logreg": 33,
}


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("model-cache")


@pytest.fixture(scope="module")
def small(cache_root: Path) -> dict[str, models.Model]:
    return {n: models.load(n, "small", cache_dir=cache_root) for n in NAMES}


def test_names_are_the_nine_models() -> None:
    """names() lists the nine models in a fixed order."""
    assert models.names() == NAMES


# ---- parameter counts -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_full_param_count_matches_the_published_count(name: str) -> None:
    """param_count(name, 'full') is within 10% of the reference (in fact equal to it, head aside)."""
    count = models.param_count(name, "full")
    ref = models.info(name, "full").reference_params
    assert ref is not None and ref > 0
    assert abs(count - ref) / ref < 0.10
    assert count == FULL_COUNTS[name]


@pytest.mark.parametrize("name", NAMES)
def test_small_is_smaller_than_full(name: str) -> None:
    """The small variant has fewer parameters (logreg: the same 33 at both scales)."""
    s, f = models.param_count(name, "small"), models.param_count(name, "full")
    if name == "logreg":
        assert s == f == 33
    else:
        assert 0 < s < f / 10


def test_param_count_allocates_no_weights() -> None:
    """Counting GPT-2 full (124M parameters, ~500 MB of weights) takes well under 2 MB and 1 s."""
    zoo._signature.cache_clear()
    tracemalloc.start()
    t = time.perf_counter()
    try:
        assert models.param_count("gpt2_small", "full") == FULL_COUNTS["gpt2_small"]
        elapsed = time.perf_counter() - t
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * 2**20
    assert elapsed < 1.0


@pytest.mark.parametrize("name", NAMES)
def test_counted_parameters_are_the_built_initializers(name: str) -> None:
    """Every parameter the count sums is an initializer of the built graph with the same shape."""
    counter = GraphBuilder(None)
    zoo._ZOO[name].define(counter, "small", False)
    inits = {t.name: tuple(t.dims) for t in models.build(name, "small").graph.initializer}
    assert counter.param_shapes
    for pname, shape in counter.param_shapes.items():
        assert inits.get(pname) == shape, pname
    assert counter.n_params() == models.param_count(name, "small")


# ---- every small model: builds, checks, runs --------------------------------------------------------
def _random_feeds(info: models.ModelInfo, seed: int, low: int) -> dict[str, np.ndarray]:
    """Random inputs of the model's input shapes: token ids in [low, vocab), floats N(0, 1), a full
    attention mask."""
    rng = np.random.default_rng(seed)
    feeds = {k: (rng.integers(low, info.vocab_size or 2, size=s) if d == "int64" else
                 rng.standard_normal(s).astype(np.float32)) for k, (s, d) in info.inputs.items()}
    if "attention_mask" in feeds:
        feeds["attention_mask"] = np.ones_like(feeds["attention_mask"])
    return feeds


@pytest.mark.parametrize("name", NAMES)
def test_small_model_builds_and_runs_in_under_a_second(name: str) -> None:
    """build + onnxruntime session + one forward pass of a small model take < 1 s; the graph passes
    onnx.checker (full check, with shape inference)."""
    t = time.perf_counter()
    model = models.build(name, "small", seed=3)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    sess.run(None, _random_feeds(models.info(name, "small"), seed=0, low=0))
    elapsed = time.perf_counter() - t
    onnx.checker.check_model(model, full_check=True)
    assert elapsed < 1.0, f"{name} small took {elapsed:.2f}s"


@pytest.mark.parametrize("name", NAMES)
def test_small_model_outputs_follow_the_contract(name: str, small: dict[str, models.Model]) -> None:
    """Outputs have the documented names, shapes (batch 2), dtype float32, and are finite."""
    m = small[name]
    info = m.info
    out = m(**m.example_inputs(batch=2))
    assert tuple(out) == info.outputs
    sizes = {"N": 2, **zoo.signature(name, "small").defaults}
    for k, (shape, dtype) in info.output_shapes.items():
        want = tuple(sizes[d] if isinstance(d, str) else d for d in shape)
        assert out[k].shape == want, k
        assert out[k].dtype == np.dtype(dtype) == np.float32
        assert np.isfinite(out[k]).all(), k


EXPECTED_OUTPUTS = {
    "resnet50": {"logits": (1, 1000)},
    "yolo": {"boxes": (1, 60, 4), "scores": (1, 60, 80)},
    "fcn": {"logits": (1, 21, 64, 64)},
    "efficientnet_b0": {"logits": (1, 1000)},
    "alexnet": {"logits": (1, 1000)},
    "vit_b16": {"logits": (1, 1000)},
    "bert_base": {"hidden": (1, 32, 64), "pooled": (1, 64), "logits": (1, 2)},
    "gpt2_small": {"logits": (1, 32, 1000)},
    "logreg": {"prob": (1, 1)},
}


@pytest.mark.parametrize("name", NAMES)
def test_small_output_shapes_are_pinned(name: str, small: dict[str, models.Model]) -> None:
    """The small models' default output shapes at batch 1 are exactly these."""
    m = small[name]
    out = m(**m.example_inputs())
    assert {k: v.shape for k, v in out.items()} == EXPECTED_OUTPUTS[name]


@pytest.mark.parametrize("name", ["resnet50", "yolo", "fcn", "efficientnet_b0"])
def test_batchnorm_models_keep_activations_near_unit_scale(name: str, small: dict[str, models.Model]) -> None:
    """Calibrated BatchNorm statistics keep the outputs O(1): no drift to 1e-6 or 1e3."""
    m = small[name]
    out = m(**m.example_inputs(batch=2, seed=5))
    if name != "yolo":
        assert 0.05 < float(out["logits"].std()) < 20.0
        return
    # The detector heads start small (std 0.01), so boxes sit near their anchors and scores near
    # sigmoid(0)^2 = 1/4, with some spread.
    scores, boxes = out["scores"], out["boxes"]
    assert 0.15 < float(scores.mean()) < 0.35 and float(scores.std()) > 0.005
    anchors = np.concatenate([np.repeat(np.asarray(a), g * g, axis=0)
                              for a, g in zip(models.yolo_anchors("small"), (2, 4), strict=True)])
    ratio = boxes[..., 2:] / anchors
    assert ratio.min() > 0.5 and ratio.max() < 2.0


def test_info_of_full_models() -> None:
    """info() gives default shapes with batch 1 and the model's vocabulary; small has no reference count."""
    bert = models.info("bert_base", "full")
    assert bert.inputs == {"input_ids": ((1, 128), "int64"), "attention_mask": ((1, 128), "int64")}
    assert bert.outputs == ("hidden", "pooled", "logits")
    assert bert.vocab_size == 30522 and bert.max_seq_len == 512
    assert bert.dynamic_inputs["input_ids"] == (("N", "L"), "int64")
    assert models.info("gpt2_small", "full").vocab_size == 50257
    assert models.info("yolo", "full").inputs == {"image": ((1, 3, 416, 416), "float32")}
    assert models.info("yolo", "full").output_shapes["boxes"] == (("N", 2535, 4), "float32")
    assert models.info("fcn", "full").inputs == {"image": ((1, 3, 224, 224), "float32")}
    assert models.info("fcn", "full").dynamic_inputs["image"] == (("N", 3, "H", "W"), "float32")
    assert models.info("resnet50", "small").reference_params is None
    assert models.info("logreg", "small").reference_params == 33
    assert models.info("vit_b16").vocab_size is None
    assert "torchvision" in models.info("resnet50", "full").reference_source


def test_yolo_constants() -> None:
    """ANCHORS, STRIDES and the class count are the yolov3-tiny.cfg values."""
    assert models.ANCHORS == (((81, 82), (135, 169), (344, 319)), ((10, 14), (23, 27), (37, 58)))
    assert models.STRIDES == (32, 16)
    assert models.NUM_CLASSES == 80
    assert models.yolo_anchors("full") == tuple(tuple((float(w), float(h)) for w, h in a) for a in models.ANCHORS)
    assert models.yolo_anchors("small")[0][2] == pytest.approx((344 * 64 / 416, 319 * 64 / 416))


# ---- determinism ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_model_different_seed_different_outputs(name: str) -> None:
    """The same seed builds byte-identical graphs; another seed gives other outputs on the same input."""
    a = models.build(name, "small", seed=7).SerializeToString()
    assert models.build(name, "small", seed=7).SerializeToString() == a
    b = models.build(name, "small", seed=8).SerializeToString()
    feeds = _random_feeds(models.info(name, "small"), seed=1, low=1)
    outs = [ort.InferenceSession(x, providers=["CPUExecutionProvider"]).run(None, feeds) for x in (a, a, b)]
    for x, y, z in zip(*outs, strict=True):
        np.testing.assert_array_equal(x, y)
        assert not np.allclose(x, z)


def test_example_inputs_are_deterministic(small: dict[str, models.Model]) -> None:
    """example_inputs(batch, seed) repeats exactly; another seed differs; ids lie in the vocabulary."""
    m = small["bert_base"]
    a, b, c = m.example_inputs(3, seed=1), m.example_inputs(3, seed=1), m.example_inputs(3, seed=2)
    np.testing.assert_array_equal(a["input_ids"], b["input_ids"])
    assert not np.array_equal(a["input_ids"], c["input_ids"])
    assert a["input_ids"].shape == (3, 32) and a["input_ids"].dtype == np.int64
    assert a["input_ids"].min() >= 0 and a["input_ids"].max() < 1000
    assert (a["attention_mask"] == 1).all()
    img = small["resnet50"].example_inputs(2, seed=4)["image"]
    assert img.shape == (2, 3, 64, 64) and img.dtype == np.float32
    np.testing.assert_array_equal(img, small["resnet50"].example_inputs(2, seed=4)["image"])


# ---- dynamic dims -----------------------------------------------------------------------------------
def test_dynamic_batch_length_and_image_size(small: dict[str, models.Model]) -> None:
    """Text models take any L up to max positions and any N; fcn takes any H, W and answers at that size."""
    bert, gpt, fcn = small["bert_base"], small["gpt2_small"], small["fcn"]
    ids = np.arange(21, dtype=np.int64).reshape(3, 7)
    out = bert(input_ids=ids, attention_mask=np.ones_like(ids))
    assert out["hidden"].shape == (3, 7, 64) and out["logits"].shape == (3, 2)
    assert gpt(input_ids=ids[:, :5])["logits"].shape == (3, 5, 1000)
    assert gpt(input_ids=np.zeros((1, 128), np.int64))["logits"].shape == (1, 128, 1000)
    seg = fcn(image=np.zeros((1, 3, 96, 80), np.float32))["logits"]
    assert seg.shape == (1, 21, 96, 80) and np.isfinite(seg).all()


# ---- feeds and errors -------------------------------------------------------------------------------
def test_bad_feeds_raise_config_errors_naming_the_problem(small: dict[str, models.Model]) -> None:
    """Missing/unknown names, dtype, rank, fixed dims, disagreeing dims, ids and mask values are refused."""
    r, bert, gpt = small["resnet50"], small["bert_base"], small["gpt2_small"]
    img = np.zeros((1, 3, 64, 64), np.float32)
    with pytest.raises(ConfigError, match=r"takes inputs \['image'\]; unknown \['img'\]; missing \['image'\]"):
        r(img=img)
    with pytest.raises(ConfigError, match=r"'image' has dtype float64, expected float32: pass x.astype\(np.float32\)"):
        r(image=img.astype(np.float64))
    with pytest.raises(ConfigError, match=r"'image' has shape \[3, 64, 64\] \(rank 3\), expected rank 4"):
        r(image=img[0])
    with pytest.raises(ConfigError, match=r"axis 1 must be 3"):
        r(image=np.zeros((1, 4, 64, 64), np.float32))
    with pytest.raises(ConfigError, match=r"empty along axis 0"):
        r(image=img[:0])
    ids = np.ones((2, 8), np.int64)
    with pytest.raises(ConfigError, match=r"dim 'L' is 8 in 'input_ids' but 6 in 'attention_mask'"):
        bert(input_ids=ids, attention_mask=np.ones((2, 6), np.int64))
    with pytest.raises(ConfigError, match=r"token id 1000 is outside the vocabulary \[0, 1000\)"):
        bert(input_ids=np.full((1, 4), 1000, np.int64), attention_mask=np.ones((1, 4), np.int64))
    with pytest.raises(ConfigError, match=r"token id -1 is outside"):
        gpt(input_ids=np.full((1, 4), -1, np.int64))
    with pytest.raises(ConfigError, match=r"attention_mask must hold only 0 \(padding\) and 1"):
        bert(input_ids=ids, attention_mask=np.full((2, 8), 2, np.int64))
    with pytest.raises(ConfigError, match=r"sequence length 129 exceeds the 128 position embeddings"):
        gpt(input_ids=np.zeros((1, 129), np.int64))
    with pytest.raises(ConfigError, match=r"'input_ids' has dtype int32, expected int64"):
        gpt(input_ids=np.zeros((1, 4), np.int32))


def test_unknown_names_and_bad_arguments() -> None:
    """Unknown model -> NotFound listing the names; bad scale, seed, device, threads, batch -> ConfigError."""
    with pytest.raises(NotFound, match=r"no model 'resnet18' in the zoo; known: resnet50, yolo, fcn, .*logreg"):
        models.build("resnet18")
    for call in (models.info, models.param_count, models.path, models.load):
        with pytest.raises(NotFound, match="known: resnet50"):
            call("nope")
    with pytest.raises(ConfigError, match=r"scale 'medium' is not one of 'small', 'full'"):
        models.param_count("resnet50", "medium")
    for seed in (-1, 1.5, True, "0"):
        with pytest.raises(ConfigError, match=rf"seed {seed!r} must be a non-negative integer"):
            models.build("logreg", seed=seed)
    with pytest.raises(ConfigError, match=r"device 'tpu:0' is not understood: use 'cpu' or 'cuda:N'"):
        models.load("logreg", device="tpu:0")
    with pytest.raises(ConfigError, match=r"threads 0 must be a positive integer"):
        models.load("logreg", threads=0)


def test_cuda_without_gpu_onnxruntime_names_the_gpu_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """device='cuda:0' with engine='onnxruntime' but without its CUDA provider raises DependencyMissing
    naming the gpu extra; engine='auto' turns to torch, and without torch names the torch extra."""
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("onnxruntime-gpu is installed here")
    with pytest.raises(DependencyMissing, match=r"pip install 'gfaas\[gpu\]' onnxruntime-gpu"):
        models.load("logreg", device="cuda:0", cache_dir=tmp_path, engine="onnxruntime")
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(DependencyMissing, match=r"pip install 'gfaas\[torch\]'"):
        models.load("logreg", device="cuda:0", cache_dir=tmp_path)
    assert not list(tmp_path.iterdir())  # refused before building anything


def test_example_inputs_rejects_bad_batch(small: dict[str, models.Model]) -> None:
    """example_inputs(batch=0) is a ConfigError."""
    with pytest.raises(ConfigError, match=r"batch 0 must be a positive integer"):
        small["logreg"].example_inputs(batch=0)


def test_threads_setting_reaches_onnxruntime(tmp_path: Path) -> None:
    """load(threads=1) runs with one intra-op thread and gives the same outputs as the default."""
    a = models.load("resnet50", cache_dir=tmp_path, threads=1)
    b = models.load("resnet50", cache_dir=tmp_path)
    assert a.session.get_session_options().intra_op_num_threads == 1
    x = a.example_inputs()
    np.testing.assert_allclose(a(**x)["logits"], b(**x)["logits"], rtol=1e-5, atol=1e-5)


# ---- cache ------------------------------------------------------------------------------------------
class _CountBuilds:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, str, int]] = []
        real = zoo.build

        def counting(name: str, scale: str = "small", seed: int = 0, debug: bool = False) -> onnx.ModelProto:
            self.calls.append((name, scale, seed))
            return real(name, scale, seed, debug)

        monkeypatch.setattr(zoo, "build", counting)


def test_path_builds_once_and_reuses_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """path() writes <cache>/<name>-<scale>-<seed>-<version>.onnx once; later calls reuse it untouched."""
    builds = _CountBuilds(monkeypatch)
    p = models.path("yolo", "small", 2, cache_dir=tmp_path)
    assert p == tmp_path / f"yolo-small-2-{models.VERSION}.onnx"
    stat = p.stat()
    assert models.path("yolo", "small", 2, cache_dir=tmp_path) == p
    m = models.load("yolo", "small", 2, cache_dir=tmp_path)
    assert builds.calls == [("yolo", "small", 2)]
    assert p.stat().st_mtime_ns == stat.st_mtime_ns and p.stat().st_ino == stat.st_ino
    assert m.path == p
    assert sorted(x.name for x in tmp_path.iterdir()) == [p.name, p.name + ".sha256"]  # no temp files left
    assert onnx.load(str(p)).SerializeToString() == models.build("yolo", "small", 2).SerializeToString()


@pytest.mark.parametrize("damage", ["garbage", "truncate", "no_sidecar", "empty"])
def test_damaged_cache_file_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       caplog: pytest.LogCaptureFixture, damage: str) -> None:
    """A cache file that is overwritten, truncated, empty or unverified is rebuilt (with a warning)."""
    p = models.path("logreg", "full", 0, cache_dir=tmp_path)
    good = p.read_bytes()
    if damage == "garbage":
        p.write_bytes(bytes(255 - x for x in good))
    elif damage == "truncate":
        p.write_bytes(good[: len(good) // 2])
    elif damage == "empty":
        p.write_bytes(b"")
    else:
        p.with_name(p.name + ".sha256").unlink()
    builds = _CountBuilds(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="gfaas.models"):
        m = models.load("logreg", "full", 0, cache_dir=tmp_path)
    assert builds.calls == [("logreg", "full", 0)]
    assert p.read_bytes() == good
    assert any("damaged or unverified" in r.getMessage() and r.name == "gfaas.models" for r in caplog.records)
    assert m(**m.example_inputs())["prob"].shape == (1, 1)


def test_cache_dir_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache is $GFAAS_CACHE_DIR when set, else ~/.cache/gfaas/models."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv(cache.ENV, raising=False)
    assert models.resolve_cache_dir() == tmp_path / "home" / ".cache" / "gfaas" / "models"
    monkeypatch.setenv(cache.ENV, str(tmp_path / "env"))
    assert models.resolve_cache_dir() == tmp_path / "env"
    assert models.resolve_cache_dir(tmp_path / "arg") == tmp_path / "arg"
    p = models.path("logreg")
    assert p.parent == tmp_path / "env" and p.exists()
    assert oct(p.stat().st_mode & 0o777) == oct(0o644)


def test_library_prints_nothing(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Building, caching, loading and running write nothing to stdout or stderr."""
    m = models.load("bert_base", cache_dir=tmp_path)
    m(**m.example_inputs())
    models.load("efficientnet_b0", cache_dir=tmp_path)
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    assert not logging.getLogger("gfaas.models").handlers


def test_model_metadata_and_opset() -> None:
    """Built models carry name/scale/seed/version metadata and import the default domain at opset 17."""
    m = models.build("vit_b16", "small", seed=4)
    props = {p.key: p.value for p in m.metadata_props}
    assert props == {"gfaas.name": "vit_b16", "gfaas.scale": "small", "gfaas.seed": "4",
                     "gfaas.version": models.VERSION}
    assert [(o.domain, o.version) for o in m.opset_import] == [("", 17)]


def test_gpt2_lm_head_is_tied_to_the_token_embedding() -> None:
    """One initializer 'wte' feeds both the token Gather and the LM-head Gemm (transB=1)."""
    g = models.build("gpt2_small").graph
    users = sorted(n.op_type for n in g.node if "wte" in n.input)
    assert users == ["Gather", "Gemm"]
    assert sum(1 for t in g.initializer if 1000 in t.dims) == 1


# ---- full scale: only the quick ones ----------------------------------------------------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name,shapes", [
    ("resnet50", {"logits": (1, 1000)}),
    ("efficientnet_b0", {"logits": (1, 1000)}),
    ("yolo", {"boxes": (1, 2535, 4), "scores": (1, 2535, 80)}),
])
def test_full_vision_models_run_once(name: str, shapes: dict[str, tuple[int, ...]], tmp_path: Path) -> None:
    """ResNet-50, EfficientNet-B0 and YOLOv3-tiny at full scale build, load and run one 224/416 image."""
    m = models.load(name, "full", cache_dir=tmp_path)
    out = m(**m.example_inputs())
    assert {k: v.shape for k, v in out.items()} == shapes
    for v in out.values():
        assert np.isfinite(v).all()
    n_init = sum(math.prod(t.dims) for t in onnx.load(str(m.path)).graph.initializer)
    assert n_init >= models.param_count(name, "full")
    assert os.path.getsize(m.path) > 4 * models.param_count(name, "full")
