"""The gateway's JSON encoding of arrays and invocation results (shared by the gateway and its clients).

An array travels as ``{"dtype": "float32", "shape": [2, 3], "data_b64": "..."}``: ``data_b64`` is the
standard base64 (RFC 4648, with padding) of the array's raw bytes in C order, little-endian. ``dtype``
is one of :data:`DTYPES` (numeric and bool only: no objects, strings or records). A 0-d array has
``shape: []`` and one element; an empty array has a 0 in its shape and ``data_b64: ""``.

The result document of an invocation is::

    {"invocation_id": str, "workflow": str, "status": "done" | "failed", "error": str | None,
     "outputs": {NAME: ARRAY}, "scalars": {NAME: JSON value},
     "breakdown": {"queue_s", "host_pass_s", "fn_pass_s", "compute_s", "total_s"},
     "functions": [{"function", "worker", "queued_s", "get_s", "compute_s", "put_s", "skipped"}]}

Scalars become plain JSON: numpy scalars their Python value, non-finite floats the strings
``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` (JSON has no such numbers), complex numbers
``[real, imag]``, arrays an ARRAY document. :func:`result_from_document` turns the strings back into floats.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import ProtocolError
from .result import Breakdown, Failure, FunctionRecord, InvocationResult

__all__ = ["DTYPES", "MAX_NDIM", "WireError", "decode_array", "encode_array", "jsonable", "result_document",
           "result_from_document"]

#: The dtype names an array document may carry.
DTYPES: tuple[str, ...] = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                           "float16", "float32", "float64", "complex64", "complex128")
#: The most dimensions an array document may have.
MAX_NDIM = 32
_MAX_ELEMENTS = 1 << 48  # far beyond any body the gateway accepts; keeps shape arithmetic sane

_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


class WireError(ProtocolError, ValueError):
    """An array or result document is malformed; the message names the field and the fix."""


def _wire_form(value: Any) -> np.ndarray:
    """``value`` as a little-endian array of a wire dtype, or :class:`WireError`."""
    arr = np.asarray(value)
    if arr.dtype.name not in DTYPES:
        raise WireError(f"cannot encode an array of dtype {arr.dtype}; the wire carries only {', '.join(DTYPES)}"
                        " (convert it first, e.g. with .astype('float32'))")
    if arr.ndim > MAX_NDIM:
        raise WireError(f"cannot encode an array of {arr.ndim} dimensions; at most {MAX_NDIM}")
    le = arr.dtype.newbyteorder("<")
    return arr.astype(le) if arr.dtype != le else arr


def encode_array(value: Any) -> dict[str, Any]:
    """``{"dtype", "shape", "data_b64"}`` for an array (or anything :func:`numpy.asarray` takes).

    Raises :class:`WireError` for dtypes outside :data:`DTYPES` (objects, strings, records, datetimes).
    """
    arr = _wire_form(value)
    return {"dtype": arr.dtype.name, "shape": [int(n) for n in arr.shape],
            "data_b64": base64.b64encode(arr.tobytes(order="C")).decode("ascii")}


def decode_array(doc: Any, field: str = "array") -> np.ndarray:
    """The array an ``{"dtype", "shape", "data_b64"}`` document describes.

    The result is a read-only view over the decoded bytes (copy it before writing). ``field`` names
    the document in error messages (e.g. ``"inputs.image"``). Raises :class:`WireError` on an unknown
    dtype, a bad shape, invalid base64 or a byte count that does not match dtype and shape.
    """
    if not isinstance(doc, Mapping):
        raise WireError(f"{field}: expected an object {{\"dtype\", \"shape\", \"data_b64\"}}, got {type(doc).__name__}")
    missing = [k for k in ("dtype", "shape", "data_b64") if k not in doc]
    extra = sorted(str(k) for k in doc if k not in ("dtype", "shape", "data_b64"))
    if missing or extra:
        raise WireError(f"{field}: an array is {{\"dtype\", \"shape\", \"data_b64\"}}"
                        + (f"; missing {missing}" if missing else "") + (f"; unknown keys {extra}" if extra else ""))
    dtype_name, shape, data = doc["dtype"], doc["shape"], doc["data_b64"]
    if not isinstance(dtype_name, str) or dtype_name not in DTYPES:
        raise WireError(f"{field}.dtype: {dtype_name!r} is not a supported dtype; use one of {', '.join(DTYPES)}")
    dims = check_shape(shape, f"{field}.shape")
    if not isinstance(data, str):
        raise WireError(f"{field}.data_b64: expected a base64 string, got {type(data).__name__}")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise WireError(f"{field}.data_b64: not valid base64 ({exc}); send standard base64 with padding "
                        "(alphabet A-Z a-z 0-9 + /, no line breaks)") from None
    dtype = np.dtype(dtype_name).newbyteorder("<")
    count = math.prod(dims)
    if count * dtype.itemsize != len(raw):
        raise WireError(f"{field}: shape {list(dims)} of {dtype_name} needs {count * dtype.itemsize} bytes but data_b64 "
                        f"decodes to {len(raw)}; send the array's raw C-order little-endian bytes "
                        "(numpy: base64.b64encode(a.tobytes()))")
    if dtype_name == "bool" and raw and max(raw) > 1:
        raise WireError(f"{field}.data_b64: bool arrays hold one byte per element, 0 or 1; found other values")
    arr = np.frombuffer(raw, dtype=dtype).reshape(dims)
    if not dtype.isnative:
        arr = arr.astype(dtype.newbyteorder("="))
        arr.flags.writeable = False
    return arr


def check_shape(shape: Any, field: str = "shape") -> tuple[int, ...]:
    """Validate a shape list (non-negative ints, at most :data:`MAX_NDIM`) and return it as a tuple."""
    if not isinstance(shape, list | tuple):
        raise WireError(f"{field}: expected a list of non-negative integers, got {type(shape).__name__}")
    if len(shape) > MAX_NDIM:
        raise WireError(f"{field}: {len(shape)} dimensions; at most {MAX_NDIM}")
    for n in shape:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise WireError(f"{field}: {list(shape)} must hold non-negative integers only ([] for a 0-d array)")
    if math.prod(n for n in shape if n) > _MAX_ELEMENTS:
        raise WireError(f"{field}: {list(shape)} has more than 2**48 elements")
    return tuple(int(n) for n in shape)


def jsonable(value: Any) -> Any:
    """A scalar (or small structure of them) as strict JSON; see the module docstring for the rules."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, np.ndarray):
        return encode_array(value)
    if isinstance(value, np.generic):
        value = value.item()
        if isinstance(value, bytes | np.generic):  # void / datetime-like items
            return str(value)
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    if isinstance(value, complex):
        return [jsonable(value.real), jsonable(value.imag)]
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return str(value)


