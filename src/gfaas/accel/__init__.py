"""The in-storage ML accelerator of seed 004 (DSCS-Serverless), modelled: architecture, compiler,
timing, functional emulation, energy and area, design-space exploration. See docs/accel.md."""

from .arch import PRESETS, AccelConfig, load_config, preset
from .compiler import Program, compile_model
from .emulate import check, emulate
from .estimate import Estimate, estimate
from .layers import ConvGeom, Layer, MatLayer, VecLayer
from .power import area_mm2, energy, peak_power_w
from .timing import LayerTiming, ModelTiming, time_layer, time_model

__all__ = ["PRESETS", "AccelConfig", "ConvGeom", "Estimate", "Layer", "LayerTiming", "MatLayer", "ModelTiming",
           "Program", "VecLayer", "area_mm2", "check", "compile_model", "emulate", "energy", "estimate",
           "load_config", "peak_power_w", "preset", "time_layer", "time_model"]
