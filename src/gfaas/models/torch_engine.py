"""The zoo's graphs in torch: how GPU functions run their models.

onnxruntime's GPU build is not on the GPU machines we target and is too large to bring along, while
torch is there. So a zoo graph is converted to a ``torch.fx`` module by onnx2torch, a maintained
ONNX-to-torch converter, and runs with the same seeded weights as the CPU zoo (the cache file is
the same ONNX file). Tests check each model's outputs against onnxruntime's.

:class:`TorchSession` offers the slice of onnxruntime's ``InferenceSession`` that
:class:`~gfaas.models.Model` uses, so one ``Model`` class checks feeds for both engines. Feeds may
be numpy arrays (copied to the device) or device tensors (DLPack: a ``DeviceView`` from the data
plane, a torch or CuPy tensor), which are used where they are, without a copy.
"""

from __future__ import annotations

import logging
import re
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from ..dataplane.device_array import DeviceArray, on_device
from ..errors import ConfigError, DependencyMissing

log = logging.getLogger("gfaas.models")

_ONNX_TYPES = {1: "tensor(float)", 7: "tensor(int64)"}
_DEVICE = re.compile(r"^(cpu|cuda(?::\d+)?)$")


def import_torch() -> Any:
    """torch, or :class:`DependencyMissing` naming the extra."""
    try:
        import torch
    except ImportError as exc:
        raise DependencyMissing("a function on a GPU needs torch: pip install 'gfaas[torch]'") from exc
    return torch


def require() -> None:
    """Raise :class:`DependencyMissing` (naming the extra) unless torch and onnx2torch import."""
    _import()


def _import() -> tuple[Any, Any]:
    try:
        import torch
    except ImportError as exc:
        raise DependencyMissing("running a zoo model with torch (GPU functions) needs torch and onnx2torch: "
                                "pip install 'gfaas[torch]'") from exc
    try:
        import onnx2torch
    except ImportError as exc:
        raise DependencyMissing("running a zoo model with torch needs onnx2torch (the ONNX-to-torch converter): "
                                "pip install 'gfaas[torch]' (or pip install onnx2torch)") from exc
    _register_trilu()
    return torch, onnx2torch


_trilu_registered = False


def _register_trilu() -> None:
    """onnx2torch has no converter for ``Trilu`` (GPT-2's causal mask); add one through its registry."""
    global _trilu_registered
    if _trilu_registered:
        return
    import torch
    from onnx2torch.node_converters.registry import add_converter
    from onnx2torch.utils.common import OperationConverterResult, onnx_mapping_from_node

    class Trilu(torch.nn.Module):
        def __init__(self, upper: bool) -> None:
            super().__init__()
            self.upper = upper

        def forward(self, x: Any, k: Any = None) -> Any:
            diag = 0 if k is None else int(k)
            return torch.triu(x, diag) if self.upper else torch.tril(x, diag)

    @add_converter(operation_type="Trilu", version=14)
    def _convert(node: Any, graph: Any) -> Any:
        del graph
        return OperationConverterResult(torch_module=Trilu(bool(node.attributes.get("upper", 1))),
                                        onnx_mapping=onnx_mapping_from_node(node=node))

    _trilu_registered = True


def check_device(device: str) -> str:
    if not isinstance(device, str) or not _DEVICE.match(device):
        raise ConfigError(f"device {device!r} is not understood by the torch engine: use 'cuda:N' (or 'cpu')")
    return "cuda:0" if device == "cuda" else device


class TorchSession:
    """A zoo ONNX file as a torch module on ``device``, with onnxruntime's ``get_inputs``/``get_outputs``/``run``."""

    def __init__(self, path: Path, device: str) -> None:
        import onnx

        torch, onnx2torch = _import()
        self.device = check_device(device)
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise DependencyMissing(f"device {device!r}: torch {torch.__version__} sees no CUDA GPU here; "
                                    "run on a GPU machine, or use device='cpu'")
        if self.device.startswith("cuda"):
            # Same inputs, same bits: cuDNN's autotuner and non-deterministic kernels would make two
            # runs of one request differ in the last bits (gfaas demo --gpu compares outputs exactly).
            torch.backends.cudnn.benchmark = False
            torch.backends.cudnn.deterministic = True
            # Full fp32, as onnxruntime computes on the CPU: TF32 convolutions (torch's default on
            # Ampere and later) would round the zoo's outputs to ~1e-3 of the reference.
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
        graph = onnx.load(str(path))
        self._inputs = [SimpleNamespace(name=i.name, type=_ONNX_TYPES[i.type.tensor_type.elem_type],
                                        shape=[d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim])
                        for i in graph.graph.input]
        self._outputs = [SimpleNamespace(name=o.name) for o in graph.graph.output]
        with warnings.catch_warnings():  # onnx2torch warns about ops it converts approximately-free; quiet
            warnings.simplefilter("ignore")
            self.module = onnx2torch.convert(graph).eval().to(self.device)
        self._torch = torch
        log.debug("converted %s to torch on %s", path.name, self.device)

    def get_inputs(self) -> list[Any]:
        return list(self._inputs)

    def get_outputs(self) -> list[Any]:
        return list(self._outputs)

    def tensor(self, value: Any) -> Any:
        """``value`` as a torch tensor on this session's device (no copy for a device tensor there)."""
        torch = self._torch
        if isinstance(value, DeviceArray):
            t = value.tensor
        elif isinstance(value, torch.Tensor):
            t = value
        elif on_device(value):
            t = torch.from_dlpack(value)
        else:
            with warnings.catch_warnings():  # a read-only input view: the model never writes its inputs
                warnings.simplefilter("ignore", UserWarning)
                t = torch.from_numpy(np.ascontiguousarray(value))
        return t.to(self.device, non_blocking=False)

    def run_device(self, feeds: dict[str, Any]) -> list[DeviceArray]:
        """The outputs as :class:`DeviceArray` on the device, in ``get_outputs`` order."""
        args = [self.tensor(feeds[i.name]) for i in self._inputs]
        with self._torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = self.module(*args)
        outs = out if isinstance(out, tuple | list) else (out,)
        return [DeviceArray(t) for t in outs]

    def run(self, names: Any, feeds: dict[str, Any]) -> list[np.ndarray]:
        del names
        return [np.asarray(a) for a in self.run_device(feeds)]


def minmax(value: Any) -> tuple[int, int]:
    """Smallest and largest element of a host or device integer array (two scalars cross to the host)."""
    if isinstance(value, np.ndarray):
        return int(value.min()), int(value.max())
    t = value.tensor if isinstance(value, DeviceArray) else as_tensor(value)
    return int(t.min()), int(t.max())


def all_binary(value: Any) -> bool:
    """Whether every element of a host or device array is 0 or 1."""
    if isinstance(value, np.ndarray):
        return bool(np.isin(value, (0, 1)).all())
    t = value.tensor if isinstance(value, DeviceArray) else as_tensor(value)
    return bool(((t == 0) | (t == 1)).all())


def as_tensor(value: Any) -> Any:
    """``value`` (a torch tensor or anything DLPack exports) as a torch tensor, without a copy."""
    import torch

    return value if isinstance(value, torch.Tensor) else torch.from_dlpack(value)
