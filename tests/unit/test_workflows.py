"""The reference workflows: specs follow the spec rules, every pre/post-processing step matches an
independent oracle, inputs are deterministic, and the reference executor runs each workflow with its
conditional branches taken or skipped as the scalars say."""

from __future__ import annotations

import importlib
import importlib.util
import math
import re
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gfaas import workflows
from gfaas.errors import NotFound
from gfaas.runtime.context import in_process_context
from gfaas.runtime.spec import loads
from gfaas.units import format_decimal as human
from gfaas.workflows import detection, imaging, scenes, text
from gfaas.workflows.image import ensemble
from gfaas.workflows.sizes import edges
from gfaas.workflows.stub import StubModel, stub_models
from gfaas.workflows.yelp import sentences

NAMES = ["driving", "image", "social", "traffic", "video", "yelp"]
HAVE_ZOO = importlib.util.find_spec("gfaas.models") is not None


# ---- registry and specs -----------------------------------------------------------------------------
def test_registry_lists_the_six_workflows() -> None:
    """names() is the six reference workflows, sorted; each module names its spec."""
    assert workflows.names() == NAMES
    for n in NAMES:
        assert n == workflows.module(n).SPEC


@pytest.mark.parametrize("call", [workflows.spec_text, workflows.make_inputs, workflows.run_local, workflows.module])
def test_unknown_workflow_is_not_found(call: Any) -> None:
    """An unknown name raises NotFound listing the known workflows."""
    with pytest.raises(NotFound, match=r"no reference workflow 'nope'; known: driving, image, social, traffic"):
        call("nope")


_FN = re.compile(r"^[a-z][a-z0-9_]*$")
_WHEN = re.compile(r"^([a-z][a-z0-9_]*)\.([a-z_][a-z0-9_]*) (>|>=|<|<=|==|!=) (-?[0-9.]+)$")


def _sources(f: dict[str, Any]) -> list[tuple[str, str | None]]:
    out = []
    for src in f["inputs"].values():
        out.append((src, None) if isinstance(src, str) else (src["from"], src.get("when")))
    return out


@pytest.mark.parametrize("name", NAMES)
def test_spec_follows_the_rules(name: str) -> None:
    """Each spec: name matches, sources exist and come from earlier functions, handlers import, gpu
    functions name a model and cpu functions none, conditions are over upstream scalars, every
    output declares dtype and shape, and workflow outputs name declared outputs."""
    doc = yaml.safe_load(workflows.spec_text(name))
    assert doc["name"] == name and isinstance(doc["description"], str)
    assert set(doc) == {"name", "description", "inputs", "outputs", "functions"}
    declared: dict[str, dict[str, Any]] = {"input": doc["inputs"]}
    for f in doc["functions"]:
        assert _FN.match(f["name"]) and f["name"] not in declared
        assert f["kind"] in ("cpu", "gpu")
        assert (f["kind"] == "gpu") == bool(f.get("model")), f["name"]
        mod, attr = f["handler"].split(":")
        assert callable(getattr(importlib.import_module(mod), attr))
        for src, when in _sources(f):
            fn, out = src.split(".")
            assert out in declared[fn], f"{f['name']} reads {src}, not declared before it"
            if when is not None:
                m = _WHEN.match(when)
                assert m, when
                assert declared[m.group(1)][m.group(2)]["shape"] == []
        for decl in f["outputs"].values():
            np.dtype(decl["dtype"])
            assert isinstance(decl["shape"], list) and all(isinstance(d, int) and d >= -1 for d in decl["shape"])
        declared[f["name"]] = f["outputs"]
    for out, src in doc["outputs"].items():
        fn, o = src.split(".")
        assert fn != "input" and o in declared[fn], out
    # and the runtime's loader accepts it, in the same order
    assert [f.name for f in loads(workflows.spec_text(name)).functions] == [f["name"] for f in doc["functions"]]


@pytest.mark.skipif(not HAVE_ZOO, reason="gfaas.models (the model zoo) is not in this checkout yet")
@pytest.mark.parametrize("name", NAMES)
def test_spec_models_are_in_the_zoo(name: str) -> None:
    """Every model a spec names is a model zoo name."""
    models = importlib.import_module("gfaas.models")
    doc = yaml.safe_load(workflows.spec_text(name))
    for f in doc["functions"]:
        if f.get("model"):
            assert f["model"] in models.names(), f["model"]


def test_specs_are_package_data() -> None:
    """The specs are read from the installed package (importlib.resources), one file per workflow."""
    from importlib import resources

    files = sorted(p.name for p in (resources.files("gfaas.workflows") / "specs").iterdir() if p.name.endswith(".yaml"))
    assert files == [f"{n}.yaml" for n in NAMES]


# ---- resize -----------------------------------------------------------------------------------------
def test_bilinear_upsample_known_values() -> None:
    """2x2 -> 4x4 with half-pixel centres and clamped edges gives OpenCV's INTER_LINEAR values."""
    a = np.array([[0.0, 1.0], [2.0, 3.0]])
    want = np.array([[0, 0.25, 0.75, 1], [0.5, 0.75, 1.25, 1.5], [1.5, 1.75, 2.25, 2.5], [2, 2.25, 2.75, 3]])
    np.testing.assert_allclose(imaging.resize(a, 4, 4, "bilinear", channels_last=False), want)


