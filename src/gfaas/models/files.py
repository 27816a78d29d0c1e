"""A user's own model: an ONNX file (shipped in a workflow's code package as ``model: {file: PATH}``).

:func:`inspect` reads what a graph takes and gives without running it (the runtime checks a package's
model at deploy time); :func:`load_file` returns a :class:`~gfaas.models.Model` over it with the same
feed checks, engines and devices as a zoo model, so the platform handles both alike (loaded once per
warm worker, on a GPU by the torch engine). Only ONNX for now: a torch or safetensors file would need
the user's model code to rebuild the network around its weights.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError

# The element types a feed may have (what Model checks and converts): float32 and int64.
_SUPPORTED = {1: "float32", 7: "int64"}
_NAMES = {1: "float32", 2: "uint8", 3: "int8", 5: "int16", 6: "int32", 7: "int64", 9: "bool", 10: "float16",
          11: "float64", 16: "bfloat16"}
MAX_FILE_BYTES = 2 * 1024**3  # protobuf's own limit for one file


@dataclass(frozen=True)
class GraphIO:
    inputs: dict[str, tuple[tuple[int | str, ...], str]]
    outputs: dict[str, tuple[tuple[int | str, ...], str]]


def _dims(t: Any) -> tuple[int | str, ...]:
    return tuple(d.dim_param or (d.dim_value if d.HasField("dim_value") else "?") for d in t.shape.dim)


def inspect(data: bytes, where: str = "model") -> GraphIO:
    """The graph's inputs and outputs (shapes, symbolic dims as names); :class:`ConfigError` naming the
    problem for a file that is not a valid ONNX model or takes feeds of a type gfaas cannot give."""
    import onnx

    try:
        m = onnx.load_from_string(data)
        onnx.checker.check_model(m)
    except Exception as exc:  # noqa: BLE001 - onnx raises protobuf's DecodeError, ValidationError, ...
        raise ConfigError(f"{where} is not a valid ONNX model ({type(exc).__name__}: {str(exc)[:300]})") from None
    weights = {i.name for i in m.graph.initializer}
    ins, outs = {}, {}
    for i in m.graph.input:
        if i.name in weights:
            continue  # older exporters list initializers as inputs too
        et = i.type.tensor_type.elem_type
        if et not in _SUPPORTED:
            raise ConfigError(f"{where}: input {i.name!r} is {_NAMES.get(et, f'type {et}')}; gfaas feeds models "
                              "float32 or int64 tensors: export the model with inputs of those types")
        ins[i.name] = (_dims(i.type.tensor_type), _SUPPORTED[et])
    for o in m.graph.output:
        et = o.type.tensor_type.elem_type
        outs[o.name] = (_dims(o.type.tensor_type), _NAMES.get(et, str(et)))
    if not ins:
        raise ConfigError(f"{where} takes no inputs; a model for a function takes at least one")
    return GraphIO(ins, outs)


def load_file(path: str | os.PathLike[str], device: str = "cpu", threads: int | None = None,
              engine: str = "auto") -> Any:
    """The ONNX model at ``path`` as a :class:`~gfaas.models.Model` (checked feeds, ``engine`` and
    ``device`` as :func:`gfaas.models.load`)."""
    from . import runtime, zoo

    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise ConfigError(f"model file {p}: {exc.strerror}; ship it in the code package") from None
    if size > MAX_FILE_BYTES:
        raise ConfigError(f"model file {p} is {size:,} bytes, over ONNX's 2 GiB limit for one file")
    io = inspect(p.read_bytes(), f"model file {p.name}")
    info = zoo.ModelInfo(name=p.stem, scale="file", inputs=io.inputs, outputs=tuple(io.outputs),
                         reference_params=None, reference_source=f"the user's file {p.name}", vocab_size=None,
                         dynamic_inputs=io.inputs, output_shapes=io.outputs, max_seq_len=None,
                         summary=f"ONNX file {p.name}")
    return runtime.open_session(p, info, device, threads, engine)
