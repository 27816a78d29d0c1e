"""The in-storage ML accelerator of seed 004 (DSCS-Serverless), modelled: architecture, compiler,
timing, functional emulation, energy and area, design-space exploration. See docs/accel.md."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .arch import PRESETS, AccelConfig, load_config, preset
    from .compiler import Program, compile_model
    from .emulate import check, emulate
    from .estimate import Estimate, estimate
    from .layers import ConvGeom, Layer, MatLayer, VecLayer
    from .power import area_mm2, energy, peak_power_w
    from .timing import LayerTiming, ModelTiming, time_layer, time_model

# Loaded on first use: the compiler, emulator and estimator import onnx, and every runtime imports this
# package for its drives' configuration (runtime.accel uses .arch alone). Importing onnx cost a runtime's
# start 0.1-0.9 s (its ml_dtypes 0.7 alone 0.74-0.83 s on a 2-core AMD EPYC VM: python -X importtime).
_EXPORTS = {  # name -> the submodule that defines it (as gfaas.models does)
    "PRESETS": "arch", "AccelConfig": "arch", "load_config": "arch", "preset": "arch",
    "Program": "compiler", "compile_model": "compiler", "check": "emulate", "emulate": "emulate",
    "Estimate": "estimate", "estimate": "estimate", "ConvGeom": "layers", "Layer": "layers",
    "MatLayer": "layers", "VecLayer": "layers", "area_mm2": "power", "energy": "power",
    "peak_power_w": "power", "LayerTiming": "timing", "ModelTiming": "timing", "time_layer": "timing",
    "time_model": "timing",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = ["PRESETS", "AccelConfig", "ConvGeom", "Estimate", "Layer", "LayerTiming", "MatLayer", "ModelTiming",
           "Program", "VecLayer", "area_mm2", "check", "compile_model", "emulate", "energy", "estimate",
           "load_config", "peak_power_w", "preset", "time_layer", "time_model"]