def test_area_downsample_known_values() -> None:
    """Area resize averages whole blocks, and weights partial pixels by their overlap."""
    b = np.arange(16.0).reshape(4, 4)
    np.testing.assert_allclose(imaging.resize(b, 2, 2, "area", channels_last=False), [[2.5, 4.5], [10.5, 12.5]])
    # 3 -> 2: outputs cover [0, 1.5) and [1.5, 3): (0 + 3/2) / 1.5 = 1 and (3/2 + 6) / 1.5 = 5
    np.testing.assert_allclose(imaging.resize(np.array([[0.0, 3.0, 6.0]]), 1, 2, "area", channels_last=False),
                               [[1.0, 5.0]])


def test_nearest_and_identity() -> None:
    """Nearest keeps the dtype and picks centre samples; resizing to the same size changes nothing."""
    c = np.arange(6, dtype=np.uint8).reshape(2, 3)
    np.testing.assert_array_equal(imaging.resize(c, 4, 3, "nearest", channels_last=False),
                                  [[0, 1, 2], [0, 1, 2], [3, 4, 5], [3, 4, 5]])
    img = np.random.default_rng(0).random((5, 7, 3)).astype(np.float32)
    np.testing.assert_array_equal(imaging.resize(img, 5, 7), img)


def _bilinear_loop(img: np.ndarray, h: int, w: int) -> np.ndarray:
    ih, iw = img.shape[:2]
    out = np.zeros((h, w, img.shape[2]))
    for y in range(h):
        sy = min(max((y + 0.5) * ih / h - 0.5, 0), ih - 1)
        y0 = int(math.floor(sy))
        y1, ty = min(y0 + 1, ih - 1), sy - y0
        for x in range(w):
            sx = min(max((x + 0.5) * iw / w - 0.5, 0), iw - 1)
            x0 = int(math.floor(sx))
            x1, tx = min(x0 + 1, iw - 1), sx - x0
            out[y, x] = ((1 - ty) * ((1 - tx) * img[y0, x0] + tx * img[y0, x1])
                         + ty * ((1 - tx) * img[y1, x0] + tx * img[y1, x1]))
    return out


def _area_loop(img: np.ndarray, h: int, w: int) -> np.ndarray:
    ih, iw = img.shape[:2]
    sy, sx = ih / h, iw / w
    out = np.zeros((h, w, img.shape[2]))
    for y in range(h):
        for x in range(w):
            acc = np.zeros(img.shape[2])
            for yy in range(ih):
                oy = max(0.0, min((y + 1) * sy, yy + 1) - max(y * sy, yy))
                for xx in range(iw):
                    ox = max(0.0, min((x + 1) * sx, xx + 1) - max(x * sx, xx))
                    acc += oy * ox * img[yy, xx]
            out[y, x] = acc / (sy * sx)
    return out


@given(st.integers(1, 9), st.integers(1, 9), st.integers(1, 9), st.integers(1, 9), st.integers(0, 2**31))
@settings(max_examples=40, deadline=None)
def test_resize_matches_direct_loops(ih: int, iw: int, h: int, w: int, seed: int) -> None:
    """Vectorised bilinear and area resizes equal per-pixel loops of their definitions."""
    img = np.random.default_rng(seed).random((ih, iw, 2))
    np.testing.assert_allclose(imaging.resize(img, h, w, "bilinear"), _bilinear_loop(img, h, w), atol=1e-12)
    np.testing.assert_allclose(imaging.resize(img, h, w, "area"), _area_loop(img, h, w), atol=1e-12)


def test_to_model_input_layout_and_normalisation() -> None:
    """Frames become NCHW float32, normalised with the ImageNet mean and std."""
    frames = np.full((2, 4, 6, 3), 255, dtype=np.uint8)
    x = imaging.to_model_input(frames, 3, 5)
    assert x.shape == (2, 3, 3, 5) and x.dtype == np.float32 and x.flags.c_contiguous
    np.testing.assert_allclose(x[1, :, 2, 4], (1 - imaging.MEAN) / imaging.STD, rtol=1e-6)


# ---- filters ----------------------------------------------------------------------------------------
def _filter_loop(img: np.ndarray, fn: Any) -> np.ndarray:
    h, w, c = img.shape
    out = np.zeros(img.shape)
    for y in range(h):
        for x in range(w):
            for ch in range(c):
                win = [[img[min(max(y + dy, 0), h - 1), min(max(x + dx, 0), w - 1), ch] for dx in (-1, 0, 1)]
                       for dy in (-1, 0, 1)]
                out[y, x, ch] = fn(np.array(win, dtype=np.float64))
    return out


def test_median3x3_matches_direct_loop() -> None:
    """The median filter equals the median of each replicated-edge 3x3 window, per channel."""
    img = np.random.default_rng(1).integers(0, 256, size=(7, 9, 3), dtype=np.uint8)
    out = imaging.median3x3(img)
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out, _filter_loop(img, np.median))
    batch = np.stack([img, img[::-1]])
    np.testing.assert_array_equal(imaging.median3x3(batch)[1], imaging.median3x3(img[::-1]))


