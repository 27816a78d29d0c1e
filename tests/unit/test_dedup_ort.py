"""gfaas.dedup.ort and models.load(shared=True): same outputs as a default session, weights in one
store file shared across processes, far less private memory, damaged prepared files rebuilt."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import gfaas.models as models
from gfaas.dedup import ort as dort
from gfaas.dedup.shared import load_shared
from gfaas.errors import ConfigError, DedupError

MiB = 1 << 20


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("model-cache")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("store")


@pytest.mark.parametrize("name", models.names())
def test_shared_outputs_equal_the_default_sessions(name: str, cache_root: Path, store: Path) -> None:
    """Every small zoo model gives the same outputs with shared=True as with shared=False (float rounding
    of the differently packed kernels aside: rtol 1e-5)."""
    base = models.load(name, "small", cache_dir=cache_root, threads=1)
    sh = models.load(name, "small", cache_dir=cache_root, threads=1, shared=True, store_dir=store)
    x = base.example_inputs(batch=2, seed=1)
    want, got = base(**x), sh(**x)
    assert list(got) == list(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5 * float(np.abs(want[k]).max()), err_msg=k)


def test_prepared_graph_is_optimised_and_weights_are_aligned(cache_root: Path) -> None:
    """The prepared ResNet-50 has its BatchNorms folded (optimised once); every stripped initializer sits at a
    64-byte aligned offset of the weights file, and the graph records the weights file's SHA-256."""
    src = models.path("resnet50", "small", cache_dir=cache_root)
    graph, weights = dort.prepare(src)
    g = onnx.load(str(graph), load_external_data=False)
    assert not [n for n in g.graph.node if n.op_type == "BatchNormalization"]
    assert any(n.op_type == "BatchNormalization" for n in onnx.load(str(src)).graph.node)
    ext = [dort._external(t) for t in g.graph.initializer]
    spans = sorted(e for e in ext if e is not None)
    assert spans and all(off % dort.ALIGN == 0 for off, _ in spans)
    assert all(a[0] + a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))  # no overlaps
    assert spans[-1][0] + spans[-1][1] == weights.stat().st_size
    with load_shared(weights, store_dir=cache_root / "st") as buf:
        assert {p.key: p.value for p in g.metadata_props}["gfaas.weights_sha256"] == buf.digest


