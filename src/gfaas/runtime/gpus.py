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
from typing import TYPE_CHECKING

from ..errors import ConfigError

if TYPE_CHECKING:
    from .spec import FunctionSpec

log = logging.getLogger("gfaas.runtime")

GPU_SETTINGS = ("auto", "none")
RAY_WHOLE_GPU = 1.0  # what a ``kind: gpu`` function's Ray actor asks for when its spec names no share
RAY_GPU_GRAIN = 1e-4  # the smallest share Ray accounts (its resource quantities are multiples of it)


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


def ray_num_gpus(fn: FunctionSpec) -> float:
    """The ``num_gpus`` a function's Ray actor asks Ray for: none for ``kind: cpu``; for ``kind: gpu``
    its ``resources: gpus`` share (the spec allows 0 < gpus <= 1: Ray packs fractional requests onto one
    GPU, so two functions of 0.5 share it), else a whole GPU. ``gpus: 0`` cannot be told from a spec
    that says nothing (:class:`~gfaas.policy.resources.Resources` defaults to 0), so it asks for a whole
    one too: a share under Ray is what the spec declares, never nothing."""
    if fn.kind != "gpu":
        return 0.0
    share = float(fn.resources.gpus) if fn.resources is not None else 0.0
    if share <= 0:
        return RAY_WHOLE_GPU
    return max(share, RAY_GPU_GRAIN)  # below Ray's grain a request would round to no GPU at all


def ray_gpu_ordinal(ray_id: int | str, node_visible: Sequence[str] = ()) -> int:
    """The node daemon's ordinal of the GPU Ray assigned an actor (``ray_id``, from ``ray.get_gpu_ids()``).

    Two numberings meet here. Ray sets an actor's ``CUDA_VISIBLE_DEVICES`` to the GPUs it assigned, so
    inside the actor its GPU is ``cuda:0``; the machine's node daemon, which holds each GPU's memory pool
    and passes data on it, sees every GPU of the machine, numbered 0..n-1 in the order of the
    ``CUDA_VISIBLE_DEVICES`` it started with. Ray names a GPU by its entry in that same list
    (``node_visible``: the daemon and its Ray node start from one environment, ``gfaas node start
    --ray-address``), or by its index when the list was unset. So the daemon's ordinal is the entry's
    position in the list, else the id itself."""
    rid = str(ray_id).strip()
    listed = [str(v).strip() for v in node_visible]
    if rid in listed:
        return listed.index(rid)
    if rid.isdigit() and not listed:
        return int(rid)
    raise ConfigError(f"Ray assigned GPU {ray_id!r}, which is not in this node's CUDA_VISIBLE_DEVICES "
                      f"{','.join(listed) or '(unset)'}; start the node daemon and its Ray node with the same "
                      "CUDA_VISIBLE_DEVICES (gfaas node start --ray-address starts both)")
