"""Workload traces shipped inside the package, so experiments and tests need no outside files.

The files under ``gfaas/sim/data/`` are byte-for-byte copies of public traces; ``SOURCES.md`` there
names each one's origin and licence (cite them when results use them). Users point the loaders in
:mod:`gfaas.sim.arrivals` at full traces of the same formats with their own paths.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from ..errors import ConfigError

__all__ = ["BUNDLED_TRACES", "trace_path"]

#: name -> file under ``gfaas/sim/data``
BUNDLED_TRACES: dict[str, str] = {
    "azure-llm-code": "AzureLLMInferenceTrace_code.csv",
    "lambdascale-burst": "lambdascale_burst_rates.txt",
    "azure-functions-example": "azure_functions_2019_format/invocations.csv",
}


def trace_path(name: str) -> Path:
    """The local path of a bundled trace (``BUNDLED_TRACES`` lists the names)."""
    try:
        rel = BUNDLED_TRACES[name]
    except KeyError:
        raise ConfigError(f"no bundled trace named {name!r}; choose one of "
                          f"{', '.join(sorted(BUNDLED_TRACES))} or pass the path of your own file") from None
    path = Path(str(resources.files("gfaas.sim").joinpath("data", rel)))
    if not path.is_file():  # an install that dropped package data
        raise ConfigError(f"bundled trace {name!r} is missing at {path}; reinstall gfaas "
                          "(pip install -e .) so its package data is present")
    return path
