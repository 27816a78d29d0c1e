"""Running zoo models: :func:`load` and :class:`Model`, a checked wrapper over an onnxruntime session."""

from __future__ import annotations

import logging
import numbers
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from ..errors import ConfigError, DependencyMissing
from . import cache, zoo

log = logging.getLogger("gfaas.models")

_ORT_DTYPES = {"tensor(float)": np.dtype(np.float32), "tensor(int64)": np.dtype(np.int64)}
_DEVICE = re.compile(r"^(cpu|cuda)(?::(\d+))?$")


def _providers(device: str) -> list[str | tuple[str, dict[str, str]]]:
    m = _DEVICE.match(device) if isinstance(device, str) else None
    if m is None or (m.group(1) == "cpu" and m.group(2) is not None):
        raise ConfigError(f"device {device!r} is not understood: use 'cpu' or 'cuda:N' (e.g. 'cuda:0')")
    if m.group(1) == "cpu":
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise DependencyMissing(
            f"device {device!r} needs onnxruntime's CUDAExecutionProvider, which this onnxruntime "
            f"({ort.__version__}, providers {ort.get_available_providers()}) lacks; install the gpu extra and the "
            "GPU build of onnxruntime: pip install 'gfaas[gpu]' onnxruntime-gpu")
    return [("CUDAExecutionProvider", {"device_id": m.group(2) or "0"}), "CPUExecutionProvider"]