def _damage(kind: str, graph: Path, weights: Path) -> None:
    if kind == "graph_garbage":
        graph.write_bytes(b"not a protobuf")
    elif kind == "weights_flipped":
        data = bytearray(weights.read_bytes())
        data[len(data) // 2] ^= 0xFF
        weights.write_bytes(bytes(data))
    elif kind == "weights_truncated":
        weights.write_bytes(weights.read_bytes()[:-64])
    elif kind == "manifest_missing":
        graph.with_name(graph.name.replace(".graph.onnx", ".json")).unlink()


@pytest.mark.parametrize("kind", ["graph_garbage", "weights_flipped", "weights_truncated", "manifest_missing"])
def test_damaged_prepared_files_are_rebuilt(kind: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A damaged graph, weights file (even of the right size) or manifest is rebuilt by models.load(shared=True),
    which then gives the default session's outputs; a second prepare() finds the files valid."""
    cache_dir = tmp_path / "cache"
    base = models.load("alexnet", "small", cache_dir=cache_dir)
    graph, weights = dort.prepare(base.path)
    _damage(kind, graph, weights)
    with caplog.at_level(logging.WARNING):
        sh = models.load("alexnet", "small", cache_dir=cache_dir, shared=True, store_dir=tmp_path / "store")
    assert "rebuild" in caplog.text or "preparing them again" in caplog.text
    x = base.example_inputs(seed=2)
    want = base(**x)["logits"]
    # As above: the prepared graph is optimised, so fp32 sums run in another order (onnxruntime 1.32
    # differs by ~1e-6 on logits of magnitude ~5): the tolerance scales with the output.
    np.testing.assert_allclose(sh(**x)["logits"], want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
    stamp = os.stat(graph).st_mtime_ns, os.stat(weights).st_mtime_ns
    assert dort.prepare(base.path) == (graph, weights)
    assert (os.stat(graph).st_mtime_ns, os.stat(weights).st_mtime_ns) == stamp  # valid now: not rebuilt again


def test_a_new_source_model_is_prepared_again(tmp_path: Path) -> None:
    """Prepared files made from an older file at the same path are stale and rebuilt."""
    src = tmp_path / "m.onnx"
    src.write_bytes(models.build("logreg", "small", seed=1).SerializeToString())
    dort.prepare(src, tmp_path / "p")
    digest1 = json.loads((tmp_path / "p" / f"m.ort{dort.ort.__version__}.json").read_text())["weights_sha256"]
    src.unlink()
    src.write_bytes(_synthetic(7, 256).SerializeToString())
    dort.prepare(src, tmp_path / "p")
    digest2 = json.loads((tmp_path / "p" / f"m.ort{dort.ort.__version__}.json").read_text())["weights_sha256"]
    assert digest1 != digest2


def test_wrong_weights_and_bad_arguments(cache_root: Path, tmp_path: Path) -> None:
    """load_session refuses weights the graph was not prepared with; prepare refuses a missing file;
    shared=True refuses a GPU device and bad domains."""
    g1, _ = dort.prepare(models.path("resnet50", "small", cache_dir=cache_root))
    _, w2 = dort.prepare(models.path("alexnet", "small", cache_dir=cache_root))
    with pytest.raises(DedupError, match="are not the ones .* was prepared with.*prepare the model again"):
        dort.load_session(g1, load_shared(w2, store_dir=tmp_path))
    with pytest.raises(ConfigError, match="does not exist; pass the path of an .onnx file"):
        dort.prepare(tmp_path / "none.onnx")
    with pytest.raises(ConfigError, match="shared=True needs device='cpu', not 'cuda:0'"):
        models.load("logreg", shared=True, device="cuda:0", cache_dir=cache_root)
    with pytest.raises(ConfigError, match="sharing domain '../up' is not a valid name"):
        models.load("logreg", shared=True, domain="../up", cache_dir=cache_root, store_dir=tmp_path)


def _synthetic(seed: int, width: int) -> onnx.ModelProto:
    """x[1, width] -> MatMul(W1[width, 2*width]) -> Relu -> MatMul(W2[2*width, 2*width]): 24 MiB of
    weights at width 1024, nearly nothing else, so memory differences are the weights'."""
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((width, 2 * width), dtype=np.float32)
    w2 = rng.standard_normal((2 * width, 2 * width), dtype=np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    g = helper.make_graph(nodes, "synthetic", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2 * width])],
                          initializer=[numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


_CHILD = r"""
import json, os, sys
from pathlib import Path
import numpy as np

def private():
    kb = {}
    for line in open("/proc/self/smaps_rollup"):
        p = line.split()
        if p[-1] == "kB":
            kb[p[0].rstrip(":")] = int(p[1]) * 1024
    return kb["Private_Clean"] + kb["Private_Dirty"]

mode, model, store = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
import onnxruntime as ort
from gfaas.dedup import ort as dort
from gfaas.dedup.shared import load_shared
x = {"x": np.ones((1, 1024), np.float32)}
base = private()
info = {"base": base}
if mode == "default":
    o = ort.SessionOptions(); o.intra_op_num_threads = 1
    s = ort.InferenceSession(str(model), o, providers=["CPUExecutionProvider"])
elif mode == "shared":
    graph, weights = dort.prepare(model)
    buf = load_shared(weights, store_dir=store)
    s = dort.load_session(graph, buf, threads=1)
    info.update(digest=buf.digest, inode=os.stat(buf.path).st_ino)
else:
    from gfaas.models import load
    m = load("resnet50", "small", cache_dir=model, shared=True, store_dir=store)
    buf = m.session._gfaas_shared[0]
    s = None
    info.update(digest=buf.digest, inode=os.stat(buf.path).st_ino)
if s is not None:
    info["y"] = float(s.run(None, x)[0].sum())
print(json.dumps(info), flush=True)
sys.stdin.readline()
"""


def _rollup_private(pid: int) -> int:
    kb = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            p = line.split()
            if p[-1] == "kB":
                kb[p[0].rstrip(":")] = int(p[1]) * 1024
    return kb["Private_Clean"] + kb["Private_Dirty"]


@pytest.mark.timeout(90)
def test_second_process_maps_the_same_file_with_far_less_private_memory(tmp_path: Path) -> None:
    """Two processes loading a 24 MiB-weight model shared map one store file (same digest, same inode), and
    each one's private memory grows by less than half of what a default session's grows (measured in the
    same run from /proc/PID/smaps_rollup, while all three live)."""
    model = tmp_path / "synthetic.onnx"
    model.write_bytes(_synthetic(0, 1024).SerializeToString())
    dort.prepare(model)  # once, outside the measured processes (as a node does on first use)
    store = tmp_path / "store"
    procs, infos = [], []
    try:
        for mode in ("shared", "shared", "default"):
            p = subprocess.Popen([sys.executable, "-c", _CHILD, mode, str(model), str(store)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            procs.append(p)
            assert p.stdout is not None
            infos.append(json.loads(p.stdout.readline()))
        grown = [_rollup_private(p.pid) - i["base"] for p, i in zip(procs, infos, strict=True)]
    finally:
        for p in procs:
            assert p.stdin is not None
            p.stdin.close()
            p.wait(timeout=10)
    a, b, default = infos
    assert a["digest"] == b["digest"] and a["inode"] == b["inode"]
    assert a["y"] == b["y"] and abs(a["y"] - default["y"]) <= 1e-4 * abs(default["y"])
    assert grown[2] >= 24 * MiB  # the default session holds at least its own copy of the weights
    assert grown[0] < 0.5 * grown[2] and grown[1] < 0.5 * grown[2], grown


@pytest.mark.timeout(60)
def test_zoo_model_in_another_process_maps_the_same_store_file(cache_root: Path, tmp_path: Path) -> None:
    """models.load(shared=True) in a second process maps the file this process maps (same digest, inode)."""
    m = models.load("resnet50", "small", cache_dir=cache_root, shared=True, store_dir=tmp_path)
    mine = m.session._gfaas_shared[0]
    p = subprocess.run([sys.executable, "-c", _CHILD, "zoo", str(cache_root), str(tmp_path)], input="\n",
                       capture_output=True, text=True, timeout=50, check=True)
    other = json.loads(p.stdout.splitlines()[0])
    assert other["digest"] == mine.digest and other["inode"] == os.stat(mine.path).st_ino
