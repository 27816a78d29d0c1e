"""Seed 004 §6 (DSCS-Serverless) as a model: the eight applications, the seven platforms, the storage
paths, end-to-end latency / energy / cost efficiency, and the rack-scale run.

Every application is a chain of three serverless functions: f1 pre-processes the input object, f2 runs
the model, f3 (always on a CPU compute node) post-processes and notifies. Functions exchange objects
through storage. What each platform pays per function (``phases``):

* *remote* platforms (CPU, GPU, FPGA): the system stack, a remote object-store read of the function's
  input, for an accelerator a PCIe copy in and out plus its driver overhead, the compute, and a remote
  write of the output;
* *near-storage* platforms (NS-ARM, NS-Mobile-GPU, NS-FPGA, DSCS) run f1 and f2 on the drive: a P2P
  flash read, the compute, a P2P write; f3 still runs on a CPU and reads f2's output remotely.

Compute of the non-DSCS platforms is a roofline at batch 1: ``max(flops / (peak * eff_compute),
bytes / (bandwidth * eff_memory))`` with bytes = weights + the model's input and output. DSCS compute
(seconds and joules per inference) is **an input**, a provider ``(model, batch) -> (s, J)``, so that
the accelerator's timing and energy model is plugged in, not re-derived here.

Storage latency of one access at quantile ``q`` is ``lognormal_quantile(median, sigma, q) + bytes / bw``
per path. Paths are evaluated at the same quantile (seed 004 reports 95th-percentile latencies).
Cost efficiency (seed 004 §6.1, after E3) is ``throughput x T / (CAPEX + OPEX)`` over ``T`` = 3 years at
30% utilisation and $0.0975/kWh.

Every constant below names its source; those that are our assumptions say so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigError, Overloaded
from ..policy.accel_sched import ACCEL, CPU, FcfsQueue, Waiting, place
from .kernel import EventLog, Simulator

if TYPE_CHECKING:
    from .dscs_work import Work

__all__ = [
    "APPS", "PLATFORMS", "App", "Breakdown", "DscsProvider", "Phase", "Platform", "RackResult",
    "StoragePaths", "app_energy", "app_latency", "capex", "cost_efficiency", "dscs_vector_seconds",
    "lognormal_quantile", "phases", "roofline_seconds", "simulate_rack", "with_quantile",
]

#: ``provider(model, batch) -> (seconds, joules)``: one DSCS inference of zoo model ``model``.
DscsProvider = Callable[[str, int], tuple[float, float]]

HOUR = 3600.0
YEAR = 365.0 * 24 * HOUR


# ---- applications (seed 004 Table 1) ---------------------------------------------------------------


@dataclass(frozen=True)
class App:
    """One Table 1 application: zoo model of f2 and the objects the chain moves.

    ``raw_bytes``: f1's input object as stored (images: uint8 H x W x 3 at the model's resolution, an
    uncompressed upper bound of the JPEG; text: 4 bytes per token; tabular: the fp32 feature vector).
    f1 writes the model's input tensor (its graph input, fp32/int64); f2 writes ``out_bytes`` (the graph
    output, except GPT-2, whose function returns the chosen token ids, not 25 MB of logits).
    """

    name: str
    model: str
    paper_model: str
    paper_params: str
    raw_bytes_per_item: int
    out_bytes_override: int | None = None

    def work(self, batch: int = 1) -> Work:
        from .dscs_work import zoo_work  # onnx loads only when a model's work is needed

        return zoo_work(self.model, batch)

    def objects(self, batch: int = 1) -> tuple[int, int, int]:
        """(f1 input, f1 output = f2 input, f2 output = f3 input) in bytes."""
        w = self.work(batch)
        out = w.out_bytes if self.out_bytes_override is None else self.out_bytes_override * batch
        return self.raw_bytes_per_item * batch, w.in_bytes, out


_IMG224 = 224 * 224 * 3
APPS: dict[str, App] = {a.name: a for a in (
    App("credit-risk", "logreg", "logistic regression", "200", 32 * 4),
    App("asset-damage", "resnet50", "ResNet-50", "25M", _IMG224),
    App("ppe-detection", "yolo", "YOLOv3 (ours: YOLOv3-tiny)", "65M (ours 8.9M)", 416 * 416 * 3),
    App("clinical", "fcn", "FCN", "54M (ours FCN-ResNet50 33M)", _IMG224),
    App("content-moderation", "efficientnet_b0", "EfficientNet", "11.5M (ours B0 5.3M)", _IMG224),
    App("chatbot", "bert_base", "BERT-base", "110M", 128 * 4),
    App("translation", "gpt2_small", "GPT-2 (1.5B)", "1.5B (ours small 124M)", 128 * 4, out_bytes_override=128 * 8),
    App("remote-sensing", "vit_b16", "Vision Transformer", "632M (ours ViT-B/16 87M)", _IMG224),
)}

#: f1 (resize/normalise, tokenise) and f3 (threshold/format a notification): FLOPs per byte they touch.
#: Our assumption; both are tiny next to f2 and the storage accesses.
PRE_FLOP_PER_BYTE = 10.0


# ---- platforms (seed 004 Table 2) ------------------------------------------------------------------


@dataclass(frozen=True)
class Platform:
    """A compute platform with a batch-1 roofline, power and price.

    ``peak_flops``: FLOP/s (MAC = 2); ``mem_bw``: bytes/s of the device memory; ``eff_compute`` and
    ``eff_memory``: fractions of those peaks reached at batch 1 (assumptions, stated in ``source``);
    ``near``: on the drive (P2P access to flash) or on a compute node (remote object store);
    ``pcie_bw``: host<->device copies of a remote accelerator (``0``: the host CPU itself);
    ``driver_s``: per-function driver/launch overhead; ``bytes_per_param``: weight precision;
    ``power_w``: TDP/board power (Table 2); ``price_usd``: CAPEX of the device on top of the host.
    """

    name: str
    chip: str
    peak_flops: float
    mem_bw: float
    eff_compute: float
    eff_memory: float
    power_w: float
    price_usd: float
    near: bool
    pcie_bw: float = 0.0
    driver_s: float = 0.0
    bytes_per_param: float = 4.0
    source: str = ""

    def __post_init__(self) -> None:
        for k in ("peak_flops", "mem_bw", "power_w"):
            v = getattr(self, k)
            if not (math.isfinite(v) and v > 0):
                raise ConfigError(f"platform {self.name}: {k}={v!r} must be a finite number > 0")
        for k in ("eff_compute", "eff_memory"):
            v = getattr(self, k)
            if not 0 < v <= 1:
                raise ConfigError(f"platform {self.name}: {k}={v!r} must be in (0, 1]")
        for k in ("price_usd", "pcie_bw", "driver_s"):
            if not getattr(self, k) >= 0:
                raise ConfigError(f"platform {self.name}: {k}={getattr(self, k)!r} must be >= 0")


def roofline_seconds(flops: float, nbytes: float, p: Platform) -> float:
    """Batch-1 roofline: the slower of compute at ``peak * eff_compute`` and traffic at ``bw * eff_memory``."""
    if flops < 0 or nbytes < 0:
        raise ConfigError(f"roofline of {flops} FLOP and {nbytes} bytes: both must be >= 0")
    return max(flops / (p.peak_flops * p.eff_compute), nbytes / (p.mem_bw * p.eff_memory))


_G = 1e9
PCIE3_X16 = 15.75 * _G  # PCIe 3.0: 8 GT/s x 128b/130b = 0.985 GB/s per lane (PCI-SIG)
PCIE4_X8 = 15.75 * _G
PCIE3_X4 = 3.94 * _G
#: Batch-1 efficiency of a CPU running small GEMMs/convolutions; our assumption (ONNX-runtime-class
#: kernels reach a few tens of percent of AVX-512 peak at batch 1).
CPU_EFF = 0.25
#: Batch-1 efficiency of a GPU (seed 004 §6.2.1 names batch-1 under-utilisation); our assumption.
GPU_EFF = 0.15
#: A DSA mapped on an FPGA keeps its PEs busier than a GPU at batch 1; our assumption.
FPGA_EFF = 0.5
MEM_EFF = 0.7  # sustained / peak DRAM bandwidth; our assumption (STREAM-class ratio)

PLATFORMS: dict[str, Platform] = {p.name: p for p in (
    Platform("cpu", "Xeon Platinum 8275CL (c5.4xlarge)", 16 * 3.0 * _G * 32, 6 * 23.46 * _G, CPU_EFF, MEM_EFF,
             240.0, 0.0, near=False,
             source="Table 2: 16 cores, 3 GHz, 240 W; 32 FP32 FLOP/cycle/core (2 AVX-512 FMA units, Intel "
                    "Cascade Lake); 6 channels DDR4-2933 = 140.8 GB/s (Intel 8200-series spec)"),
    Platform("gpu", "RTX 2080 Ti", 4352 * 2 * 1.35 * _G, 616 * _G, GPU_EFF, MEM_EFF, 250.0, 999.0, near=False,
             pcie_bw=PCIE3_X16, driver_s=50e-6,
             source="Table 2: 4352 CUDA cores at 1.35 GHz, 250 W, PCIe 3.0 x16; 616 GB/s GDDR6 and $999 launch "
                    "price (NVIDIA, 2018); 50 us launch/copy set-up per function (assumption)"),
    Platform("fpga", "Xilinx Alveo U280", 1024 * 2 * 0.25 * _G, 460 * _G, FPGA_EFF, MEM_EFF, 225.0, 7000.0,
             near=False, pcie_bw=PCIE4_X8, driver_s=2e-3, bytes_per_param=1.0,
             source="Table 2: 1024 PEs at 250 MHz, 225 W, PCIe 4.0 x8; HBM2 460 GB/s (Xilinx DS963); int8 "
                    "weights, ~$7,000 list price and 2 ms XRT driver overhead per function (assumptions)"),
    Platform("ns-arm", "4x Arm Cortex-A57 (Jetson TX2)", 4 * 2.0 * _G * 8, 58.3 * _G, CPU_EFF, MEM_EFF, 15.0,
             399.0, near=True,
             source="Table 2: 4 cores at 2 GHz, 15 W; 8 FP32 FLOP/cycle/core (128-bit NEON FMA); LPDDR4 "
                    "58.3 GB/s and $399 module price (NVIDIA Jetson TX2 datasheet / launch)"),
    Platform("ns-mobile-gpu", "Jetson TX2 Pascal GPU", 256 * 2 * 1.3 * _G, 58.3 * _G, GPU_EFF, MEM_EFF, 15.0,
             399.0, near=True, driver_s=50e-6,
             source="Table 2: 256 CUDA cores at 1.3 GHz, 15 W; LPDDR4 58.3 GB/s, $399 (NVIDIA Jetson TX2)"),
    Platform("ns-fpga", "Samsung SmartSSD (KU15P)", 256 * 2 * 0.25 * _G, 19.2 * _G, FPGA_EFF, MEM_EFF, 18.0,
             1600.0, near=True, driver_s=2e-3, bytes_per_param=1.0,
             source="Table 2: 256 PEs at 250 MHz, 18 W, 4 GB DDR4 (2400 MT/s x 8 B = 19.2 GB/s); int8; $1,600 "
                    "over a plain SSD and 2 ms XRT driver overhead (assumptions)"),
)}

#: DSCS-Drive: what the platform model needs beside the provider's compute. 4.2 W (Table 2) for the
#: P2P and driver phases; $100 over a plain SSD (our assumption in place of the ASIC-Clouds cost model
#: the paper cites: a 14 nm die of this size plus its DRAM); OpenCL driver overhead as NS-FPGA's.
DSCS_POWER_W = 4.2
DSCS_PRICE_USD = 100.0
DSCS_DRIVER_S = 2e-3
PLATFORM_ORDER = ("cpu", "gpu", "fpga", "ns-arm", "ns-mobile-gpu", "ns-fpga", "dscs")


# ---- storage paths -----------------------------------------------------------------------------------


def lognormal_quantile(median: float, sigma: float, q: float) -> float:
    """The ``q`` quantile of a lognormal with that median and log-standard-deviation."""
    if not 0 < q < 1:
        raise ConfigError(f"quantile {q!r} must be in (0, 1), e.g. 0.95")
    if not (median > 0 and sigma >= 0):
        raise ConfigError(f"lognormal median {median!r} must be > 0 and sigma {sigma!r} >= 0")
    return median * math.exp(sigma * NormalDist().inv_cdf(q))


_Z90 = NormalDist().inv_cdf(0.90)
_Z99 = NormalDist().inv_cdf(0.99)
#: Seed 004 Fig. 3: the 99th percentile of S3 reads is 110% above the median, so p99 = 2.1 x p50.
S3_SIGMA = math.log(2.1) / _Z99
#: dvassallo/s3-benchmark (README, c5.4xlarge, the paper's baseline instance): S3's p90 time to first
#: byte "typically around 20 ms regardless of the object size", downloads at ~93 MB/s per thread.
S3_P90_S = 20e-3
S3_MEDIAN_S = S3_P90_S / math.exp(S3_SIGMA * _Z90)
S3_BW = 93e6


@dataclass(frozen=True)
class StoragePaths:
    """Latency of each data path: ``median`` and lognormal ``sigma`` of its fixed part, plus bytes / bw.

    * remote object store (S3 GET/PUT; PUT assumed like GET): see :data:`S3_MEDIAN_S`, :data:`S3_SIGMA`;
    * ``pcie``: host<->device copy set-up (10 us median, our assumption; bandwidth per platform);
    * ``p2p``: flash -> accelerator inside the drive: NVMe read latency ~90 us median (assumption, the
      order of datacenter TLC SSDs) at PCIe 3.0 x4 (SmartSSD's internal switch, Table 2);
    * ``stack_s``: the serverless system stack per function (gateway, Kubernetes, container hand-off).
      Seed 004 Fig. 4 puts data movement at ~75% of Credit Risk's runtime, whose compute is ~0; with
      six remote accesses per chain, 3 x stack = 6 x access / 3, so stack = 2/3 x one access at p95.
    * ``quantile``: where every path is read (0.95: seed 004 reports p95 latencies).
    """

    remote_median_s: float = S3_MEDIAN_S
    remote_sigma: float = S3_SIGMA
    remote_bw: float = S3_BW
    pcie_median_s: float = 10e-6
    pcie_sigma: float = S3_SIGMA
    p2p_median_s: float = 90e-6
    p2p_sigma: float = S3_SIGMA
    p2p_bw: float = PCIE3_X4
    stack_s: float = field(default=-1.0)
    quantile: float = 0.95

    def __post_init__(self) -> None:
        for k in ("remote_median_s", "remote_bw", "pcie_median_s", "p2p_median_s", "p2p_bw"):
            v = getattr(self, k)
            if not (math.isfinite(v) and v > 0):
                raise ConfigError(f"storage path {k}={v!r} must be a finite number > 0")
        if self.stack_s < 0:  # derived default (see the class docstring), at the p95 of the default S3 fit
            object.__setattr__(self, "stack_s", 2.0 / 3.0 * lognormal_quantile(S3_MEDIAN_S, S3_SIGMA, 0.95))
        lognormal_quantile(1.0, 0.0, self.quantile)  # validates the quantile

    def remote(self, nbytes: float) -> float:
        return lognormal_quantile(self.remote_median_s, self.remote_sigma, self.quantile) + nbytes / self.remote_bw

    def pcie(self, nbytes: float, bw: float) -> float:
        return lognormal_quantile(self.pcie_median_s, self.pcie_sigma, self.quantile) + nbytes / bw

    def p2p(self, nbytes: float) -> float:
        return lognormal_quantile(self.p2p_median_s, self.p2p_sigma, self.quantile) + nbytes / self.p2p_bw


# ---- one application on one platform -------------------------------------------------------------------

#: Host server power while it waits on network I/O: half its peak (Barroso & Hoelzle, "The case for
#: energy-proportional computing", IEEE Computer 2007: servers idle at about 50% of peak power).
HOST_IDLE_FRACTION = 0.5


@dataclass(frozen=True)
class Phase:
    """One step of the chain: ``func`` (f1, f2, f2b.., f3), ``kind`` (stack, remote-read, pcie, p2p-read,
    driver, compute, ...), seconds, and the watts drawn meanwhile."""

    func: str
    kind: str
    seconds: float
    watts: float


@dataclass(frozen=True)
class Breakdown:
    phases: tuple[Phase, ...]
    extra_joules: float = 0.0  # energy given directly (the DSCS provider's compute joules)

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.phases)

    @property
    def joules(self) -> float:
        return sum(p.seconds * p.watts for p in self.phases) + self.extra_joules

    def by_kind(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for p in self.phases:
            out[p.kind] = out.get(p.kind, 0.0) + p.seconds
        return out


def _check_batch(batch: int) -> int:
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ConfigError(f"batch={batch!r}: give a whole number >= 1")
    return batch


def phases(app: App, platform: str, paths: StoragePaths, *, batch: int = 1, extra_f2: int = 0,
           provider: DscsProvider | None = None, cold_s: float = 0.0, cold_platform_s: float = 0.0) -> Breakdown:
    """The chain f1 -> f2 (x ``1 + extra_f2``) -> f3 of ``app`` on ``platform`` (a name of
    :data:`PLATFORM_ORDER`), warm unless ``cold_s`` (container pull, on every platform) and
    ``cold_platform_s`` (loading the weights into the platform's memory) are given."""
    _check_batch(batch)
    if extra_f2 < 0:
        raise ConfigError(f"extra_f2={extra_f2}: the number of duplicated model functions must be >= 0")
    cpu = PLATFORMS["cpu"]
    host_idle = cpu.power_w * HOST_IDLE_FRACTION
    raw, tensor, out = app.objects(batch)
    work = app.work(batch)
    ph: list[Phase] = []
    extra_j = 0.0
    dscs = platform == "dscs"
    if dscs:
        if provider is None:
            raise ConfigError("platform 'dscs' needs a DSCS provider (model, batch) -> (seconds, joules): wire "
                              "gfaas.sim.experiments.dscs.dscs_provider to the accelerator's timing/energy model")
        dev_power, near, driver = DSCS_POWER_W, True, DSCS_DRIVER_S
        p = None
    else:
        if platform not in PLATFORMS:
            raise ConfigError(f"unknown platform {platform!r}; known: {', '.join(PLATFORM_ORDER)}")
        p = PLATFORMS[platform]
        dev_power, near, driver = p.power_w, p.near, p.driver_s
    if cold_s or cold_platform_s:
        ph.append(Phase("f2", "cold-start", cold_s + cold_platform_s, host_idle))

    def pre_seconds(nbytes: float, plat: Platform | None) -> float:
        if plat is None:
            return dscs_vector_seconds(nbytes)
        return roofline_seconds(PRE_FLOP_PER_BYTE * nbytes, nbytes, plat)

    def model_compute() -> tuple[float, float]:
        if dscs:
            assert provider is not None
            s, j = provider(app.model, batch)
            if not (math.isfinite(s) and s >= 0 and math.isfinite(j) and j >= 0):
                raise ConfigError(f"DSCS provider returned ({s!r} s, {j!r} J) for {app.model} batch {batch}; "
                                  "both must be finite and >= 0")
            return s, j
        assert p is not None
        traffic = work.weight_bytes(p.bytes_per_param) + work.in_bytes + work.out_bytes
        return roofline_seconds(work.flops, traffic, p), 0.0

    # f1 and f2 (and its duplicates) on the platform
    funcs = [("f1", raw, tensor, True)] + [("f2" + ("" if i == 0 else chr(ord("a") + i)), tensor, out, False)
                                           for i in range(1 + extra_f2)]
    for name, src, dst, pre in funcs:
        ph.append(Phase(name, "stack", paths.stack_s, cpu.power_w))
        if near:
            ph.append(Phase(name, "p2p-read", paths.p2p(src), dev_power))
        else:
            ph.append(Phase(name, "remote-read", paths.remote(src), host_idle))
            if p is not None and p.pcie_bw:
                ph.append(Phase(name, "pcie", paths.pcie(src, p.pcie_bw), host_idle))
        if driver:
            ph.append(Phase(name, "driver", driver, dev_power))
        if pre:
            ph.append(Phase(name, "compute", pre_seconds(src + dst, p), dev_power))
        else:
            s, j = model_compute()
            ph.append(Phase(name, "compute", s, 0.0 if dscs else dev_power))
            extra_j += j
        if near:
            ph.append(Phase(name, "p2p-write", paths.p2p(dst), dev_power))
        else:
            if p is not None and p.pcie_bw:
                ph.append(Phase(name, "pcie", paths.pcie(dst, p.pcie_bw), host_idle))
            ph.append(Phase(name, "remote-write", paths.remote(dst), host_idle))
    # f3 on a CPU compute node: reads f2's output from storage, formats, writes the notification
    ph.append(Phase("f3", "stack", paths.stack_s, cpu.power_w))
    ph.append(Phase("f3", "remote-read", paths.remote(out), host_idle))
    ph.append(Phase("f3", "compute", roofline_seconds(PRE_FLOP_PER_BYTE * out, out, cpu), cpu.power_w))
    ph.append(Phase("f3", "remote-write", paths.remote(256 * batch), host_idle))  # a small notification record
    return Breakdown(tuple(ph), extra_j)


def dscs_vector_seconds(nbytes: float) -> float:
    """f1 on the DSCS vector unit (seed 004 §4: the VPU runs pre/post-processing): a roofline of the
    shared ``dscs`` architecture preset, ``vector_lanes`` ops per cycle at ``freq_mhz`` against its
    ``dram_gbps`` at :data:`MEM_EFF`."""
    from ..accel.arch import preset

    cfg = preset("dscs")
    ops = cfg.vector_lanes * cfg.freq_mhz * 1e6
    return max(PRE_FLOP_PER_BYTE * nbytes / ops, nbytes / (cfg.dram_gbps * 1e9 * MEM_EFF))


def app_latency(app: App, platform: str, paths: StoragePaths, **kw: Any) -> float:
    return phases(app, platform, paths, **kw).seconds


def app_energy(app: App, platform: str, paths: StoragePaths, **kw: Any) -> float:
    return phases(app, platform, paths, **kw).joules


# ---- cost efficiency --------------------------------------------------------------------------------------

#: Seed 004 §6.1: three years, 30% utilisation, the 2023 US industrial electricity rate.
COST_YEARS = 3.0
COST_UTILISATION = 0.30
USD_PER_KWH = 0.0975
#: CAPEX of the host server every platform keeps (f3 and the system stack run there): our assumption for
#: a one-socket 16-core Xeon server with 32 GB (the paper uses market prices without listing them).
HOST_SERVER_USD = 6000.0


def capex(platform: str) -> float:
    """Host server plus the platform's device (incremental over a plain SSD for the drives)."""
    if platform == "dscs":
        return HOST_SERVER_USD + DSCS_PRICE_USD
    if platform not in PLATFORMS:
        raise ConfigError(f"unknown platform {platform!r}; known: {', '.join(PLATFORM_ORDER)}")
    return HOST_SERVER_USD + PLATFORMS[platform].price_usd


def cost_efficiency(latency_s: float, joules: float, capex_usd: float, *, years: float = COST_YEARS,
                    utilisation: float = COST_UTILISATION, usd_per_kwh: float = USD_PER_KWH) -> float:
    """Requests per dollar over the platform's life: ``throughput x T / (CAPEX + OPEX)``.

    Throughput is one request at a time (``1 / latency``) while busy, ``T`` the busy time (``years x
    utilisation``), OPEX the energy of those requests (``joules`` each) at ``usd_per_kwh``.
    """
    if not (latency_s > 0 and joules >= 0 and capex_usd >= 0 and years > 0 and 0 < utilisation <= 1
            and usd_per_kwh >= 0):
        raise ConfigError(f"cost efficiency of latency {latency_s!r} s, {joules!r} J, CAPEX {capex_usd!r}: latency "
                          "must be > 0, the rest >= 0 (utilisation in (0, 1])")
    busy = years * YEAR * utilisation
    requests = busy / latency_s
    opex = requests * joules / 3.6e6 * usd_per_kwh
    return requests / (capex_usd + opex)


# ---- the rack-scale run (seed 004 §6.1 and Fig. 13) ------------------------------------------------------


@dataclass
class RackResult:
    """One rack run: per-request latencies, what ran where, refusals, and sampled queue lengths."""

    arrivals: int
    completed: int
    rejected: int
    on_accel: int
    on_cpu: int
    latencies: np.ndarray
    finish_times: np.ndarray
    queue_samples: list[tuple[float, int]]
    makespan_s: float

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies, q)) if self.latencies.size else math.nan