class Model:
    """A zoo model in an onnxruntime session: ``model(**feeds) -> {output name: array}``.

    Feeds are checked before they reach onnxruntime (names, dtypes, ranks, fixed dims, consistent
    symbolic dims, token ids inside the vocabulary) so a mistake gets a :class:`ConfigError` that names
    the input and the fix instead of an onnxruntime status string.
    """

    def __init__(self, name: str, scale: str, seed: int | None, model_path: Path, session: Any,
                 device: str, engine: str = "onnxruntime", info: zoo.ModelInfo | None = None) -> None:
        self.name = name
        self.scale = scale
        self.seed = seed
        self.path = model_path
        self.session = session
        self.device = device
        self.engine = engine  # "onnxruntime", or "torch" (a TorchSession: GPU functions)
        self.info = info if info is not None else zoo.info(name, scale)  # a user's file brings its own
        self._inputs = {i.name: (tuple(i.shape), _ORT_DTYPES[i.type]) for i in session.get_inputs()}
        self.output_names = tuple(o.name for o in session.get_outputs())

    def __repr__(self) -> str:
        return (f"Model({self.name!r}, scale={self.scale!r}, seed={self.seed}, device={self.device!r}, "
                f"engine={self.engine!r})")

    def _check(self, feeds: dict[str, object]) -> dict[str, Any]:
        want = list(self._inputs)
        unknown = sorted(set(feeds) - set(want))
        missing = [k for k in want if k not in feeds]
        if unknown or missing:
            raise ConfigError(f"model {self.name!r} takes inputs {want}; "
                              + (f"unknown {unknown}" if unknown else "")
                              + ("; " if unknown and missing else "")
                              + (f"missing {missing}" if missing else ""))
        out: dict[str, Any] = {}
        sizes: dict[str, tuple[int, str]] = {}
        for k, (shape, dtype) in self._inputs.items():
            v = _feed(feeds[k], self.engine)
            if v.dtype != dtype:
                raise ConfigError(f"model {self.name!r} input {k!r} has dtype {v.dtype}, expected {dtype}: "
                                  f"pass x.astype(np.{dtype})")
            if v.ndim != len(shape):
                raise ConfigError(f"model {self.name!r} input {k!r} has shape {list(v.shape)} (rank {v.ndim}), "
                                  f"expected rank {len(shape)}: {list(shape)}")
            for axis, (dim, got) in enumerate(zip(shape, v.shape, strict=True)):
                if got == 0:
                    raise ConfigError(f"model {self.name!r} input {k!r} is empty along axis {axis} "
                                      f"(shape {list(v.shape)}); feed at least one row")
                if isinstance(dim, int):
                    if got != dim:
                        raise ConfigError(f"model {self.name!r} input {k!r} has shape {list(v.shape)}, "
                                          f"expected {list(shape)} (axis {axis} must be {dim})")
                elif isinstance(dim, str):
                    seen = sizes.setdefault(dim, (got, k))
                    if seen[0] != got:
                        raise ConfigError(f"model {self.name!r}: dim {dim!r} is {seen[0]} in {seen[1]!r} but {got} "
                                          f"in {k!r}; inputs sharing a dim must agree")
            out[k] = v
        self._check_tokens(out, sizes)
        return out

    def _check_tokens(self, feeds: dict[str, Any], sizes: dict[str, tuple[int, str]]) -> None:
        info = self.info
        if info.max_seq_len is not None and "L" in sizes and sizes["L"][0] > info.max_seq_len:
            raise ConfigError(f"model {self.name!r}: sequence length {sizes['L'][0]} exceeds the "
                              f"{info.max_seq_len} position embeddings; truncate to {info.max_seq_len}")
        ids = feeds.get("input_ids")
        if ids is not None and info.vocab_size is not None:
            lo, hi = _minmax(ids)
            if lo < 0 or hi >= info.vocab_size:
                bad = lo if lo < 0 else hi
                raise ConfigError(f"model {self.name!r}: token id {bad} is outside the vocabulary "
                                  f"[0, {info.vocab_size}); map unknown tokens to an id below {info.vocab_size}")
        mask = feeds.get("attention_mask")
        if mask is not None and not _all_binary(mask):
            raise ConfigError(f"model {self.name!r}: attention_mask must hold only 0 (padding) and 1 (token)")

    def __call__(self, **feeds: Any) -> dict[str, np.ndarray]:
        """The outputs as host arrays. Feeds are numpy arrays, or (torch engine) device tensors."""
        checked = self._check(dict(feeds))
        values = self.session.run(None, checked)
        return {k: np.asarray(v) for k, v in zip(self.output_names, values, strict=True)}

    def run_device(self, **feeds: Any) -> dict[str, Any]:
        """Like calling the model, but a model on a GPU (torch engine) leaves its outputs there, as
        :class:`~gfaas.dataplane.device_array.DeviceArray` (numpy code can still read them; a
        function returning one passes it on device to device). On the CPU: host arrays."""
        checked = self._check(dict(feeds))
        if self.engine != "torch":
            return {k: np.asarray(v) for k, v in zip(self.output_names, self.session.run(None, checked), strict=True)}
        return dict(zip(self.output_names, self.session.run_device(checked), strict=True))

    def example_inputs(self, batch: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
        """Deterministic inputs of the default shapes with ``batch`` rows: standard-normal images and
        features, uniform token ids, an all-ones attention mask."""
        if isinstance(batch, bool) or not isinstance(batch, numbers.Integral) or batch < 1:
            raise ConfigError(f"batch {batch!r} must be a positive integer, e.g. batch=1")
        if self.info.scale == "file":
            raise ConfigError(f"example_inputs knows the zoo's models, not the file {self.path.name}; build the "
                              f"feeds from model.info.inputs ({dict(self.info.inputs)})")
        rng = np.random.default_rng(zoo.check_seed(seed))
        sig = zoo.signature(self.name, self.scale)
        out: dict[str, np.ndarray] = {}
        for k, s in sig.inputs.items():
            shape, dtype = sig.concrete(s, int(batch))
            dims = tuple(int(d) for d in shape)
            if k == "input_ids":
                out[k] = rng.integers(0, self.info.vocab_size or 2, size=dims, dtype=np.int64)
            elif k == "attention_mask":
                out[k] = np.ones(dims, np.int64)
            else:
                out[k] = rng.standard_normal(dims, dtype=np.float32)
        return out


def load(name: str, scale: str = "small", seed: int = 0, device: str = "cpu",
         cache_dir: str | os.PathLike[str] | None = None, threads: int | None = None, *, shared: bool = False,
         domain: str = "default", store_dir: Path | None = None, engine: str = "auto") -> Model:
    """The model ``name`` at ``scale`` (built and cached on first use) on ``device`` ('cpu' or
    'cuda:N'); ``threads`` caps onnxruntime's intra-op threads (default: its own choice, one per core).

    ``engine``: ``onnxruntime``, ``torch`` (the same graph and weights converted to torch,
    :mod:`gfaas.models.torch_engine`) or ``auto`` (default): onnxruntime on the CPU; on a GPU,
    onnxruntime if its build has the CUDA provider, else torch.

    ``shared=True`` (CPU only) keeps the weights in a read-only mapping of the content-addressed store
    (``store_dir``, sharing ``domain``) that every process loading the same model maps, instead of a
    private copy per process (:mod:`gfaas.dedup.ort`); the outputs equal the default session's to
    float rounding."""
    name, scale, seed = zoo.check_name(name), zoo.check_scale(scale), zoo.check_seed(seed)
    if engine not in ("auto", "onnxruntime", "torch"):
        raise ConfigError(f"engine {engine!r} is not 'auto', 'onnxruntime' or 'torch'")
    if shared and device != "cpu":
        raise ConfigError(f"shared=True needs device='cpu', not {device!r}: on a GPU the weights live in "
                          "device memory; use shared=False there")
    engine = _engine(engine, device)
    if engine == "torch" and shared:
        raise ConfigError("shared=True maps weights into onnxruntime's sessions; the torch engine keeps a "
                          "copy of its own: use shared=False")
    if shared:
        _providers(device)
        _check_threads(threads)
        p = cache.path(name, scale, seed, cache_dir)
        return Model(name, scale, seed, p, _shared_session(p, threads, domain, store_dir), device)
    _check_open(device, threads, engine)  # before building anything
    return open_session(cache.path(name, scale, seed, cache_dir), zoo.info(name, scale), device, threads, engine,
                        seed=seed)


def _engine(engine: str, device: str) -> str:
    if engine == "auto" and isinstance(device, str) and device.startswith("cuda") \
            and "CUDAExecutionProvider" not in ort.get_available_providers():
        return "torch"
    return "onnxruntime" if engine == "auto" else engine


def _check_threads(threads: int | None) -> None:
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, numbers.Integral)
                                or threads < 1):
        raise ConfigError(f"threads {threads!r} must be a positive integer or None (onnxruntime's default)")


