"""The accelerator's timing: an analytical cycle model of the systolic matrix unit and the vector unit.

One parameterised model covers the three dataflows. A GEMM ``m x k x n`` is mapped onto the
``rows x cols`` array by naming which GEMM dimension runs along the array's rows (``Sr``), which
along its columns (``Sc``) and which streams through it in time (``T``), as SCALE-Sim v3 does:

============  =====  =====  =====
dataflow      Sr     Sc     T
============  =====  =====  =====
output (os)   m      n      k
weight (ws)   k      n      m
input  (is)   k      m      n
============  =====  =====  =====

**Compute cycles** (what SCALE-Sim v3 reports as compute cycles; docs/accel-timing.md derives it
from its compute modules): the array works through ``ceil(Sr/rows) * ceil(Sc/cols)`` folds, column
folds outermost, each fold padded to the full array, and a fold lasts ``T + rows + cols - 2`` cycles
(``T`` operand wavefronts plus the skew of filling and draining the array) plus ``rows`` cycles in
the weight- and input-stationary dataflows to preload the stationary operand. The whole layer is
``folds * per_fold - 1`` cycles (SCALE-Sim's layer total is one less than the sum of its folds'
demand rows; measured on every layer of the oracle table). ``groups`` independent GEMMs (grouped and depthwise convolutions) run one after
another, each counted like a layer of its own (SCALE-Sim splits a depthwise layer into one layer per
channel).

**Stall cycles**: each operand has a scratchpad; with double buffering a fold's DRAM traffic (the
operand blocks it needs that are not already on chip, plus its output block or partial sums going
out) overlaps one fold of compute, so a fold stalls ``max(0, transfer - compute)`` cycles; the first
fold's loads and the last fold's stores overlap nothing. An operand is fetched once when the whole
of it fits in half its scratchpad (the other half is the buffer being filled); otherwise a block
is refetched whenever the fold that needs it comes round again. Folds have at most a few distinct
shapes (full or edge blocks, first or later in a loop), so a layer is a handful of arithmetic steps
whatever its fold count: no per-fold loop, and results are cached per (config, shape).

The vector unit does ``ceil(elements * ops / vector_lanes)`` cycles; its DRAM traffic streams
alongside and stalls only by what the compute does not hide.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from ..errors import ConfigError
from .arch import AccelConfig
from .layers import MatLayer, VecLayer

__all__ = ["LayerTiming", "ModelTiming", "fold_plan", "time_layer", "time_model"]

#: Which GEMM dimension (0 = m, 1 = k, 2 = n) runs along the array rows, the columns, and in time.
_MAPPING: dict[str, tuple[int, int, int]] = {"os": (0, 2, 1), "ws": (1, 2, 0), "is": (1, 0, 2)}
#: The dimensions each operand spans: input (m, k), weight (k, n), output (m, n).
_INPUT, _WEIGHT, _OUTPUT = (0, 1), (1, 2), (0, 2)


@dataclass(frozen=True)
class LayerTiming:
    """One layer's cycles and traffic. ``sram_reads``/``sram_writes`` count scratchpad accesses in
    elements (operand reads by the array, output and partial-sum writes, DRAM fills and drains)."""

    name: str
    op: str
    compute_cycles: int
    stall_cycles: int
    dram_bytes: int
    macs: int
    sram_reads: int
    sram_writes: int

    @property
    def cycles(self) -> int:
        return self.compute_cycles + self.stall_cycles


@dataclass(frozen=True)
class ModelTiming:
    layers: tuple[LayerTiming, ...]

    @property
    def cycles(self) -> int:
        return sum(lt.compute_cycles + lt.stall_cycles for lt in self.layers)

    @property
    def compute_cycles(self) -> int:
        return sum(lt.compute_cycles for lt in self.layers)

    @property
    def stall_cycles(self) -> int:
        return sum(lt.stall_cycles for lt in self.layers)

    @property
    def macs(self) -> int:
        return sum(lt.macs for lt in self.layers)

    @property
    def dram_bytes(self) -> int:
        return sum(lt.dram_bytes for lt in self.layers)

    def seconds(self, cfg: AccelConfig) -> float:
        return self.cycles / (cfg.freq_mhz * 1e6)

    def utilization(self, cfg: AccelConfig) -> float:
        """MACs done over MACs the array could have done in the same cycles (0 for no cycles)."""
        c = self.cycles
        return self.macs / (c * cfg.rows * cfg.cols) if c else 0.0


def fold_plan(dataflow: str, rows: int, cols: int, m: int, k: int, n: int) -> tuple[int, int, int]:
    """``(row_folds, col_folds, cycles_per_fold)`` of one GEMM on the array (module docstring)."""
    r, c, t = _MAPPING[dataflow]
    dims = (m, k, n)
    per_fold = dims[t] + rows + cols - 2 + (rows if dataflow != "os" else 0)
    return -(-dims[r] // rows), -(-dims[c] // cols), per_fold


def _blocks(extent: int, tile: int) -> list[tuple[int, bool, bool, int]]:
    """The blocks a dimension splits into: ``(size, first, last, count)``, at most three kinds."""
    nfold = -(-extent // tile)
    last = extent - (nfold - 1) * tile
    if nfold == 1:
        return [(last, True, True, 1)]
    out = [(tile, True, False, 1)]
    if nfold > 2:
        out.append((tile, False, False, nfold - 2))
    out.append((last, False, True, 1))
    return out


@lru_cache(maxsize=1 << 16)
def _mat(df: str, rows: int, cols: int, half_in: float, half_w: float, half_out: float, bpc: float,
         m: int, k: int, n: int, groups: int, b_in: float, b_w: float, b_out: float
         ) -> tuple[int, int, float, float, int, int]:
    """``(compute, stall, dram_load_bytes, dram_store_bytes, sram_reads, sram_writes)`` of one
    MatLayer (module docstring). ``b_*`` are one group's operand bytes, ``half_*`` half of each
    scratchpad, ``bpc`` DRAM bytes per cycle."""
    ri, ci, ti = _MAPPING[df]
    dims = (m, k, n)
    row_folds, col_folds, per_fold = fold_plan(df, rows, cols, m, k, n)
    compute = groups * (row_folds * col_folds * per_fold - 1)

    # Scratchpad accesses by the array, in elements: the stationary operand (spanning both array
    # dimensions) is read once; one spanning the streamed dimension is read again for every fold of
    # the array dimension it does not span. Outputs accumulate over row folds in ws/is (partial sums
    # written each row fold and read back).
    def reads(span: tuple[int, int]) -> int:
        full = dims[span[0]] * dims[span[1]]
        if ti not in span:
            return full
        return full * (col_folds if ci not in span else row_folds)

    passes = 1 if ri in _OUTPUT else row_folds
    sram_reads = groups * (reads(_INPUT) + reads(_WEIGHT) + (passes - 1) * m * n)
    sram_writes = groups * passes * m * n

    # Each operand by how its block changes over the fold loops (columns outer, rows inner):
    # 0 = spans both array dimensions (a new block every fold), 1 = spans the row dimension and the
    # streamed one (changes every inner fold), 2 = spans the column dimension and the streamed one.
    # Bytes per element: its DRAM bytes spread over its GEMM footprint (a convolution's feature map
    # is smaller than its unrolled patches).
    t_ext = dims[ti]

    def kind(span: tuple[int, int]) -> int:
        return 0 if ti not in span else (1 if ri in span else 2)

    operands = [(kind(_INPUT), b_in / (m * k), b_in, half_in), (kind(_WEIGHT), b_w / (k * n), b_w, half_w)]
    out_kind, out_pe = kind(_OUTPUT), b_out / (m * n)
    stall_sum = loads_total = stores_total = 0.0  # over one group's folds
    first_load = last_store = first_x = last_x = 0.0
    for csz, cfirst, clast, ccount in _blocks(dims[ci], cols):
        for rsz, rfirst, rlast, rcount in _blocks(dims[ri], rows):
            load = 0.0
            for kd, pe, whole, half in operands:
                if kd == 0:
                    load += rsz * csz * pe
                elif kd == 1:  # kept across column folds only if all of it fits
                    if cfirst or whole > half:
                        load += rsz * t_ext * pe
                else:  # kept over the row folds of its column block if that block fits
                    block = csz * t_ext * pe
                    if rfirst or block > half:
                        load += block
            if out_kind == 0:  # os: each fold finishes its own outputs
                store = rsz * csz * out_pe
            else:  # ws/is: outputs accumulate over the row folds
                oblock = csz * t_ext * out_pe
                if oblock <= half_out:  # on chip, written after the last row fold
                    store = oblock if rlast else 0.0
                else:  # partial sums spill to DRAM and come back
                    store = oblock
                    if not rfirst:
                        load += oblock
            x = (load + store) / bpc
            cnt = rcount * ccount
            if x > per_fold:
                stall_sum += cnt * (x - per_fold)
            loads_total += cnt * load
            stores_total += cnt * store
            if rfirst and cfirst:
                first_load, first_x = load, x
            if rlast and clast:
                last_store, last_x = store, x
    # Every fold's traffic was counted as overlapping one fold of compute. The layer's first loads
    # and last stores overlap none (the groups run back to back, so only the layer's ends are bare).
    stall = groups * stall_sum
    if row_folds * col_folds * groups == 1:
        stall += (first_load + last_store) / bpc - max(0.0, first_x - per_fold)
    else:
        fl, ls = first_load / bpc, last_store / bpc
        stall += fl - max(0.0, first_x - per_fold) + max(0.0, first_x - fl - per_fold)
        stall += ls - max(0.0, last_x - per_fold) + max(0.0, last_x - ls - per_fold)
    return (compute, round(stall), groups * loads_total, groups * stores_total, sram_reads,
            sram_writes)


def time_layer(cfg: AccelConfig, layer: MatLayer | VecLayer) -> LayerTiming:
    """Cycles, DRAM bytes and scratchpad accesses of one layer on ``cfg`` (module docstring)."""
    eb = cfg.element_bytes
    if isinstance(layer, VecLayer):
        compute = -(-layer.elements * layer.ops // cfg.vector_lanes)
        dram = layer.bytes_in + layer.bytes_out
        stall = max(0, round(dram / cfg.bytes_per_cycle) - compute)
        return LayerTiming(layer.name, layer.op, compute, stall, dram, 0, layer.elements + layer.bytes_out // eb,
                           layer.elements + layer.bytes_in // eb)
    if not isinstance(layer, MatLayer):
        raise ConfigError(f"time_layer: {layer!r} is neither a MatLayer nor a VecLayer")
    g, m, k, n = layer.groups, layer.m, layer.k, layer.n
    if layer.weight_bytes or layer.input_bytes or layer.output_bytes:
        b_in, b_w, b_out = layer.input_bytes / g, layer.weight_bytes / g, layer.output_bytes / g
    else:  # no traffic given: every operand from and to DRAM once, inputs as the unrolled GEMM operand
        b_in, b_w, b_out = float(m * k * eb), float(k * n * eb), float(m * n * eb)
        if layer.conv is not None:  # a convolution reads its feature map, not the unrolled patches
            cg = layer.conv
            b_in = float(cg.ifmap_h * cg.ifmap_w * cg.channels * eb) / g
    compute, stall, loads, stores, reads, writes = _mat(
        cfg.dataflow, cfg.rows, cfg.cols, cfg.ifmap_sram / 2, cfg.filter_sram / 2, cfg.ofmap_sram / 2,
        cfg.bytes_per_cycle, m, k, n, g, b_in, b_w, b_out)
    # DRAM fills are scratchpad writes and drains scratchpad reads (in elements, for energy).
    return LayerTiming(layer.name, layer.op, compute, stall, round(loads + stores), layer.macs,
                       reads + round(stores / eb), writes + round(loads / eb))


def time_model(cfg: AccelConfig, layers: Sequence[MatLayer | VecLayer]) -> ModelTiming:
    """Every layer timed on ``cfg``, in order; layers run one after another."""
    return ModelTiming(tuple(time_layer(cfg, layer) for layer in layers))
