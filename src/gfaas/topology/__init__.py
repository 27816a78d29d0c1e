"""Machine topologies: devices, per-direction links, presets, YAML files and local detection."""

from .model import GB, Device, Edge, Link, Topology
from .presets import PRESETS, preset

__all__ = ["GB", "PRESETS", "Device", "Edge", "Link", "Topology", "preset"]
