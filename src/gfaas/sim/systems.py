"""Baselines and ablations as configurations of one data-plane model (not separate code paths).

Each :class:`SystemConfig` switches mechanisms of the same simulated data plane on or off:

- ``store``: where a put leaves its data. ``gpu-local`` keeps it on the producer's GPU (locality,
  GROUTER's unified framework "UF"); ``gpu-random`` stores it on a random GPU of the node
  (NVSHMEM+: a GPU store without placement knowledge); ``host`` copies it to host shared memory
  (INFless+: the host-centric design).
- ``routing``: the :class:`~gfaas.policy.RoutingOptions` given to the one :class:`~gfaas.policy.Router`
  (multi-path NVLink "TA", route GPUs and NIC harvesting "BH").
- ``slo_control``: SLO-aware rate control of host<->GPU transfers (the other half of "BH");
  without it the links are shared max-min fairly, as native PCIe sharing does.
- ``pinned``: ``ring`` (a pre-pinned circular staging buffer), ``alloc`` (pin per transfer, paying
  70 ms per 100 MB, seed 000 §3.2), ``pageable`` (no pinning: 3 GB/s per link, seed 000 Fig. 5b).
- ``elastic_pool``: "ES": GPU buffers come from a pool; without it each put pays a ``cudaMalloc``.
- ``placement``: ``mapa`` (topology-aware packing) or ``random``.
- ``storage``: the elastic-storage policy (:class:`~gfaas.policy.StorageOptions`) of the GPU stores.
  ``None`` (the default) leaves GPU memory unlimited, as every experiment before issue 6 assumes;
  with a policy each GPU store gets a capacity of ``storage_bytes``, else ``storage_fraction`` x the
  GPU's memory, else the policy's ``cap_fraction`` of it, and puts pay what its pool model says
  (``elastic_pool`` then no longer applies). See ``gfaas.sim.memory``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from ..errors import ConfigError
from ..policy import RoutingOptions, StorageOptions, storage_policy

#: Pinning cost: 70 ms per 100 MB (seed 000 §3.2).
PIN_S_PER_BYTE = 0.070 / 100e6
#: A native GPU allocation when there is no pool: "millisecond-level" (seed 001 §4.4.1); we take 1 ms.
CUDA_MALLOC_S = 1e-3
#: Taking a buffer from a warm pool (our assumption: a few microseconds of bookkeeping).
POOL_ALLOC_S = 5e-6
#: Fixed cost of starting one transfer (stream launch, IPC handle lookup; our assumption).
TRANSFER_SETUP_S = 20e-6


@dataclass(frozen=True)
class SystemConfig:
    name: str
    store: Literal["gpu-local", "gpu-random", "host"]
    routing: RoutingOptions = field(default_factory=RoutingOptions)
    slo_control: bool = True
    pinned: Literal["ring", "alloc", "pageable"] = "ring"
    elastic_pool: bool = True
    placement: Literal["mapa", "random"] = "mapa"
    storage: StorageOptions | None = None
    storage_fraction: float | None = None
    storage_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.storage_fraction is not None and not 0.0 < self.storage_fraction <= 1.0:
            raise ConfigError(f"storage_fraction={self.storage_fraction} must be in (0, 1] (0.1 = 10% of GPU memory)")
        if self.storage_bytes is not None and self.storage_bytes <= 0:
            raise ConfigError(f"storage_bytes={self.storage_bytes} must be > 0; leave it None for a fraction")

    def with_storage(self, policy: str | StorageOptions, fraction: float | None = None,
                     nbytes: int | None = None, name: str | None = None) -> SystemConfig:
        """This system with GPU stores of limited memory run by ``policy`` (a name or options)."""
        opts = storage_policy(policy) if isinstance(policy, str) else policy
        label = name or (f"{self.name}+{policy}" if isinstance(policy, str) else self.name)
        return replace(self, name=label, storage=opts, storage_fraction=fraction, storage_bytes=nbytes)

    def without(self, *switches: str) -> SystemConfig:
        """The ablation with the named switches (``UF``, ``BH``, ``TA``, ``ES``) turned off."""
        cfg = self
        for s in switches:
            if s == "ES":
                cfg = replace(cfg, elastic_pool=False)
            elif s == "TA":
                cfg = replace(cfg, routing=replace(cfg.routing, multipath=False, topology_aware=False),
                              placement="random")
            elif s == "BH":
                cfg = replace(cfg, routing=replace(cfg.routing, route_gpus=False, nic_harvest=False),
                              slo_control=False)
            elif s == "UF":
                cfg = replace(cfg, store="gpu-random")
            else:
                raise ConfigError(f"unknown ablation switch {s!r}; use UF, BH, TA or ES")
        return replace(cfg, name=f"{self.name}-{'-'.join(switches)}" if switches else self.name)


_SINGLE = RoutingOptions(multipath=False, topology_aware=False, route_gpus=False, nic_harvest=False,
                         reroute_direct=False, balance_busy=False)

SYSTEMS: dict[str, SystemConfig] = {
    "gfaas": SystemConfig("gfaas", "gpu-local"),
    "infless+": SystemConfig("infless+", "host", _SINGLE, slo_control=False, pinned="pageable",
                             elastic_pool=False, placement="random"),
    "nvshmem+": SystemConfig("nvshmem+", "gpu-random", _SINGLE, slo_control=False, pinned="ring",
                             elastic_pool=True, placement="random"),
    "deepplan+": SystemConfig("deepplan+", "gpu-random", replace(_SINGLE, route_gpus=True),
                              slo_control=False, pinned="ring", elastic_pool=True, placement="random"),
    "faastube*": SystemConfig("faastube*", "gpu-local",
                              RoutingOptions(reroute_direct=False, balance_busy=False),
                              slo_control=False, pinned="alloc", elastic_pool=False, placement="mapa"),
}


def system(name: str) -> SystemConfig:
    """A named system, or ``gfaas-ES-TA`` style ablations of gfaas."""
    base, *off = name.split("-") if name.startswith("gfaas-") else (name,)
    if base not in SYSTEMS:
        raise ConfigError(f"unknown system {name!r}; choose one of {', '.join(SYSTEMS)} or gfaas-<UF|BH|TA|ES>...")
    return SYSTEMS[base].without(*off) if off else SYSTEMS[base]
