"""The accelerator's configuration: presets, YAML files, validation with named values."""

from __future__ import annotations

import pytest

from gfaas.accel import AccelConfig, load_config, preset
from gfaas.accel.arch import MiB, parse_array, parse_bytes
from gfaas.accel.layers import MatLayer
from gfaas.errors import ConfigError


def test_dscs_preset_is_the_papers_chosen_point() -> None:
    c = preset("dscs")
    assert (c.rows, c.cols, c.sram_bytes, c.dram_gbps, c.freq_mhz, c.tech_nm) == (128, 128, 4 * MiB, 38.0, 1000.0, 14)
    assert c.bytes_per_cycle == pytest.approx(38.0)


def test_yaml_file_overrides_a_base_preset(tmp_path) -> None:  # type: ignore[no-untyped-def]
    f = tmp_path / "a.yaml"
    f.write_text("base: dscs\nrows: 32\ncols: 64\ndataflow: ws\nifmap_sram: 512KiB\n")
    c = load_config(str(f))
    assert (c.rows, c.cols, c.dataflow, c.ifmap_sram, c.filter_sram) == (32, 64, "ws", 512 * 1024, 2 * MiB)
    f.write_text("base: dscs\nrowz: 3\n")
    with pytest.raises(ConfigError, match="unknown accelerator field.*rowz"):
        load_config(str(f))
    with pytest.raises(ConfigError, match="neither a preset"):
        load_config(str(tmp_path / "missing.yaml"))


@pytest.mark.parametrize(("field", "value", "match"), [
    ("rows", 0, "rows=0"), ("dataflow", "xs", "dataflow='xs'"), ("dram_gbps", -1.0, "dram_gbps=-1.0"),
    ("cell", "sram", "cell='sram'"), ("ofmap_sram", 10, "ofmap_sram=10"), ("tech_nm", 7, "tech_nm=7"),
])
def test_bad_fields_are_named(field: str, value: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        AccelConfig().with_(**{field: value})


def test_sizes_and_arrays_parse() -> None:
    assert parse_bytes("4MiB") == 4 * MiB and parse_bytes("512 KiB") == 512 * 1024 and parse_bytes("1000") == 1000
    assert parse_array("32x16") == (32, 16)
    for bad in ("4XB", "-1MiB", "MiB"):
        with pytest.raises(ConfigError, match="is not a size"):
            parse_bytes(bad)
    with pytest.raises(ConfigError, match="ROWSxCOLS"):
        parse_array("32")
    with pytest.raises(ConfigError, match="k=0"):
        MatLayer("l", "Conv", 1, 0, 1)
    assert MatLayer("g", "Conv", 4, 9, 1, groups=8).macs == 4 * 9 * 8