@given(st.integers(0, 2**31))
@settings(max_examples=30, deadline=None)
def test_median3x3_with_ties_matches_np_median(seed: int) -> None:
    """The selection network agrees with np.median on every window, also with many tied values."""
    img = np.random.default_rng(seed).integers(0, 4, size=(5, 6, 2)).astype(np.uint8)
    np.testing.assert_array_equal(imaging.median3x3(img), _filter_loop(img, np.median))


def test_median3x3_removes_salt_and_pepper() -> None:
    """Isolated black/white pixels on a flat image vanish."""
    img = np.full((10, 10, 3), 100, dtype=np.uint8)
    img[2, 3] = 255
    img[6, 7] = 0
    np.testing.assert_array_equal(imaging.median3x3(img), np.full((10, 10, 3), 100))


def test_gaussian3x3_matches_direct_loop() -> None:
    """The blur equals the [1,2,1] x [1,2,1] / 16 weighted sum of each replicated-edge window."""
    img = np.random.default_rng(2).integers(0, 256, size=(6, 8, 3)).astype(np.uint8)
    k = np.outer([1, 2, 1], [1, 2, 1]) / 16
    np.testing.assert_allclose(imaging.gaussian3x3(img), _filter_loop(img, lambda win: (win * k).sum()), rtol=1e-5)


