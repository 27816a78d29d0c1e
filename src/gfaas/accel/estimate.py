"""One inference of a zoo model on an accelerator config: compile (shapes only matter), then the
timing and energy models. This is what the DSCS serverless experiments and the runtime's modelled
latency use; ``gfaas accel run`` adds the functional emulation on top."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import onnx

from .arch import AccelConfig, preset
from .compiler import compile_model
from .power import EnergyReport, energy
from .timing import ModelTiming, time_model

log = logging.getLogger("gfaas.accel")


@dataclass(frozen=True)
class Estimate:
    model: str
    batch: int
    seconds: float
    joules: float
    timing: ModelTiming
    energy: EnergyReport


@functools.lru_cache(maxsize=16)
def _proto(model: str, scale: str) -> onnx.ModelProto:
    from ..models import cache

    # The on-disk model cache: the full zoo models take seconds to build, the DSCS sweeps ask again.
    return onnx.load(str(cache.path(model, scale)))


@functools.lru_cache(maxsize=256)
def estimate(model: str, cfg: AccelConfig | None = None, batch: int = 1, scale: str = "full") -> Estimate:
    """Modelled seconds and joules of one batch of ``model`` (a zoo name) on ``cfg`` (default: the
    ``dscs`` preset)."""
    cfg = cfg or preset("dscs")
    log.info("compiling %s (%s, batch %d) for %s", model, scale, batch, cfg.name)
    prog = compile_model(_proto(model, scale), cfg, batch)
    t = time_model(cfg, prog.layers)
    e = energy(cfg, t)
    return Estimate(model, batch, t.seconds(cfg), e.total_j, t, e)


def dscs_seconds_joules(model: str, batch: int) -> tuple[float, float]:
    """The provider the DSCS serverless experiments call: the ``dscs`` preset at full scale."""
    est = estimate(model, preset("dscs"), batch)
    return est.seconds, est.joules
