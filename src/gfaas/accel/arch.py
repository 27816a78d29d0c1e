"""The accelerator's architecture: one frozen configuration (seed 004 §3, Fig. 6).

A matrix unit (a ``rows x cols`` systolic array of multiply-accumulate PEs running one of three
dataflows), a SIMD vector unit sharing the matrix unit's output buffer, three scratchpads (inputs,
weights, outputs; each split into banks), a DRAM staging memory of ``dram_gbps``, a clock, a
technology node and an SRAM cell type (high-performance cells leak far more than low-power ones,
which decides whether a large scratchpad fits a drive's power budget: ../shared/design/anchors.md).

Presets (:data:`PRESETS`): ``dscs``, the point seed 004's design-space exploration chooses
(128 x 128, 4 MB, DDR5 38 GB/s, 1 GHz, 14 nm); ``tpuv1``, the paper's starting point (256 x 256,
28 MB, 34 GB/s; seed 004 §3 after Jouppi et al. 2017, 700 MHz, 28 nm); ``smartssd-fpga``, the same
DSA synthesised on the Samsung SmartSSD's FPGA (Table 2: 250 MHz, 2 MB on-chip; the array size is
our assumption, a 32 x 32 array that such an FPGA's DSPs hold). Configurations also load from YAML
(:func:`load_config`), with the same field names.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal

from ..errors import ConfigError

Dataflow = Literal["os", "ws", "is"]
DATAFLOWS: tuple[str, ...] = ("os", "ws", "is")
DATAFLOW_NAMES = {"os": "output-stationary", "ws": "weight-stationary", "is": "input-stationary"}
CellType = Literal["hp", "lp"]
Precision = Literal["fp32", "int8"]
KiB = 1024
MiB = 1024 * KiB


@dataclass(frozen=True)
class AccelConfig:
    """One design point. Sizes in bytes, bandwidth in GB/s (1e9 bytes per second), clock in MHz."""

    name: str = "custom"
    rows: int = 128
    cols: int = 128
    dataflow: Dataflow = "os"
    #: Vector unit: lanes (elements per cycle for a one-cycle op).
    vector_lanes: int = 128
    ifmap_sram: int = 1 * MiB
    filter_sram: int = 2 * MiB
    ofmap_sram: int = 1 * MiB
    banks: int = 16
    dram_gbps: float = 38.0
    freq_mhz: float = 1000.0
    tech_nm: int = 14
    cell: CellType = "lp"
    #: Bytes per element the matrix unit reads and writes (int8 = 1, fp32 = 4).
    precision: Precision = "int8"

    def __post_init__(self) -> None:
        for f in ("rows", "cols", "vector_lanes", "banks"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{f}={v!r} must be a positive integer (e.g. {f}=128)")
        for f in ("ifmap_sram", "filter_sram", "ofmap_sram"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < KiB:
                raise ConfigError(f"{f}={v!r} must be a whole number of bytes >= 1024 (e.g. {f}={MiB})")
        for f in ("dram_gbps", "freq_mhz"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ConfigError(f"{f}={v!r} must be a number > 0")
        if self.dataflow not in DATAFLOWS:
            raise ConfigError(f"dataflow={self.dataflow!r} is not one of {', '.join(DATAFLOWS)} "
                              "(output-, weight- or input-stationary)")
        if self.cell not in ("hp", "lp"):
            raise ConfigError(f"cell={self.cell!r} must be 'hp' (high-performance SRAM) or 'lp' (low-power)")
        if self.precision not in ("fp32", "int8"):
            raise ConfigError(f"precision={self.precision!r} must be 'fp32' or 'int8'")
        if self.tech_nm not in (45, 28, 14):
            raise ConfigError(f"tech_nm={self.tech_nm!r}: energies are scaled for 45, 28 and 14 nm only")

    @property
    def pes(self) -> int:
        return self.rows * self.cols

    @property
    def sram_bytes(self) -> int:
        return self.ifmap_sram + self.filter_sram + self.ofmap_sram

    @property
    def element_bytes(self) -> int:
        return 1 if self.precision == "int8" else 4

    @property
    def bytes_per_cycle(self) -> float:
        """DRAM bytes per accelerator clock cycle."""
        return self.dram_gbps * 1e9 / (self.freq_mhz * 1e6)

    def with_(self, **changes: Any) -> AccelConfig:
        """A copy with fields changed (validated like a new config)."""
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise ConfigError(f"unknown accelerator field(s) {', '.join(sorted(unknown))}; "
                              f"known: {', '.join(f.name for f in fields(self))}")
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _point(name: str, side: int, dataflow: Dataflow, sram: int, dram_gbps: float, freq_mhz: float,
           tech_nm: int, cell: CellType) -> AccelConfig:
    """A square array with ``sram`` bytes split 1/4 inputs, 1/2 weights, 1/4 outputs."""
    return AccelConfig(name, side, side, dataflow, side, ifmap_sram=sram // 4, filter_sram=sram // 2,
                       ofmap_sram=sram - sram // 4 - sram // 2, dram_gbps=dram_gbps, freq_mhz=freq_mhz,
                       tech_nm=tech_nm, cell=cell)


PRESETS: dict[str, AccelConfig] = {
    "dscs": _point("dscs", 128, "os", 4 * MiB, 38.0, 1000.0, 14, "lp"),
    "tpuv1": _point("tpuv1", 256, "ws", 28 * MiB, 34.0, 700.0, 28, "hp"),
    "smartssd-fpga": _point("smartssd-fpga", 32, "os", 2 * MiB, 19.2, 250.0, 14, "lp"),
}


def preset(name: str) -> AccelConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown accelerator preset {name!r}; choose one of {', '.join(PRESETS)} "
                          "or give a YAML file")
    return PRESETS[name]


def config_from_dict(data: dict[str, Any], where: str = "config") -> AccelConfig:
    """A config from a mapping: ``base`` (a preset name) then field overrides; sizes may be given as
    ``"4MiB"``/``"512KiB"`` strings."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of accelerator fields, got {type(data).__name__}")
    data = dict(data)
    base = preset(str(data.pop("base"))) if "base" in data else AccelConfig()
    for k in ("ifmap_sram", "filter_sram", "ofmap_sram"):
        if isinstance(data.get(k), str):
            data[k] = parse_bytes(data[k], f"{where}: {k}")
    try:
        return base.with_(**data)
    except TypeError as e:  # pragma: no cover - with_ validates names first
        raise ConfigError(f"{where}: {e}") from None


def load_config(spec: str) -> AccelConfig:
    """A preset name, or a YAML file of fields (see :func:`config_from_dict`)."""
    if spec in PRESETS:
        return PRESETS[spec]
    p = Path(spec)
    if not p.is_file():
        raise ConfigError(f"--config {spec!r} is neither a preset ({', '.join(PRESETS)}) nor a YAML file")
    import yaml

    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{spec}: not valid YAML ({e})") from None
    return config_from_dict(data, str(p))


def parse_bytes(text: str, what: str = "size") -> int:
    units = {"": 1, "B": 1, "KIB": KiB, "KB": 1000, "MIB": MiB, "MB": 1000 * 1000, "GIB": 1024 * MiB}
    s = text.strip().upper().replace(" ", "")
    num = s.rstrip("KMGIB")
    unit = s[len(num):]
    try:
        value = float(num)
    except ValueError:
        value = math.nan
    if unit not in units or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{what}={text!r} is not a size; write e.g. '4MiB' or '512KiB'")
    return int(value * units[unit])


def parse_array(text: str) -> tuple[int, int]:
    """``"128x128"`` -> (128, 128)."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ConfigError(f"--array {text!r}: write ROWSxCOLS, e.g. 128x128")
    return int(parts[0]), int(parts[1])