# ---- NMS and detection ------------------------------------------------------------------------------
def _iou_py(a: list[float], b: list[float]) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = max(0.0, a[2] - a[0]) * max(0.0, a[3] - a[1]) + max(0.0, b[2] - b[0]) * max(0.0, b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _nms_brute(boxes: list[list[float]], scores: list[float], thr: float) -> list[int]:
    order = sorted(range(len(boxes)), key=lambda i: (-scores[i], i))
    keep: list[int] = []
    for i in order:
        if all(_iou_py(boxes[i], boxes[j]) <= thr for j in keep):
            keep.append(i)
    return keep


_box = st.tuples(st.integers(0, 20), st.integers(0, 20), st.integers(0, 12), st.integers(0, 12)).map(
    lambda t: [float(t[0]), float(t[1]), float(t[0] + t[2]), float(t[1] + t[3])])


@given(st.lists(st.tuples(_box, st.sampled_from([0.1, 0.5, 0.5, 0.9, 0.3])), max_size=25),
       st.sampled_from([0.0, 0.3, 0.45, 0.7, 1.0]))
@settings(max_examples=200, deadline=None)
def test_nms_matches_brute_force(items: list[tuple[list[float], float]], thr: float) -> None:
    """Greedy NMS keeps exactly the boxes the definition keeps, in visiting order (ties: lower index)."""
    boxes, scores = [b for b, _ in items], [s for _, s in items]
    got = detection.nms(np.array(boxes).reshape(-1, 4), np.array(scores), thr)
    assert got.dtype == np.int64
    assert got.tolist() == _nms_brute(boxes, scores, thr)


def test_iou_known_values() -> None:
    """Half-overlapping unit squares have IoU 1/3; disjoint 0; empty boxes 0."""
    np.testing.assert_allclose(detection.iou(np.array([0, 0, 2, 2]), np.array([[1, 0, 3, 2], [5, 5, 6, 6],
                                                                               [0, 0, 0, 0]])), [1 / 3, 0, 0])


def test_saturated_fraction_matches_count() -> None:
    """The summed-area lookup equals counting coloured pixels under each clipped box."""
    rng = np.random.default_rng(3)
    frame = rng.random((20, 30, 3)).astype(np.float32)
    table = detection.saturation_integral(frame, 0.5)
    sat = (frame.max(-1) - frame.min(-1)) > 0.5
    boxes = np.array([[0, 0, 30, 20], [3.2, 4.7, 11.1, 9.0], [-5, -5, 4, 4], [10, 10, 10, 15]])
    want = []
    for x1, y1, x2, y2 in boxes:
        xa, ya = int(np.clip(np.floor(x1), 0, 30)), int(np.clip(np.floor(y1), 0, 20))
        xb, yb = int(np.clip(np.ceil(x2), 0, 30)), int(np.clip(np.ceil(y2), 0, 20))
        area = (xb - xa) * (yb - ya)
        want.append(sat[ya:yb, xa:xb].sum() / area if area else 0.0)
    np.testing.assert_allclose(detection.saturated_fraction(table, boxes), want)


def test_detect_objects_thresholds_nms_and_saliency() -> None:
    """One coloured object: its best box survives (mapped to frame pixels), a lower-scored duplicate is
    suppressed, a box over grey road, a tiny box and a low-scoring box are dropped."""
    frame = np.full((100, 200, 3), 0.4, dtype=np.float32)
    frame[20:60, 40:120] = [0.9, 0.1, 0.1]
    # detector input 50x50 -> frame 100x200: x scales by 4, y by 2
    boxes = np.array([[20, 20, 20, 20],      # (40, 20)-(120, 60): the object
                      [21, 20, 20, 20],      # shifted 4 px: IoU 0.9 with the first
                      [40, 40, 10, 10],      # over grey road
                      [20, 20, 0.5, 0.5],    # 2 px wide
                      [20, 20, 18, 18]],     # on the object but scored under the threshold
                     dtype=np.float32)
    scores = np.zeros((5, 80), dtype=np.float32)
    scores[:, 3] = [0.8, 0.7, 0.95, 0.9, 0.05]
    scores[0, 0] = 0.2  # person lower than motorcycle: class 3 wins
    p = detection.DetectParams(score_threshold=0.1)
    d = detection.detect_objects(boxes, scores, frame, (50, 50), ((0,), (2, 3, 5, 7)), p)
    np.testing.assert_allclose(d, [[40, 20, 120, 60, 0.8, 3]])
    d_person = detection.detect_objects(boxes, scores, frame, (50, 50), ((0,),), p)
    np.testing.assert_allclose(d_person, [[40, 20, 120, 60, 0.2, 0]])


def test_detect_objects_caps_each_group() -> None:
    """At most max_detections per class group survive, best first, so a group with higher scores all
    round cannot crowd out another: three disjoint cars and two disjoint people, cap 2."""
    frame = np.full((40, 200, 3), 0.4, dtype=np.float32)
    frame[:, :] = [0.9, 0.1, 0.1]  # all coloured
    boxes = np.array([[20 + 40 * i, 20, 20, 20] for i in range(5)], dtype=np.float32)
    scores = np.zeros((5, 80), dtype=np.float32)
    scores[[0, 1, 2], 2] = [0.9, 0.95, 0.8]   # cars
    scores[[3, 4], 0] = [0.3, 0.4]            # people, all below every car
    p = detection.DetectParams(score_threshold=0.1, max_detections=2)
    d = detection.detect_objects(boxes, scores, frame, (40, 200), ((0,), (2, 3, 5, 7)), p)
    assert d[:, 4].tolist() == pytest.approx([0.95, 0.9, 0.4, 0.3])
    assert d[:, 5].tolist() == [2, 2, 0, 0]
    one = detection.detect_objects(boxes, scores, frame, (40, 200), ((0, 2, 3, 5, 7),), p)
    assert one[:, 5].tolist() == [2, 2]


def test_detect_params_from_spec_params() -> None:
    """Spec params override the defaults with the field's type; other keys are ignored."""
    p = detection.DetectParams.from_params({"max_detections": 2, "iou_threshold": 0.3, "crop_size": 9})
    assert (p.max_detections, p.iou_threshold, p.min_coloured) == (2, 0.3, 0.3)
    assert isinstance(p.max_detections, int)


def test_crop_resize_takes_the_box() -> None:
    """A crop of a box of constant colour is that colour; boxes are clipped to the frame."""
    frame = np.zeros((10, 10, 3), dtype=np.float32)
    frame[2:6, 3:8] = 1.0
    np.testing.assert_allclose(imaging.crop_resize(frame, np.array([3, 2, 8, 6]), 4, 4), 1.0)
    assert imaging.crop_resize(frame, np.array([-5, -5, 50, 50]), 5, 5).mean() == pytest.approx(0.2)


# ---- palette, softmax, ensemble ---------------------------------------------------------------------
def test_palette_known_colours() -> None:
    """The VOC colour map: background black, aeroplane (128,0,0), person (15) (192,128,128)."""
    pal = imaging.palette(21)
    assert pal.dtype == np.uint8 and pal.shape == (21, 3)
    assert pal[[0, 1, 2, 3, 15, 20]].tolist() == [[0, 0, 0], [128, 0, 0], [0, 128, 0], [128, 128, 0],
                                                  [192, 128, 128], [0, 64, 128]]
    assert len({tuple(c) for c in pal}) == 21


def test_colourise_blends_non_background() -> None:
    """Class pixels become round((frame + colour) / 2) at alpha 0.5; background keeps the frame."""
    frames = np.full((1, 2, 2, 3), 100, dtype=np.uint8)
    classes = np.array([[[0, 1], [15, 2]]], dtype=np.uint8)
    out = imaging.colourise(classes, frames, 0.5)
    assert out.dtype == np.uint8
    assert out[0].tolist() == [[[100, 100, 100], [114, 50, 50]], [[146, 114, 114], [50, 114, 50]]]


def test_softmax_and_ensemble_sum_to_one() -> None:
    """Softmax rows sum to 1; the ensemble is the mean of the members' softmaxes and sums to 1."""
    rng = np.random.default_rng(4)
    logits = [rng.normal(size=1000).astype(np.float32) * 5 for _ in range(3)]
    probs = ensemble(logits)
    assert probs.dtype == np.float32 and probs.sum() == pytest.approx(1.0, abs=1e-5)
    want = sum(np.exp(lg - lg.max()) / np.exp(lg - lg.max()).sum() for lg in logits) / 3
    np.testing.assert_allclose(probs, want, rtol=1e-5)
    np.testing.assert_allclose(imaging.softmax(np.array([[1000.0, 1000.0], [0.0, math.log(3)]])),
                               [[0.5, 0.5], [0.25, 0.75]])
    weighted = ensemble(logits, [1, 0, 0])
    np.testing.assert_allclose(weighted, imaging.softmax(logits[0]), rtol=1e-5)
    with pytest.raises(ValueError, match="weights"):
        ensemble(logits, [1, 1])


def test_top5_order() -> None:
    """Top-k is largest first, ties broken by the lower index."""
    p = np.array([0.1, 0.3, 0.05, 0.3, 0.2, 0.05])
    assert imaging.top_k(p, 5).tolist() == [1, 3, 4, 0, 2]


# ---- text: font, OCR, tokenizer ---------------------------------------------------------------------
def test_font_is_readable_by_construction() -> None:
    """Every glyph has contiguous inked columns and a unique trimmed bitmap; letters and digits span
    all seven rows (that is how OCR infers the scale)."""
    glyphs = text.font()
    seen = set()
    for ch, g in glyphs.items():
        assert g.ink.any(axis=0).all(), ch
        key = (g.ink.shape, g.ink.tobytes())
        assert key not in seen, ch
        seen.add(key)
        if ch.isalnum():
            assert g.bitmap[0].any() and g.bitmap[-1].any(), ch
    assert len(glyphs) == 42


def test_projection_profiles_find_the_rendered_lines() -> None:
    """Line detection returns exactly the renderer's tight line boxes."""
    r = text.render("HELLO, WORLD! IT'S 2024 - READY? YES.", (96, 128), 1, 4, np.random.default_rng(0))
    assert r.lines == ("HELLO, WORLD! IT'S", "2024 - READY? YES.")
    assert text.detect_lines(text.ink_mask(r.image)) == list(r.boxes)
    assert r.boxes[0] == (4, 4, 11, 4 + 17 * 6 + 5)


_ALNUM = st.sampled_from("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_word = st.tuples(st.text(alphabet=text.CHARSET.replace(" ", ""), max_size=4), _ALNUM,
                  st.text(alphabet=text.CHARSET.replace(" ", ""), max_size=3)).map("".join)


@given(st.lists(_word, min_size=1, max_size=10), st.integers(1, 3), st.integers(0, 2**31))
@settings(max_examples=40, deadline=None)
def test_ocr_reads_back_rendered_text(words: list[str], scale: int, seed: int) -> None:
    """OCR of a rendered string returns the string exactly and the rendered line boxes (words hold a
    letter or digit, so every line is seven cells tall: OCR's documented precondition)."""
    s = " ".join(words)
    r = text.render(s, (60 * scale + 40, 300), scale, 5, np.random.default_rng(seed), line_gap=2)
    got, boxes = text.ocr(r.image)
    assert got == s
    assert boxes == list(r.boxes)


def test_ocr_of_a_blank_image_is_empty() -> None:
    assert text.ocr(np.full((40, 60, 3), 230, dtype=np.uint8)) == ("", [])


@given(st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=60))
def test_tokenizer_round_trip(s: str) -> None:
    """Printable ASCII encodes to ids in [4, 99) and decodes back exactly."""
    ids = text.encode(s)
    assert ids.dtype == np.int64 and len(ids) == len(s)
    assert all(4 <= i < text.VOCAB_NEEDED for i in ids.tolist())
    assert text.decode(ids) == s


