"""Machine topologies: devices, per-direction links, presets, YAML files and local detection."""

from .detect import detect
from .io import dump_yaml, load, loads, resolve, save
from .model import GB, Device, Edge, Link, Topology
from .presets import PRESETS, preset

__all__ = ["GB", "PRESETS", "Device", "Edge", "Link", "Topology", "detect", "dump_yaml", "load", "loads",
           "preset", "resolve", "save"]