def _check_open(device: str, threads: int | None, engine: str) -> None:
    if engine == "torch":
        from .torch_engine import check_device, require

        check_device(device)
        require()
    else:
        _providers(device)
        _check_threads(threads)


def open_session(p: Path, info: zoo.ModelInfo, device: str, threads: int | None, engine: str,
                 seed: int | None = None) -> Model:
    """A :class:`Model` over the ONNX file ``p`` described by ``info`` (a zoo model, or a user's file:
    :func:`gfaas.models.files.load_file`), on ``device`` with ``engine`` (``auto`` resolved here)."""
    engine = _engine(engine, device)
    _check_open(device, threads, engine)
    if engine == "torch":
        from .torch_engine import TorchSession

        return Model(info.name, info.scale, seed, p, TorchSession(p, device), device, engine="torch", info=info)
    providers = _providers(device)
    opts = ort.SessionOptions()
    # onnxruntime writes its own warnings to stderr; a library must stay quiet unless it fails.
    opts.log_severity_level = 3
    if threads is not None:
        opts.intra_op_num_threads = int(threads)
        opts.inter_op_num_threads = 1
    session = ort.InferenceSession(str(p), sess_options=opts, providers=providers)
    log.debug("loaded %s on %s", p.name, device)
    return Model(info.name, info.scale, seed, p, session, device, info=info)


def _feed(value: Any, engine: str) -> Any:
    """A feed as the engine takes it: a device tensor stays where it is (torch engine; its shape and
    dtype are checked from its metadata), anything else becomes a numpy array."""
    if engine == "torch":
        from ..dataplane.device_array import DeviceArray, on_device

        if isinstance(value, DeviceArray):
            return value
        if on_device(value) or type(value).__module__.startswith("torch"):
            from .torch_engine import as_tensor

            return DeviceArray(as_tensor(value))
    return np.asarray(value)


def _minmax(value: Any) -> tuple[int, int]:
    if isinstance(value, np.ndarray):
        return int(value.min()), int(value.max())
    from .torch_engine import minmax

    return minmax(value)


def _all_binary(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        return bool(np.isin(value, (0, 1)).all())
    from .torch_engine import all_binary

    return all_binary(value)


def _shared_session(p: Path, threads: int | None, domain: str, store_dir: Path | None) -> ort.InferenceSession:
    from ..dedup import ort as dedup_ort
    from ..dedup.shared import check_domain, load_shared
    from ..errors import DedupError

    check_domain(domain)
    # The weights are hashed once, by load_shared; the graph records their digest, so a damaged
    # weights file shows up as a mismatch here and is rebuilt once.
    graph, weights = dedup_ort.prepare(p, verify_weights=False)
    buf = load_shared(weights, domain=domain, store_dir=store_dir)
    try:
        return dedup_ort.load_session(graph, buf, threads=threads)
    except DedupError:
        log.warning("prepared weights of %s do not match their graph; preparing them again", p.name)
    graph, weights = dedup_ort.prepare(p, force=True)
    return dedup_ort.load_session(graph, load_shared(weights, domain=domain, store_dir=store_dir), threads=threads)