def test_tokenizer_specials_and_unknown() -> None:
    """Non-ASCII maps to UNK (decoded as U+FFFD); PAD, CLS and SEP decode to nothing."""
    assert text.encode("é").tolist() == [text.UNK]
    assert text.decode([text.CLS, 37, text.SEP, text.PAD]) == "A"
    ids, mask = text.bert_batch([np.array([5, 6, 7]), np.array([8])], 4)
    assert ids.tolist() == [[2, 5, 6, 3], [2, 8, 3, 0]]
    assert mask.tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    ids, _ = text.bert_batch([np.array([5]), np.array([6, 7, 8])], None)
    assert ids.shape == (2, 5)


def test_sentence_split() -> None:
    assert sentences("Good food. Bad service!  Why?? ok... end") == ["Good food.", "Bad service!", "Why??", "ok...",
                                                                     "end"]


# ---- inputs -----------------------------------------------------------------------------------------
SMALL_SHAPES = {"driving": {"frames": (4, 96, 128, 3)}, "image": {"image": (96, 128, 3)},
                "social": {"image": (96, 128, 3)}, "traffic": {"video": (4, 96, 128, 3)},
                "video": {"clip": (8, 96, 128, 3)}, "yelp": {"review": None}}
FULL_SHAPES = {"driving": {"frames": (4, 1080, 1920, 3)}, "image": {"image": (1080, 1920, 3)},
               "social": {"image": (1080, 1920, 3)}, "traffic": {"video": (4, 1080, 1920, 3)},
               "video": {"clip": (8, 720, 1280, 3)}, "yelp": {"review": None}}


@pytest.mark.parametrize("name", NAMES)
def test_make_inputs_deterministic_and_seeded(name: str) -> None:
    """The same seed gives identical arrays, another seed different ones; shapes and dtypes per scale
    fit the spec's declared inputs."""
    a, b, c = (workflows.make_inputs(name, s) for s in (0, 0, 1))
    assert a.keys() == b.keys() == c.keys()
    decl = loads(workflows.spec_text(name)).inputs
    assert set(a) == set(decl)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
        assert not np.array_equal(a[k], c[k])
        decl[k].check(a[k], k)
        if SMALL_SHAPES[name][k] is not None:
            assert a[k].shape == SMALL_SHAPES[name][k]


