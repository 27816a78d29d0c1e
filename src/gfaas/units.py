"""Byte units, parsing and formatting: the one place they are written.

Binary units (KiB, MiB, GiB) size memory; decimal ones (KB, MB, GB) are what the papers and link
rates (GB/s) use. This module imports nothing from gfaas but the errors, so every layer may use it.
"""

from __future__ import annotations

from .errors import ConfigError

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
KB = 10**3
MB = 10**6
GB = 10**9

_UNITS = {"kib": KiB, "mib": MiB, "gib": GiB, "tib": 1 << 40, "kb": KB, "mb": MB, "gb": GB, "tb": 10**12,
          "k": KiB, "m": MiB, "g": GiB, "b": 1}


def parse_size(text: str | int) -> int:
    """``"512MiB"``, ``"2 GiB"``, ``"1.5GB"``, ``"4096"`` -> bytes (``k``/``m``/``g`` alone are binary)."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    t = str(text).strip().lower().replace(" ", "")
    for unit, mult in sorted(_UNITS.items(), key=lambda kv: -len(kv[0])):
        if t.endswith(unit) and t[: -len(unit)]:
            t, scale = t[: -len(unit)], mult
            break
    else:
        scale = 1
    try:
        value = float(t)
    except ValueError:
        raise ConfigError(f"size {text!r} is not a number of bytes; write e.g. 4096, 512MiB or 2GiB") from None
    if value < 0 or value != value:
        raise ConfigError(f"size {text!r} must be >= 0 bytes")
    return int(value * scale)


def format_bytes(n: int) -> str:
    """Binary units, exact where possible: ``4 KiB``, ``256 MiB``, ``1.5 GiB``, ``100 B``."""
    for unit, mult in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= mult:
            q = n / mult
            return f"{int(q)} {unit}" if n % mult == 0 else f"{q:.1f} {unit}"
    return f"{n} B"


def format_decimal(n: int) -> str:
    """Decimal units with two decimals, as the papers quote sizes: ``6.22 MB``."""
    for unit, div in (("GB", GB), ("MB", MB), ("KB", KB)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n} B"