def simulate_rack(times: Sequence[float] | np.ndarray, apps: Sequence[str], homes: Sequence[int],
                  accel_s: Mapping[str, float], cpu_s: Mapping[str, float], *, drives: int, cpus: int,
                  queue_depth: int = 10_000, healthy: Sequence[bool] | None = None,
                  sample_every_s: float = 1.0, log: EventLog | None = None,
                  sim: Simulator | None = None) -> RackResult:
    """Serve the arrivals ``times[i]`` of application ``apps[i]`` whose input lives on drive ``homes[i]``.

    ``drives`` in-storage accelerators (each runs one request at a time: the busy flag) and ``cpus``
    CPU platforms; service times per application are ``accel_s`` and ``cpu_s`` (end-to-end chain
    latency on that platform). Placement and queueing are :mod:`gfaas.policy.accel_sched`. The baseline
    system is the same run with every drive absent (``healthy`` all false): everything goes to the CPUs.
    """
    n = len(times)
    if len(apps) != n or len(homes) != n:
        raise ConfigError(f"{n} arrival times but {len(apps)} applications and {len(homes)} home drives; give one each")
    if isinstance(cpus, bool) or cpus < 0 or drives < 0 or drives + cpus == 0:
        raise ConfigError(f"drives={drives}, cpus={cpus}: need at least one platform and no negative counts")
    for a in set(apps):
        for what, table in (("accel_s", accel_s), ("cpu_s", cpu_s)):
            if a not in table or not (math.isfinite(table[a]) and table[a] > 0):
                raise ConfigError(f"{what} has no positive finite service time for application {a!r}")
    if drives == 0 and any(homes):
        raise ConfigError("no drives, so every home drive must be 0 (unused)")
    ndrv = max(drives, 1)
    health = [True] * drives + [False] * (ndrv - drives) if healthy is None else list(healthy)
    if len(health) != ndrv:
        raise ConfigError(f"healthy has {len(health)} entries for {ndrv} drives")
    sim = sim or Simulator()
    busy = [False] * ndrv
    queue = FcfsQueue(queue_depth, ndrv)
    state = {"free": cpus, "next": 0, "rejected": 0, "accel": 0, "cpu": 0}
    lat = np.full(n, np.nan)
    fin = np.full(n, np.nan)
    arrived = np.asarray(times, dtype=np.float64)
    samples: list[tuple[float, int]] = []

    def start(rid: int, where: str) -> None:
        app = apps[rid]
        if where == ACCEL:
            busy[homes[rid]] = True
            state["accel"] += 1
            if log is not None:
                log.record("start", rid, "accel", homes[rid])
            sim.schedule(accel_s[app], done, rid, ACCEL)
        else:
            state["free"] -= 1
            state["cpu"] += 1
            if log is not None:
                log.record("start", rid, "cpu")
            sim.schedule(cpu_s[app], done, rid, CPU)

    def arrive() -> None:
        rid = state["next"]
        state["next"] = rid + 1
        if log is not None:
            log.record("arrive", rid, apps[rid])
        where = place(homes[rid], busy, health, state["free"])
        if where in (ACCEL, CPU):
            start(rid, where)
            return
        try:
            queue.push(Waiting(rid, homes[rid], apps[rid]))
        except Overloaded:
            state["rejected"] += 1
            if log is not None:
                log.record("reject", rid)

    def done(rid: int, where: str) -> None:
        now = sim.now
        lat[rid] = now - arrived[rid]
        fin[rid] = now
        if log is not None:
            log.record("done", rid)
        if where == ACCEL:
            home = homes[rid]
            busy[home] = False
            w = queue.next_for_drive(home)
            if w is not None:
                start(w.rid, ACCEL)
        else:
            state["free"] += 1
            w = queue.next_any()
            if w is not None:
                start(w.rid, CPU)

    def sample() -> None:
        samples.append((sim.now, len(queue)))
        if sim.pending > 0:
            sim.schedule(sample_every_s, sample, priority=1)

    sim.at_many(arrived, arrive)
    if sample_every_s > 0 and n:
        sim.at(float(arrived.min()) if n else 0.0, sample, priority=1)
    sim.run()
    ok = ~np.isnan(lat)
    return RackResult(n, int(ok.sum()), state["rejected"], state["accel"], state["cpu"], lat[ok], fin[ok], samples,
                      float(np.nanmax(fin)) if ok.any() else 0.0)


def with_quantile(paths: StoragePaths, q: float) -> StoragePaths:
    """The same paths read at another quantile (the stack overhead kept as it was)."""
    return replace(paths, quantile=q)