@pytest.mark.parametrize("name", NAMES)
def test_make_inputs_full_scale_shapes(name: str) -> None:
    """Full scale: 1080p frames (720p for video), 8 frames for clips, longer reviews."""
    full = workflows.make_inputs(name, 0, "full")
    decl = loads(workflows.spec_text(name)).inputs
    for k, v in full.items():
        decl[k].check(v, k)
        if FULL_SHAPES[name][k] is not None:
            assert v.shape == FULL_SHAPES[name][k]
    if name == "yelp":
        assert len(sentences(full["review"].tobytes().decode())) == 5
    with pytest.raises(ValueError, match="scale 'huge'"):
        workflows.make_inputs(name, 0, "huge")


def test_social_inputs_read_back() -> None:
    """The social image holds exactly the seed's sentences, which OCR reads back."""
    from gfaas.workflows.social import post_text

    for seed in (0, 1):
        img = workflows.make_inputs("social", seed)["image"]
        assert text.ocr(img)[0] == post_text(seed, 2)


# ---- handlers and run_local with stand-in models ----------------------------------------------------
class OnlyClass:
    """A YOLO stand-in whose scores favour one class: lets a test decide which branch fires."""

    def __init__(self, cls: int) -> None:
        self.inner = StubModel("yolo")
        self.info = self.inner.info
        self.cls = cls

    def __call__(self, **feeds: np.ndarray) -> dict[str, np.ndarray]:
        out = self.inner(**feeds)
        out["scores"][..., self.cls] += 1.0
        return out


def _decls(name: str) -> dict[str, Any]:
    spec = loads(workflows.spec_text(name))
    return {k: spec.function(fn).outputs[o] for k, (fn, o) in spec.outputs.items()}


@pytest.mark.parametrize("name", NAMES)
def test_run_local_outputs_have_declared_types(name: str) -> None:
    """Every workflow runs end to end at small scale; its outputs carry the declared dtypes and shapes,
    and every edge's byte count is the size of the array it carried."""
    r = workflows.run_local(name, models=stub_models())
    decls = _decls(name)
    assert set(r["outputs"]) == {k for k, (fn, _) in loads(workflows.spec_text(name)).outputs.items()
                                 if fn not in r["skipped"]}
    for k, v in r["outputs"].items():
        decls[k].check(v, k)
    assert r["ran"] + r["skipped"] and set(r["ran"]) | set(r["skipped"]) == {
        f["name"] for f in yaml.safe_load(workflows.spec_text(name))["functions"]}
    for e in r["edges"]:
        assert e["nbytes"] == math.prod(e["shape"]) * np.dtype(e["dtype"]).itemsize


def test_traffic_branches_follow_the_counts() -> None:
    """Each recogniser runs iff its count is positive, and labels one crop per detection of its kind."""
    seen = set()
    for seed in range(4):
        r = workflows.run_local("traffic", seed, models=stub_models())
        s = r["scalars"]
        assert ("recog_person" in r["ran"]) == (s["detect.num_persons"] > 0)
        assert ("recog_vehicle" in r["ran"]) == (s["detect.num_vehicles"] > 0)
        dets = r["outputs"]["detections"]
        assert (dets[:, 6] == 0).sum() == s["detect.num_persons"]
        if "recog_person" in r["ran"]:
            assert len(r["outputs"]["persons"]) == s["detect.num_persons"]
        seen.add(s["detect.num_vehicles"] > 0)
    assert True in seen


def test_traffic_empty_road_skips_both_recognisers() -> None:
    """A road without objects gives no detections, so both recognisers are skipped and their outputs
    are absent."""
    empty = {"video": scenes.road_frames(5, 8, scenes.SMALL_HW, vehicles=0, persons=0)}
    r = workflows.run_local("traffic", inputs=empty, models=stub_models())
    assert r["ran"] == ["decode", "preprocess", "detect"]
    assert r["skipped"] == ["recog_person", "recog_vehicle"]
    assert r["scalars"] == {"detect.num_persons": 0.0, "detect.num_vehicles": 0.0}
    assert set(r["outputs"]) == {"detections"} and r["outputs"]["detections"].shape == (0, 7)


def test_traffic_one_branch_only() -> None:
    """A detector that only sees cars runs the vehicle recogniser and skips the person one."""
    models = stub_models()
    r = workflows.run_local("traffic", models=lambda n, s: OnlyClass(2) if n == "yolo" else models(n, s))
    assert r["skipped"] == ["recog_person"] and "recog_vehicle" in r["ran"]
    assert r["scalars"]["detect.num_vehicles"] > 0
    assert set(r["outputs"]) == {"detections", "vehicles", "vehicle_probs"}


