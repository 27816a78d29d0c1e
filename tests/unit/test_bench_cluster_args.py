"""gfaas bench cluster's checks before it builds anything (the real run needs root: the integration
test and `make cluster-results`)."""

from __future__ import annotations

import pytest

import gfaas.bench.cluster as bc
from gfaas.errors import ConfigError
from gfaas.units import MiB


def test_sizes_parse_and_bad_ones_name_the_fix() -> None:
    assert bc.parse_sizes("1MiB, 64MiB") == [MiB, 64 * MiB]
    for bad in ("", "64KiB", "lots"):
        with pytest.raises(ConfigError, match="1MiB,16MiB,64MiB"):
            bc.parse_sizes(bad)


def test_without_root_the_error_names_sudo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bc.os, "geteuid", lambda: 1000)
    with pytest.raises(ConfigError, match="needs root.*sudo"):
        bc.check_capable()


@pytest.mark.parametrize("kw, match", [({"machines": 2}, "give 3"), ({"repeats": 0}, "at least 1"),
                                       ({"workflows": ["nope"]}, "unknown")])
def test_bad_configurations_are_refused_before_the_lab(kw: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        bc.run(**kw)
