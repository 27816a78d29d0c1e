"""Functions marked ``accelerator: dscs``: the in-storage accelerator in the local runtime.

What is real and what is modelled. This machine has no computational storage, so the runtime models
its storage nodes explicitly: :class:`DscsDrive` is one simulated storage node's drive (its
accelerator config, a busy flag, a healthy flag). The *outputs* are real: the function's zoo model is
compiled for the drive's config and run by the functional emulator (:func:`gfaas.accel.emulate`, fp32),
so the handler sees the tensors the accelerator would compute. The *latency* is modelled: the timing
model's seconds for each call (the same number :func:`gfaas.accel.estimate` gives) are reported as the
function's ``accel_s``; the emulator's own wall time on this host is what ``compute_s`` measures.

Where objects live (the stated rule, since no real object store spreads them over drives here):
invocation number ``k`` of the runtime stores its request inputs on drive ``k mod D``; a function's
outputs live on the drive it ran on, or, when it ran on a CPU, on the drive of its first input (the
CPU writes them back to the storage node it read from). A marked function's *home* is the drive of its
first input, so chained marked functions stay on one drive.

Where it runs is the policy's decision, :func:`gfaas.policy.accel_sched.place`, the one the rack
simulator applies (one policy, two executors). The runtime asks it with ``cpus_free=1``: the function's
own dispatch slot is a free CPU worker at that moment, so a busy or unhealthy drive fails over to the
CPU and the policy's ``"queue"`` answer cannot arise here.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..accel.arch import AccelConfig, preset
from ..errors import ConfigError
from ..policy import accel_sched

log = logging.getLogger("gfaas.runtime")

DSCS = "dscs"  # a marked function ran on its drive's accelerator
CPU = "cpu"  # it failed over to a CPU worker


@dataclass
class DscsDrive:
    """One simulated storage node's drive with its accelerator (``preset``: an accelerator preset name)."""

    name: str
    preset: str = "dscs"
    busy: bool = False
    healthy: bool = True


@dataclass(frozen=True)
class Decision:
    placement: str  # DSCS or CPU
    drive: int  # the drive it runs on (DSCS) or its home drive (CPU); -1: there are no drives
    preset: str = ""  # the drive's accelerator preset (DSCS only)


class DscsDrives:
    """The runtime's drives and the claim/release of their busy flags (thread-safe)."""

    def __init__(self, drives: list[DscsDrive]) -> None:
        for d in drives:
            preset(d.preset)  # an unknown preset fails here, at start, not on the first request
        self.drives = drives
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.drives)

    def input_drive(self, seq: int) -> int:
        """The drive that stores the request inputs of the runtime's invocation number ``seq``."""
        return seq % len(self.drives) if self.drives else -1

    def claim(self, home: int) -> Decision:
        """Decide where a marked function whose inputs live on ``home`` runs, and mark the drive busy
        when it gets the function (release it with :meth:`release`)."""
        if home < 0 or not self.drives:  # no drive holds the data: conventional execution
            return Decision(CPU, -1)
        with self._lock:
            where = accel_sched.place(home, [d.busy for d in self.drives], [d.healthy for d in self.drives], 1)
            if where == accel_sched.ACCEL:
                self.drives[home].busy = True
                return Decision(DSCS, home, self.drives[home].preset)
        return Decision(CPU, home)

    def release(self, d: Decision) -> None:
        if d.placement == DSCS:
            with self._lock:
                self.drives[d.drive].busy = False


class EmulatedModel:
    """A zoo :class:`~gfaas.models.Model` whose calls run on the emulated accelerator.

    Same interface as the model (``info``, ``output_names``, ``model(**feeds)``), so handlers need no
    change. Each call compiles the model for the drive's config at the feeds' batch size (cached per
    batch), emulates it in fp32 and adds the timing model's seconds to :attr:`seconds`.
    """

    def __init__(self, model: Any, cfg: AccelConfig) -> None:
        self.base = model
        self.cfg = cfg
        self.name = model.name
        self.scale = model.scale
        self.info = model.info
        self.output_names = model.output_names
        self.device = f"accel:{cfg.name}"
        self.seconds = 0.0
        self._programs: dict[int, tuple[Any, float]] = {}

    def __repr__(self) -> str:
        return f"EmulatedModel({self.name!r}, scale={self.scale!r}, config={self.cfg.name!r})"

    def program(self, batch: int) -> tuple[Any, float]:
        """(compiled program, modelled seconds per call) for ``batch``, compiled once."""
        if batch not in self._programs:
            import onnx

            from ..accel.compiler import compile_model
            from ..accel.timing import time_model

            prog = compile_model(onnx.load(str(self.base.path)), self.cfg, batch)
            self._programs[batch] = (prog, time_model(self.cfg, prog.layers).seconds(self.cfg))
        return self._programs[batch]

    def __call__(self, **feeds: np.ndarray) -> dict[str, np.ndarray]:
        from ..accel.emulate import emulate

        checked = self.base._check(dict(feeds))
        batch = int(next(iter(checked.values())).shape[0])
        prog, secs = self.program(batch)
        try:
            outs = emulate(prog, checked, "fp32")
        except ConfigError as exc:
            raise ConfigError(f"model {self.name!r} on the {self.cfg.name} accelerator: {exc} (the program is "
                              "compiled for the zoo's default dimensions; feed those, or drop `accelerator`)") from None
        self.seconds += secs
        return {k: np.asarray(outs[k]) for k in self.output_names}