def test_social_blank_image_skips_bert() -> None:
    """No text -> num_tokens 0 -> BERT is skipped; with text, BERT's probabilities sum to 1."""
    blank = {"image": np.full((96, 128, 3), 230, dtype=np.uint8)}
    r = workflows.run_local("social", inputs=blank, models=stub_models())
    assert r["skipped"] == ["bert"] and r["scalars"] == {"ocr.num_tokens": 0.0}
    assert set(r["outputs"]) == {"text", "lines"} and r["outputs"]["text"].size == 0
    r = workflows.run_local("social", models=stub_models())
    assert r["ran"] == ["ocr", "bert"]
    assert r["outputs"]["sentiment"].sum() == pytest.approx(1.0)
    from gfaas.workflows.social import post_text

    assert r["outputs"]["text"].tobytes().decode() == post_text(0, 2)


def test_video_fan_in_counts_faces_per_chunk() -> None:
    """Recognition labels every face of the four chunks; per_chunk matches the detectors' counts."""
    r = workflows.run_local("video", models=stub_models())
    per = r["outputs"]["faces_per_chunk"].tolist()
    assert per == [int(r["scalars"][f"detect_face_{i}.num_faces"]) for i in range(4)]
    assert len(r["outputs"]["identities"]) == sum(per) > 0


def test_driving_overlay_matches_classes() -> None:
    """The overlay is the denoised frame where the class is background and the blend elsewhere."""
    inputs = workflows.make_inputs("driving")
    r = workflows.run_local("driving", inputs=inputs, models=stub_models())
    cls, over = r["outputs"]["classes"], r["outputs"]["overlay"]
    den = imaging.median3x3(inputs["frames"])
    np.testing.assert_array_equal(over, imaging.colourise(cls, den, 0.5))
    assert cls.shape == den.shape[:3] and len(np.unique(cls)) > 1


def test_yelp_filters_spam_rows() -> None:
    """A sentence is dropped iff BERT's spam probability reaches the threshold and it carries an
    advertising marker; with a threshold of 0 that is exactly the planted advertising sentence, with
    a threshold above every probability nothing is dropped."""
    from gfaas.workflows import yelp

    model = StubModel("bert_base")
    review = workflows.make_inputs("yelp")["review"]
    parts = sentences(review.tobytes().decode())
    ads = [yelp.has_ad_marker(x) for x in parts]
    assert len(parts) == 4 and sum(ads) == 1 and sum(x in yelp.SPAM for x in parts) == 1
    outs = {}
    for thr in (0.0, 1.01):
        ctx, refs = in_process_context({"review": review}, params={"spam_threshold": thr}, model=model)
        outs[thr] = yelp.filter_spam(ctx, refs)
    assert outs[0.0]["num_kept"] == 3 and outs[0.0]["input_ids"].shape == (3, 32)
    kept_text = [text.decode(row) for row in outs[0.0]["input_ids"]]
    assert kept_text == [x for x, ad in zip(parts, ads, strict=True) if not ad]
    assert outs[1.01]["num_kept"] == 4 and outs[0.0]["spam_prob"].shape == (4,)
    empty = np.zeros((0, 32), dtype=np.int64)
    ctx, refs = in_process_context({"input_ids": empty, "attention_mask": empty}, model=model)
    assert yelp.score_sentiment(ctx, refs)["positive"] == np.float32(0.5)


def test_run_local_is_deterministic() -> None:
    """Two runs of the same workflow and seed give identical outputs."""
    a = workflows.run_local("traffic", 1, models=stub_models())
    b = workflows.run_local("traffic", 1, models=stub_models())
    assert a["ran"] == b["ran"]
    for k in a["outputs"]:
        np.testing.assert_array_equal(a["outputs"][k], b["outputs"][k])


def test_classify_resizes_to_the_models_input() -> None:
    """A classifier handler feeds the model exactly the shape its info declares."""
    from gfaas.workflows.image import classify

    class Recorder:
        info = SimpleNamespace(inputs={"image": ((1, 3, 40, 48), "float32")})
        seen: list[tuple[int, ...]] = []

        def __call__(self, **feeds: np.ndarray) -> dict[str, np.ndarray]:
            self.seen.append(feeds["image"].shape)
            return {"logits": np.zeros((1, 1000), np.float32)}

    model = Recorder()
    ctx, refs = in_process_context({"image": np.zeros((96, 128, 3), np.float32)}, model=model)
    assert classify(ctx, refs)["logits"].shape == (1000,)
    assert model.seen == [(1, 3, 40, 48)]


def test_run_model_chunks_a_fixed_batch() -> None:
    """A model with a fixed batch of 2 is fed 5 rows as 2 + 2 + 2 (last padded) and the outputs are
    stitched back to 5 rows, in order."""
    from gfaas.workflows._util import run_model

    class Fixed:
        info = SimpleNamespace(inputs={"image": ((2, 1), "float32")})
        calls: list[int] = []

        def __call__(self, image: np.ndarray) -> dict[str, np.ndarray]:
            assert image.shape == (2, 1)
            self.calls.append(len(image))
            return {"y": image * 10}

    m = Fixed()
    out = run_model(m, image=np.arange(5, dtype=np.float32).reshape(5, 1))
    assert out["y"].ravel().tolist() == [0, 10, 20, 30, 40] and m.calls == [2, 2, 2]


