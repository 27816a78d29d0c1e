"""KSM's global settings and counters in sysfs (``/sys/kernel/mm/ksm``).

The settings are global to the machine: whoever changes them must save and restore them
(:class:`gfaas.dedup.controller.MergeController` does, also across a crash).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import ConfigError, DedupError

log = logging.getLogger("gfaas.dedup")

_NUMERIC = ("run", "pages_to_scan", "sleep_millisecs", "smart_scan")
_ADVISOR_MODES = ("none", "scan-time")


@dataclass(frozen=True)
class KsmCounters:
    """KSM's global counters (pages; 0 where this kernel lacks the file). ``pages_sharing`` is how many
    page mappings point at a shared KSM page beyond the first: the pages saved."""

    pages_shared: int
    pages_sharing: int
    pages_unshared: int
    pages_volatile: int
    pages_scanned: int
    full_scans: int
    general_profit: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def _selected(text: str) -> str:
    # Choice files print every option with the current one in brackets: "[none] scan-time".
    text = text.strip()
    if "[" in text and "]" in text:
        return text[text.index("[") + 1 : text.index("]")]
    return text


class KsmSysfs:
    """Read and write KSM's sysfs files under ``root`` (a fake directory in tests)."""

    TUNABLES = ("run", "pages_to_scan", "sleep_millisecs", "advisor_mode", "smart_scan")

    def __init__(self, root: Path = Path("/sys/kernel/mm/ksm")) -> None:
        self.root = Path(root)

    def available(self) -> bool:
        """KSM exists on this kernel."""
        return (self.root / "run").is_file()

    def writable(self) -> bool:
        """The settings can be changed by this process (root, KSM present)."""
        return self.available() and os.access(self.root / "run", os.W_OK)

    def why_not_controllable(self) -> str | None:
        """None when :meth:`writable`; else the reason and the fix."""
        if not self.available():
            return f"KSM is not available: {self.root}/run does not exist (kernel built without CONFIG_KSM)"
        if not self.writable():
            return f"KSM settings in {self.root} are not writable by uid {os.geteuid()}: run the node daemon as root"
        return None

    def _read(self, name: str) -> str:
        return (self.root / name).read_text().strip()

    def _write(self, name: str, value: str) -> None:
        try:
            (self.root / name).write_text(value)
        except OSError as exc:
            raise DedupError(f"writing {value!r} to {self.root / name} failed: {exc}") from exc

    def read_settings(self) -> dict[str, str]:
        """The :attr:`TUNABLES` present on this kernel (``advisor_mode`` as the selected mode)."""
        out = {}
        for name in self.TUNABLES:
            if (self.root / name).is_file():
                value = self._read(name)
                out[name] = _selected(value) if name == "advisor_mode" else value
        return out

    def write_settings(self, s: Mapping[str, str]) -> None:
        """Write ``s`` (a subset of :attr:`TUNABLES`) in the order the kernel needs.

        * ``run`` = 0 goes first (ksmd stops before the rate changes); any other ``run`` goes last
          (ksmd starts at the new rate).
        * ``advisor_mode`` goes before ``pages_to_scan``: switching the mode resets ``pages_to_scan``
          (to 100, or to ``advisor_min_pages_to_scan``), and while the ``scan-time`` advisor is on
          the kernel refuses ``pages_to_scan`` (EINVAL), so it is skipped then: the advisor owns it.
        """
        unknown = sorted(set(s) - set(self.TUNABLES))
        if unknown:
            raise ConfigError(f"unknown KSM settings {unknown}; known: {list(self.TUNABLES)}")
        for name, value in s.items():
            if name == "advisor_mode" and _selected(value) not in _ADVISOR_MODES:
                raise ConfigError(f"KSM advisor_mode must be one of {_ADVISOR_MODES}, got {value!r}")
            if name in _NUMERIC and not str(value).strip().isdigit():
                raise ConfigError(f"KSM {name} must be a non-negative integer, got {value!r}")
        present = {k: str(v).strip() for k, v in s.items() if (self.root / k).is_file()}
        run = present.get("run")
        if run == "0":
            self._write("run", run)
        advisor = present.get("advisor_mode")
        if advisor is not None:
            advisor = _selected(advisor)
            if _selected(self._read("advisor_mode")) != advisor:
                self._write("advisor_mode", advisor)
        else:
            advisor = _selected(self._read("advisor_mode")) if (self.root / "advisor_mode").is_file() else "none"
        if "pages_to_scan" in present and advisor == "none":
            self._write("pages_to_scan", present["pages_to_scan"])
        for name in ("sleep_millisecs", "smart_scan"):
            if name in present:
                self._write(name, present[name])
        if run is not None and run != "0":
            self._write("run", run)

    def counters(self) -> KsmCounters:
        """The global counters (0 where absent)."""
        values = {}
        for name in KsmCounters.__dataclass_fields__:
            try:
                values[name] = int(self._read(name))
            except (OSError, ValueError):
                values[name] = 0
        return KsmCounters(**values)
