"""A tensor on a GPU that numpy code can still read: :class:`DeviceArray`.

GPU functions hand their model outputs on without a trip through host memory, yet most handlers
post-process in numpy. A :class:`DeviceArray` serves both: frameworks and the data plane take it
without a copy (DLPack, ``__cuda_array_interface__``), while ``np.asarray(x)`` copies it to the host
when a handler asks for numbers. So a handler that returns a model output unchanged passes it on
device to device, and one that computes on it in numpy still works, paying one copy.

It wraps a torch tensor (torch runs the zoo's models on GPUs, :mod:`gfaas.models.torch_engine`).
"""

from __future__ import annotations

from typing import Any

import numpy as np


class DeviceArray:
    """A torch tensor (normally on a GPU) with numpy's ``shape``/``dtype``/``ndim`` and ``__array__``."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(n) for n in self.tensor.shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        return torch_dtype_to_numpy(self.tensor.dtype)

    @property
    def ndim(self) -> int:
        return int(self.tensor.dim())

    @property
    def nbytes(self) -> int:
        return int(self.tensor.numel()) * int(self.tensor.element_size())

    @property
    def device(self) -> Any:
        return self.tensor.device

    def __len__(self) -> int:
        return int(self.tensor.shape[0])

    def __getitem__(self, index: Any) -> DeviceArray:
        if isinstance(index, np.ndarray):  # a numpy mask or index list selects rows on the device
            import torch

            index = torch.as_tensor(index, device=self.tensor.device)
        return DeviceArray(self.tensor[index])

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        # The host copy a numpy caller asked for: device -> host, once per call.
        host = self.tensor.detach().cpu().contiguous().numpy()
        return host if dtype is None else host.astype(dtype, copy=False)

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self.tensor.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        kind, dev = self.tensor.__dlpack_device__()
        return int(kind), int(dev)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        # Only CUDA tensors have one; torch raises AttributeError for the others, so hasattr() says False.
        return self.tensor.__cuda_array_interface__

    def contiguous(self) -> DeviceArray:
        return DeviceArray(self.tensor.contiguous())

    def __repr__(self) -> str:
        return f"DeviceArray({self.tensor.device}, {self.shape}, {self.dtype})"


def torch_dtype_to_numpy(dt: Any) -> np.dtype[Any]:
    """numpy's dtype for a torch dtype (``torch.float32`` -> ``float32``)."""
    name = str(dt).removeprefix("torch.")
    try:
        return np.dtype(name)
    except TypeError:
        from ..errors import ConfigError

        raise ConfigError(f"torch dtype {dt} has no numpy equivalent; convert the tensor "
                          "(e.g. .float()) before passing it on") from None


def on_device(obj: Any) -> bool:
    """Whether ``obj`` lives in GPU memory (DLPack device kDLCUDA)."""
    f = getattr(obj, "__dlpack_device__", None)
    if f is None:
        return hasattr(obj, "__cuda_array_interface__")
    return int(f()[0]) == 2