def _float(value: Any) -> Any:
    return _NONFINITE.get(value, value) if isinstance(value, str) else value


def digest_array(value: Any) -> dict[str, Any]:
    """``{"dtype", "shape", "sha256"}``: what :func:`encode_array` would carry, hashed instead of sent
    (the SHA-256 of the same little-endian C-order bytes)."""
    arr = _wire_form(value)
    flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)  # no copy when already C-contiguous
    return {"dtype": arr.dtype.name, "shape": [int(n) for n in arr.shape],
            "sha256": hashlib.sha256(flat.data).hexdigest()}


def result_document(res: InvocationResult, outputs: str = "full") -> dict[str, Any]:
    """The JSON document of a result: outputs encoded with :func:`encode_array` (``full``) or
    summarised by :func:`digest_array` (``digest``: for load generators that only check them)."""
    if outputs not in ("full", "digest"):
        raise ValueError(f"outputs={outputs!r}; use 'full' or 'digest'")
    enc = encode_array if outputs == "full" else digest_array
    return {
        "invocation_id": res.invocation_id,
        "workflow": res.workflow,
        "status": res.status,
        "error": res.error,
        "outputs": {name: enc(arr) for name, arr in res.outputs.items()},
        "scalars": {str(k): jsonable(v) for k, v in res.scalars.items()},
        "breakdown": {k: _seconds(v) for k, v in res.breakdown.as_dict().items()},
        "functions": [_record_doc(r) for r in res.functions],
        **({"failure": {"function": res.failure.function, "error": res.failure.error, "trace": res.failure.trace,
                        "logs": list(res.failure.logs)}} if res.failure is not None else {}),
    }


def _seconds(x: Any) -> Any:
    """A time as strict JSON: the float when finite (every time the runtime measures), else as
    :func:`jsonable` writes it. A dozen per result document, so the usual case is one test."""
    x = float(x)
    return x if x - x == 0.0 else jsonable(x)  # inf - inf and nan - nan are nan


def _record_doc(r: FunctionRecord) -> dict[str, Any]:
    d: dict[str, Any] = {"function": r.function, "worker": r.worker, "queued_s": _seconds(r.queued_s),
                         "get_s": _seconds(r.get_s), "compute_s": _seconds(r.compute_s),
                         "put_s": _seconds(r.put_s), "skipped": bool(r.skipped)}
    if r.placement:  # an `accelerator:` function (runtime.accel): where it ran, and its modelled seconds
        d.update(placement=r.placement, drive=int(r.drive), accel_s=_seconds(r.accel_s))
    if r.cold_start_s:
        d["cold_start_s"] = _seconds(r.cold_start_s)
    return d


def _failure(doc: Any) -> Failure | None:
    if doc is None:
        return None
    return Failure(str(doc["function"]), str(doc.get("error", "")), str(doc.get("trace", "")),
                   tuple(str(x) for x in doc.get("logs") or ()))


def result_from_document(doc: Mapping[str, Any]) -> InvocationResult:
    """The :class:`InvocationResult` a result document describes (outputs decoded, read-only)."""
    try:
        b = doc.get("breakdown") or {}
        return InvocationResult(
            invocation_id=str(doc["invocation_id"]),
            workflow=str(doc["workflow"]),
            status=doc["status"],
            outputs={name: decode_array(a, f"outputs.{name}") for name, a in (doc.get("outputs") or {}).items()},
            scalars={k: _float(v) for k, v in (doc.get("scalars") or {}).items()},
            error=doc.get("error"),
            breakdown=Breakdown(**{k: float(_float(b.get(k, 0.0))) for k in
                                   ("queue_s", "host_pass_s", "fn_pass_s", "compute_s", "total_s",
                                    "accel_s", "cold_start_s")}),
            functions=tuple(FunctionRecord(function=str(r["function"]), worker=str(r.get("worker", "")),
                                           queued_s=float(_float(r.get("queued_s", 0.0))),
                                           get_s=float(_float(r.get("get_s", 0.0))),
                                           compute_s=float(_float(r.get("compute_s", 0.0))),
                                           put_s=float(_float(r.get("put_s", 0.0))),
                                           skipped=bool(r.get("skipped", False)),
                                           placement=str(r.get("placement", "")), drive=int(r.get("drive", -1)),
                                           accel_s=float(_float(r.get("accel_s", 0.0))),
                                           cold_start_s=float(_float(r.get("cold_start_s", 0.0))))
                            for r in doc.get("functions") or ()),
            failure=_failure(doc.get("failure")),
        )
    except WireError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise WireError(f"not a result document ({type(exc).__name__}: {exc})") from None
