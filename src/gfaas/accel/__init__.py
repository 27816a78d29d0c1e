"""The in-storage ML accelerator of seed 004 (DSCS-Serverless), modelled: architecture, compiler,
timing, functional emulation, energy and area, design-space exploration. See docs/accel.md."""

from .arch import PRESETS, AccelConfig, load_config, preset
from .layers import ConvGeom, Layer, MatLayer, VecLayer

__all__ = ["PRESETS", "AccelConfig", "ConvGeom", "Layer", "MatLayer", "VecLayer", "load_config", "preset"]