def test_edge_sizes() -> None:
    """The size table lists each edge plus the outputs returned to the caller, with exact bytes."""
    rows = edges("driving", "small", stub=True)
    assert [(e["from"], e["to"]) for e in rows] == [
        ("input.frames", "denoise.frames"), ("denoise.frames", "segment.frames"), ("segment.logits", "colour.logits"),
        ("denoise.frames", "colour.frames"), ("overlay", "caller"), ("classes", "caller")]
    assert rows[2]["nbytes"] == 4 * 21 * 64 * 64 * 4
    assert [human(n) for n in (12, 4000, 99_532_800, 2 * 10**9)] == ["12 B", "4.00 KB", "99.53 MB", "2.00 GB"]


# ---- with the real model zoo ------------------------------------------------------------------------
@pytest.mark.skipif(not HAVE_ZOO, reason="gfaas.models (the model zoo) is not in this checkout yet")
@pytest.mark.parametrize("name", NAMES)
def test_run_local_with_the_zoo(name: str) -> None:
    """With the zoo's small models every workflow runs and returns its declared types."""
    r = workflows.run_local(name)
    for k, v in r["outputs"].items():
        _decls(name)[k].check(v, k)


CHAIN = """
name: chain
inputs: {x: {dtype: float64, shape: [-1]}}
outputs: {n: a.n, y: c.y}
functions:
  - {name: c, kind: cpu, handler: "wf_chain_handlers:double", inputs: {x: b.y}, outputs: {y: {dtype: float64, shape: [-1]}}}
  - {name: a, kind: cpu, handler: "wf_chain_handlers:count", inputs: {x: input.x},
     outputs: {y: {dtype: float64, shape: [-1]}, n: {dtype: int64, shape: []}}}
  - name: b
    kind: gpu
    model: m
    handler: "wf_chain_handlers:double"
    inputs: {x: {from: a.y, when: "a.n >= 3"}}
    outputs: {y: {dtype: float64, shape: [-1]}}
"""


@pytest.fixture
def chain(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    mod = types.ModuleType("wf_chain_handlers")
    mod.count = lambda ctx, i: {"y": ctx.get(i["x"]).copy(), "n": np.int64(len(ctx.get(i["x"])))}  # type: ignore[attr-defined]
    mod.double = lambda ctx, i: {"y": ctx.get(i["x"]) * 2}  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wf_chain_handlers", mod)
    monkeypatch.setattr(workflows, "_NAMES", (*workflows._NAMES, "chain"))
    monkeypatch.setattr(workflows, "spec_text", lambda name: CHAIN)


@pytest.mark.usefixtures("chain")
def test_run_local_skips_below_a_false_condition() -> None:
    """Functions are run producers first whatever the listing order; a false condition skips its
    function and everything that reads from it, and their workflow outputs are absent."""
    r = workflows.run_local("chain", inputs={"x": np.ones(2)}, models={"m": object()})
    assert (r["ran"], r["skipped"], r["scalars"]) == (["a"], ["b", "c"], {"a.n": 2.0})
    assert list(r["outputs"]) == ["n"]
    r = workflows.run_local("chain", inputs={"x": np.ones(3)}, models={"m": object()})
    assert (r["ran"], r["skipped"]) == (["a", "b", "c"], [])
    np.testing.assert_array_equal(r["outputs"]["y"], [4.0, 4.0, 4.0])


@pytest.mark.usefixtures("chain")
def test_run_local_checks_declared_types() -> None:
    """An output whose dtype differs from its declaration is refused, naming function and output."""
    from gfaas.errors import SpecError

    with pytest.raises(SpecError, match=r"function 'a' output 'y': dtype int64, declared float64"):
        workflows.run_local("chain", inputs={"x": np.ones(3, dtype=np.int64)}, models={"m": object()})


@pytest.mark.skipif(not HAVE_ZOO, reason="gfaas.models (the model zoo) is not in this checkout yet")
def test_zoo_branches_follow_the_inputs() -> None:
    """With the zoo's small models: a busy road runs both recognisers, an empty road skips both; a
    caption runs BERT, a blank image skips it; the ensemble's probabilities sum to 1."""
    r = workflows.run_local("traffic", 0)
    assert r["skipped"] == [] and r["scalars"]["detect.num_persons"] > 0 and r["scalars"]["detect.num_vehicles"] > 0
    assert len(r["outputs"]["persons"]) == r["scalars"]["detect.num_persons"]
    empty = {"video": scenes.road_frames(5, 8, scenes.SMALL_HW, vehicles=0, persons=0)}
    assert workflows.run_local("traffic", inputs=empty)["skipped"] == ["recog_person", "recog_vehicle"]
    r = workflows.run_local("social", 0)
    assert r["ran"] == ["ocr", "bert"] and r["outputs"]["sentiment"].sum() == pytest.approx(1.0)
    blank = {"image": np.full((96, 128, 3), 230, dtype=np.uint8)}
    assert workflows.run_local("social", inputs=blank)["skipped"] == ["bert"]
    assert workflows.run_local("image", 0)["outputs"]["probs"].sum() == pytest.approx(1.0, abs=1e-5)
    r = workflows.run_local("yelp", 0)
    assert r["scalars"]["bert_filter.num_kept"] == 3 and r["outputs"]["sentiment"].shape == (3, 2)
