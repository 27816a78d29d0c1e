"""What the compiler hands to the timing and energy models: one entry per fused operator.

A :class:`MatLayer` is the matrix unit's work, always GEMM-shaped (seed 004 §3: convolutions run as
GEMMs on the systolic array): an output of ``m x n`` (``m`` = output pixels x batch for a convolution,
rows for a matrix product; ``n`` = output channels / columns) reduced over ``k``
(= kernel height x width x input channels per group). Grouped convolutions (depthwise included)
are ``groups`` independent GEMMs of that shape. ``conv`` keeps the convolution's geometry so that
the same layer can be written as a SCALE-Sim topology row for validation.

A :class:`VecLayer` is the vector unit's: ``elements`` outputs, each costing ``ops`` vector-lane
operations (an activation fused after a GEMM runs here too, reading the shared output buffer).
``bytes_in``/``bytes_out`` are what it moves to or from DRAM (0 when it works on the output buffer).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class ConvGeom:
    """A convolution as SCALE-Sim describes one layer (padding already applied to ``ifmap``)."""

    ifmap_h: int
    ifmap_w: int
    filter_h: int
    filter_w: int
    channels: int
    filters: int
    stride: int


@dataclass(frozen=True)
class MatLayer:
    name: str
    op: str
    m: int
    k: int
    n: int
    groups: int = 1
    conv: ConvGeom | None = None
    #: Bytes of weights (all groups), inputs read and outputs written, as the layer's own DRAM traffic.
    weight_bytes: int = 0
    input_bytes: int = 0
    output_bytes: int = 0

    def __post_init__(self) -> None:
        for f in ("m", "k", "n", "groups"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"layer {self.name!r}: {f}={v!r} must be a positive integer")

    @property
    def macs(self) -> int:
        return self.m * self.k * self.n * self.groups


@dataclass(frozen=True)
class VecLayer:
    name: str
    op: str
    elements: int
    ops: int = 1
    bytes_in: int = 0
    bytes_out: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.elements, int) or self.elements < 0:
            raise ConfigError(f"layer {self.name!r}: elements={self.elements!r} must be an integer >= 0")
        if not isinstance(self.ops, int) or self.ops < 0:
            raise ConfigError(f"layer {self.name!r}: ops={self.ops!r} must be an integer >= 0")


Layer = MatLayer | VecLayer
