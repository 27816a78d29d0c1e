"""Which GPUs a runtime's node has, and which of them each ``kind: gpu`` function runs on.

A node daemon reports the GPUs it holds memory pools for (``Admin.devices``, ``Admin.device_kind``).
``cuda`` GPUs are real: a GPU function placed on GPU ``k`` runs its model there (device ``cuda:k``,
the torch engine) and reads and writes device tensors. ``null`` GPUs are modelled (tests, simulation):
functions are placed on them the same way, but compute on the CPU and pass host arrays.

Where a node has several GPUs, :func:`gfaas.policy.place_workflow` decides, as in the simulator,
on the node's topology (the runtime's ``topology`` setting, else what ``nvidia-smi`` reports).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ..errors import ConfigError

log = logging.getLogger("gfaas.runtime")

GPU_SETTINGS = ("auto", "none")


def check_gpus(setting: str) -> str:
    """Validate ``RuntimeConfig.gpus``: ``auto``, ``none``, ``cuda``, ``cuda:0,1`` or ``null:0,1``."""
    if setting in GPU_SETTINGS:
        return setting
    from ..config import parse_devices

    try:
        parse_devices(setting)
    except ConfigError as exc:
        raise ConfigError(f"gpus={setting!r}: {exc}; or use 'auto' (every CUDA GPU when there is one) or 'none'") \
            from None
    return setting


def visible_cuda_gpus() -> int:
    """How many CUDA GPUs this process sees (0 without CuPy, a driver or a GPU)."""
    try:
        import cupy
    except ImportError:
        return 0
    try:
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # no driver, no device: CuPy raises its own CUDARuntimeError
        log.info("no CUDA GPU visible (%s)", exc)
        return 0


def node_devices(setting: str) -> str:
    """The ``NodeConfig.devices`` of the node a runtime starts for ``RuntimeConfig.gpus``."""
    if setting == "none":
        return ""
    if setting == "auto":
        n = visible_cuda_gpus()
        if n:
            log.info("the runtime's node takes the %d CUDA GPU(s) it sees (gpus='auto')", n)
        return "cuda" if n else ""
    return setting


def spread(functions: Sequence[str], gpus: Sequence[int]) -> dict[str, int]:
    """Functions dealt over ``gpus`` in order (modelled GPUs of a node without a topology)."""
    if not gpus:
        raise ConfigError(f"no GPU to place functions {list(functions)} on")
    return {f: gpus[k % len(gpus)] for k, f in enumerate(functions)}


def ordinal(gpu: str) -> int | None:
    """The ordinal of a topology GPU name ``gpuK`` (``None`` for another name)."""
    if gpu.startswith("gpu") and gpu[3:].isdigit():
        return int(gpu[3:])
    return None
