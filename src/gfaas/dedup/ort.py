"""onnxruntime sessions whose weights live in a shared read-only mapping.

A default session keeps its own private copy of every weight (and prepacked copies of conv/matmul
weights besides): ResNet-50 costs each process ~290 MiB that no other process can share. Here:

1. :func:`prepare` (once per model and onnxruntime version, cached next to the model): onnxruntime
   optimises the graph (fusions, NCHWc layouts) and saves it; the initializers are then stripped into
   one flat weights file (entries 64-byte aligned) and the graph keeps only their names, shapes and
   offsets (ONNX external-data fields) plus the weights file's SHA-256.
2. The weights file is mapped read-only from the content-addressed store
   (:func:`gfaas.dedup.shared.load_shared`): every process maps the same pages.
3. :func:`load_session` hands onnxruntime each weight as an ``OrtValue`` over the mapping, with graph
   optimisation off (the graph is optimised already; optimising again would constant-fold into
   private copies) and prepacking off (prepacking copies weights into private packed buffers). The
   values go in through ``SessionOptions.add_initializer`` (user-owned, used in place), not
   ``add_external_initializers``: onnxruntime 1.32 copies the latter into its own buffers (measured on
   AlexNet: +236 MiB private at load, against +5 MiB with ``add_initializer``).

Measured while planning (ResNet-50 full, one thread): 287 MiB private per process by default, ~16 MiB
this way, with the fused ops kept.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto

from ..errors import ConfigError, DedupError
from .shared import SharedBuffer

log = logging.getLogger("gfaas.dedup")

ALIGN = 64
# Initializers below this stay inline in the graph: shape vectors and scalars, which onnxruntime may
# read while it resolves the graph and which are not worth sharing.
INLINE_MAX = 1024
_FORMAT = "gfaas-ort-prepared-1"
_WEIGHTS_KEY = "gfaas.weights_sha256"


def _digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _names(model_path: Path, out_dir: Path) -> tuple[Path, Path, Path]:
    stem = f"{model_path.stem}.ort{ort.__version__}"
    return out_dir / f"{stem}.graph.onnx", out_dir / f"{stem}.weights", out_dir / f"{stem}.json"


def _source_id(model_path: Path) -> dict[str, int]:
    st = model_path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}


def _valid(model_path: Path, graph: Path, weights: Path, manifest: Path, verify_weights: bool) -> bool:
    try:
        m = json.loads(manifest.read_text(encoding="utf-8"))
        if m.get("format") != _FORMAT or m.get("source") != _source_id(model_path):
            return False
        if _digest(graph) != m["graph_sha256"] or weights.stat().st_size != m["weights_bytes"]:
            return False
        return not verify_weights or _digest(weights) == m["weights_sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return False


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _replace(target: Path, write: Any) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def prepare(model_path: Path, out_dir: Path | None = None, *, force: bool = False,
            verify_weights: bool = True) -> tuple[Path, Path]:
    """The (graph file, weights file) pair of ``model_path``, built once and cached in ``out_dir``
    (default: ``<model dir>/prepared``); rebuilt when missing, damaged (digests in a manifest), made
    from a different source file, or ``force``. ``verify_weights=False`` checks only the weights
    file's size (for callers that hash it anyway, as :func:`gfaas.dedup.shared.load_shared` does, and
    compare with the digest the graph records)."""
    model_path = Path(model_path)
    if not model_path.is_file():
        raise ConfigError(f"model file {str(model_path)!r} does not exist; pass the path of an .onnx file "
                          "(gfaas.models.path(name, scale) builds one)")
    out = Path(out_dir) if out_dir is not None else model_path.parent / "prepared"
    out.mkdir(parents=True, exist_ok=True)
    graph, weights, manifest = _names(model_path, out)
    if not force and _valid(model_path, graph, weights, manifest, verify_weights):
        return graph, weights
    with _lock(out / f".{graph.name}.lock"):
        # Another process may have built it while we waited for the lock.
        if not force and _valid(model_path, graph, weights, manifest, verify_weights):
            return graph, weights
        if not force and (manifest.exists() or graph.exists() or weights.exists()):
            log.warning("prepared files of %s are damaged or stale; rebuilding them", model_path.name)
        _build(model_path, graph, weights, manifest)
    return graph, weights


def _build(model_path: Path, graph: Path, weights: Path, manifest: Path) -> None:
    fd, tmp_opt = tempfile.mkstemp(prefix=f".{graph.name}.", suffix=".opt.onnx", dir=graph.parent)
    os.close(fd)
    try:
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        opts.intra_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.optimized_model_filepath = tmp_opt
        ort.InferenceSession(str(model_path), sess_options=opts, providers=["CPUExecutionProvider"])
        model = onnx.load(tmp_opt)
    finally:
        Path(tmp_opt).unlink(missing_ok=True)

    entries: list[tuple[int, bytes]] = []
    offset = 0
    for t in model.graph.initializer:
        arr = onnx.numpy_helper.to_array(t)
        if arr.nbytes < INLINE_MAX or arr.dtype == object:
            continue
        data = np.ascontiguousarray(arr).tobytes()
        offset = -(-offset // ALIGN) * ALIGN
        entries.append((offset, data))
        dims, dtype, name = list(t.dims), t.data_type, t.name
        t.Clear()
        t.name, t.data_type = name, dtype
        t.dims.extend(dims)
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", weights.name), ("offset", str(offset)), ("length", str(len(data)))):
            t.external_data.add(key=k, value=v)
        offset += len(data)
    total = offset

    h = hashlib.sha256()

    def write_weights(f: Any) -> None:
        pos = 0
        for off, data in entries:
            pad = b"\0" * (off - pos)
            f.write(pad)
            h.update(pad)
            f.write(data)
            h.update(data)
            pos = off + len(data)

    _replace(weights, write_weights)
    weights_sha = h.hexdigest()
    onnx.helper.set_model_props(model, {**{p.key: p.value for p in model.metadata_props}, _WEIGHTS_KEY: weights_sha})
    data = model.SerializeToString()
    _replace(graph, lambda f: f.write(data))
    doc = {"format": _FORMAT, "source": _source_id(model_path), "onnxruntime": ort.__version__,
           "graph_sha256": hashlib.sha256(data).hexdigest(), "weights_sha256": weights_sha, "weights_bytes": total,
           "initializers": len(entries)}
    _replace(manifest, lambda f: f.write(json.dumps(doc, indent=1).encode()))
    log.info("prepared %s: %d shared initializers, %d bytes", model_path.name, len(entries), total)


def _external(t: TensorProto) -> tuple[int, int] | None:
    if t.data_location != TensorProto.EXTERNAL:
        return None
    kv = {e.key: e.value for e in t.external_data}
    return int(kv.get("offset", "0")), int(kv["length"])


def load_session(graph_path: Path, weights: SharedBuffer, *, threads: int | None = None) -> ort.InferenceSession:
    """An onnxruntime CPU session of a :func:`prepare`-d graph whose weights are ``OrtValue``s over
    ``weights`` (no copies), with prepacking and graph optimisation off. The graph is loaded by path
    (onnxruntime checks that the weights file its external-data fields name exists, but reads the
    weights only from the ``OrtValue``s). ``weights`` must be the file the graph was prepared with
    (its SHA-256 is checked: :class:`DedupError` otherwise); the session keeps ``weights`` mapped for
    as long as it lives."""
    model = onnx.load(str(graph_path), load_external_data=False)
    want = {p.key: p.value for p in model.metadata_props}.get(_WEIGHTS_KEY)
    if want != weights.digest:
        raise DedupError(f"weights {weights.path} (sha256 {weights.digest[:16]}...) are not the ones {graph_path} "
                         f"was prepared with ({(want or 'none')[:16]}...); prepare the model again")
    names: list[str] = []
    arrays: list[np.ndarray] = []
    for t in model.graph.initializer:
        ext = _external(t)
        if ext is None:
            continue
        off, length = ext
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type))
        if off < 0 or off % dtype.itemsize or off + length > weights.nbytes or length != dtype.itemsize * int(
                np.prod(t.dims, dtype=np.int64)):
            raise DedupError(f"initializer {t.name!r} of {graph_path} does not fit the weights file "
                             f"({off}+{length} > {weights.nbytes} bytes); prepare the model again")
        arrays.append(np.frombuffer(weights.view, dtype, length // dtype.itemsize, off).reshape(tuple(t.dims)))
        names.append(t.name)
    values = [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays]
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.add_session_config_entry("session.disable_prepacking", "1")
    if threads is not None:
        opts.intra_op_num_threads = int(threads)
        opts.inter_op_num_threads = 1
    for n, v in zip(names, values, strict=True):
        opts.add_initializer(n, v)
    sess = ort.InferenceSession(str(graph_path), sess_options=opts, providers=["CPUExecutionProvider"])
    # onnxruntime reads the weights through raw pointers: keep the mapping and the arrays alive with it.
    sess._gfaas_shared = (weights, arrays, values)
    return sess
