"""Topology YAML files: exact round trips, strict validation naming file/line/item, and resolve()."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gfaas.errors import ConfigError
from gfaas.topology import PRESETS, Device, Link, Topology, preset
from gfaas.topology.io import dump_yaml, load, loads, resolve, save
from gfaas.topology.presets import GiB

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "topologies" / "dgx-v100.yaml"

GOOD = textwrap.dedent("""\
    name: my-box
    description: two V100s on one switch
    pcie_p2p_gbps: 7.9
    devices:
      - {name: host, kind: host}
      - {name: pcie0, kind: pcie}
      - {name: gpu0, kind: gpu, model: V100-16GB, memory_gib: 16}
      - {name: gpu1, kind: gpu, model: V100-16GB, memory_gib: 16}
      - {name: nic0, kind: nic}
    links:
      - {a: host, b: pcie0, kind: pcie, gbps: 12, gbps_back: 11}
      - {a: pcie0, b: gpu0, kind: pcie, gbps: 12}
      - {a: pcie0, b: gpu1, kind: pcie, gbps: 12}
      - {a: pcie0, b: nic0, kind: nic, gbps: 12.5}
      - {a: gpu0, b: gpu1, kind: nvlink, gbps: 48, bricks: 2}
    """)


def rate(t: Topology, src: str, dst: str) -> float:
    """The directed edge's GB/s; fails the test if the two are not linked."""
    e = t.edge(src, dst)
    assert e is not None, f"{src} -> {dst} not linked"
    return e.gbps


def err(text: str, source: str = "box.yaml") -> str:
    with pytest.raises(ConfigError) as info:
        loads(text, source)
    return str(info.value)


# ---- round trips -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [*PRESETS, "dgx-v100*3", "dgx-a100*2", "4xa10*2"])
def test_dump_then_load_gives_an_equal_topology(name: str) -> None:
    """loads(dump_yaml(t)) == t for every preset and replicated cluster (clusters dumped explicitly)."""
    t = preset(name)
    text = dump_yaml(t)
    assert loads(text) == t
    assert "nodes:" not in text  # a cluster is written device by device, with node ids
    assert dump_yaml(loads(text)) == text


def test_save_and_load_a_file(tmp_path: Path) -> None:
    """save() then load() of h100-x1 keeps its 80e9-byte GPU exact (written as memory_bytes)."""
    path = tmp_path / "h100.yaml"
    save(preset("h100-x1"), path)
    assert "memory_bytes: 80000000000" in path.read_text()
    assert load(path) == preset("h100-x1") == load(str(path))


def test_loads_reads_the_schema() -> None:
    """The documented example: GiB sizes, asymmetric rate, bricks, defaults for omitted fields."""
    t = loads(GOOD)
    assert (t.name, t.description, t.pcie_p2p_gbps, t.pageable_gbps) == ("my-box", "two V100s on one switch", 7.9, 3.0)
    assert t.device("gpu0") == Device("gpu0", "gpu", 0, "V100-16GB", 16 * GiB)
    assert t.links[0] == Link("host", "pcie0", "pcie", 12.0, 11.0)
    assert rate(t, "pcie0", "host") == 11.0
    assert t.nvlink_gbps("gpu1", "gpu0") == 48.0 and t.links[4].bricks == 2
    assert isinstance(t.links[1].gbps, float)


def test_nodes_replicates_the_file() -> None:
    """nodes: 3 returns replicate(3); fabric_gbps sets every NIC-fabric link."""
    t = loads(GOOD + "nodes: 3\nfabric_gbps: 25\n")
    assert t == loads(GOOD).replicate(3, 25.0)
    assert t.nodes == [0, 1, 2] and {e.gbps for e in t.out_edges("fabric")} == {25.0}
    assert loads(GOOD + "nodes: 1\n") == loads(GOOD)


def test_fractional_gib_and_explicit_node() -> None:
    """memory_gib: 0.5 is 512 MiB; node: 2 is kept."""
    t = loads("name: x\ndevices:\n  - {name: host, kind: host, node: 2}\n"
              "  - {name: g, kind: gpu, memory_gib: 0.5, node: 2}\n")
    assert t.device("g").memory_bytes == GiB // 2 and t.nodes == [2]


@given(st.lists(st.floats(min_value=1e-3, max_value=1e4, allow_nan=False), min_size=1, max_size=6),
       st.floats(min_value=1e-3, max_value=1e3))
def test_any_rates_round_trip_exactly(rates: list[float], p2p: float) -> None:
    """Arbitrary float rates survive dump/load bit for bit (PyYAML writes repr precision)."""
    devices = [Device("host", "host")] + [Device(f"g{i}", "gpu") for i in range(len(rates))]
    links = [Link("host", f"g{i}", "pcie", r, r / 3) for i, r in enumerate(rates)]
    t = Topology("r", tuple(devices), tuple(links), pcie_p2p_gbps=p2p)
    assert loads(dump_yaml(t)) == t


def test_example_file_is_the_dgx_v100_preset() -> None:
    """examples/topologies/dgx-v100.yaml loads to preset('dgx-v100') and is what dump_yaml writes."""
    assert load(EXAMPLE) == preset("dgx-v100")
    body = "".join(ln for ln in EXAMPLE.read_text().splitlines(keepends=True) if not ln.startswith("#"))
    assert body == dump_yaml(preset("dgx-v100"))  # comments aside, the file is exactly what dump_yaml writes


def test_documented_examples_load() -> None:
    """The schema examples in docs/topology.md and the io module docstring are valid files."""
    import gfaas.topology.io as io_mod

    doc = (REPO / "docs" / "topology.md").read_text()
    block = doc.split("```yaml\n", 1)[1].split("```", 1)[0]
    t = loads(block, "docs/topology.md")
    assert t.nvlink_gbps("gpu0", "gpu3") == 48.0 and rate(t, "pcie0", "host") == 11.0
    assert io_mod.__doc__ is not None
    example = io_mod.__doc__.split("Schema (every rate", 1)[1].split("::\n", 1)[1].split("\n\n", 1)[0]
    assert loads(textwrap.dedent(example)) == t


# ---- strict validation: one test per error class ---------------------------------------------------
def test_unknown_keys_are_named_with_the_allowed_ones() -> None:
    """Unknown keys at top level, in a device and in a link: key, line, item and allowed keys."""
    m = err(GOOD + "gpus: 2\n")
    assert m.startswith("box.yaml:16: gpus: unknown key 'gpus'; allowed keys are name, description,")
    m = err(GOOD.replace("memory_gib: 16}", "memory_gib: 16, mem: 1}", 1))
    assert m.startswith("box.yaml:7: devices[2].mem: unknown key 'mem'; allowed keys are name, kind, model,")
    m = err(GOOD.replace("bricks: 2", "links: 2"))
    assert m == ("box.yaml:15: links[4].links: unknown key 'links'; allowed keys are a, b, kind, gbps,"
                 " gbps_back, bricks")


def test_missing_fields_are_named() -> None:
    """A device without kind, a link without gbps, a file without name: each named with its item."""
    assert err(GOOD.replace("{name: pcie0, kind: pcie}", "{name: pcie0}")) == (
        "box.yaml:6: devices[1]: missing required field 'kind'; add kind: ...")
    assert err(GOOD.replace(", gbps: 12.5", "")) == (
        "box.yaml:14: links[3]: missing required field 'gbps'; add gbps: ...")
    assert err(GOOD.replace("name: my-box\n", "")).startswith("box.yaml:1: missing required field 'name'")


def test_wrong_types_are_named() -> None:
    """A quoted rate, a size with units, a numeric name, a boolean rate, devices as a mapping."""
    m = err(GOOD.replace("gbps: 48", 'gbps: "48"'))
    assert m.startswith("box.yaml:15: links[4].gbps: gbps must be a number, got '48' (str); write a plain number")
    m = err(GOOD.replace("memory_gib: 16}", "memory_gib: 16GB}", 1))
    assert m.startswith("box.yaml:7: devices[2].memory_gib: memory_gib must be a number, got '16GB' (str)")
    m = err(GOOD.replace("{name: nic0,", "{name: 0,"))
    assert m.startswith("box.yaml:9: devices[4].name: name must be text, got 0 (int); quote it")
    assert "links[0].gbps: gbps must be a number, got True (bool)" in err(GOOD.replace("gbps: 12,", "gbps: yes,", 1))
    assert "bricks must be a whole number, got 2.5 (float)" in err(GOOD.replace("bricks: 2", "bricks: 2.5"))
    assert err("name: x\ndevices: {host: host}\n").startswith("box.yaml:2: devices: devices must be a list")
    assert "each entry must be a mapping" in err("name: x\ndevices: [host]\n")
    assert err("- a\n- b\n") .startswith("box.yaml: a topology file must be a mapping")
    assert err("").startswith("box.yaml: a topology file must be a mapping with at least name: and devices:, got NoneType")


def test_negative_and_zero_rates_are_named() -> None:
    """gbps -12, gbps_back 0, bricks -1, nodes 0, memory_gib -1, inf: value and bound named."""
    assert err(GOOD.replace("gbps: 12.5", "gbps: -12.5")) == (
        "box.yaml:14: links[3].gbps: gbps is -12.5; it must be a finite number > 0")
    assert "links[0].gbps_back: gbps_back is 0; it must be a finite number > 0" in err(
        GOOD.replace("gbps_back: 11", "gbps_back: 0"))
    assert "links[4].bricks: bricks is -1; it must be >= 0" in err(GOOD.replace("bricks: 2", "bricks: -1"))
    assert "nodes: nodes is 0; it must be >= 1" in err(GOOD + "nodes: 0\n")
    assert "memory_gib is -1; it must be a finite number >= 0" in err(
        GOOD.replace("memory_gib: 16}", "memory_gib: -1}", 1))
    assert "pcie_p2p_gbps is inf" in err(GOOD.replace("7.9", ".inf"))


def test_bad_yaml_syntax_names_the_file_and_line(tmp_path: Path) -> None:
    """A YAMLError from the parser becomes a ConfigError with the file name and line."""
    path = tmp_path / "broken.yaml"
    path.write_text(GOOD.replace("{name: gpu1, kind: gpu", "{name: gpu1 kind: [gpu"))
    with pytest.raises(ConfigError) as info:
        load(path)
    assert str(info.value).startswith(f"{path}:8: not valid YAML (")
    assert "check indentation, colons and brackets" in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_duplicate_yaml_keys_are_rejected() -> None:
    """gbps written twice in one link (PyYAML would keep the last silently) is an error."""
    assert err(GOOD.replace("gbps: 48", "gbps: 48, gbps: 24")) == (
        "box.yaml:15: key 'gbps' appears twice in links.4 (first on line 15); keep one")


def test_model_errors_pass_through_with_the_file_name() -> None:
    """Duplicate device, duplicate link, link to an unknown device, bad kinds: model message + file."""
    m = err(GOOD.replace("{name: nic0, kind: nic}", "{name: gpu0, kind: nic}"))
    assert m == "box.yaml: topology 'my-box' names device 'gpu0' twice; names must be unique"
    m = err(GOOD + "  - {a: gpu1, b: gpu0, kind: nvlink, gbps: 24}\n")
    assert m == "box.yaml: topology 'my-box' has two links between gpu1 and gpu0; merge them"
    m = err(GOOD.replace("b: nic0", "b: nic9"))
    assert m.startswith("box.yaml: topology 'my-box': link pcie0-nic9 names unknown device 'nic9'")
    m = err(GOOD.replace("kind: nvlink", "kind: nvlnk"))
    assert m.startswith("box.yaml:15: links[4]: link gpu0-gpu1 has kind 'nvlnk'; use one of pcie, nvlink")
    assert "devices[1]: device 'pcie0' has kind 'switch'" in err(GOOD.replace("kind: pcie}", "kind: switch}", 1))
    assert "links[1]: link pcie0-pcie0 joins a device to itself" in err(GOOD.replace("b: gpu0", "b: pcie0", 1))


def test_other_consistency_errors() -> None:
    """memory_gib with memory_bytes, fabric_gbps without nodes, empty devices, clusters * nodes."""
    assert "give memory_gib or memory_bytes, not both" in err(
        GOOD.replace("memory_gib: 16}", "memory_gib: 16, memory_bytes: 1}", 1))
    assert "fabric_gbps only applies to a cluster; add nodes: N" in err(GOOD + "fabric_gbps: 25\n")
    assert "devices is empty" in err("name: x\ndevices: []\n")
    assert "devices is empty" in err("name: x\ndevices:\n")
    assert loads("name: x\ndevices:\n  - name: host\n    kind: host\nlinks:\n").links == ()
    assert "already spans 2 nodes" in err(dump_yaml(preset("4xa10*2")) + "nodes: 2\n")


def test_load_missing_and_unreadable_files(tmp_path: Path) -> None:
    """A missing file is named and the presets listed; a directory or non-UTF-8 file is named."""
    with pytest.raises(ConfigError, match=r"topology file '.*nope\.yaml' not found; .* dgx-v100, dgx-a100"):
        load(tmp_path / "nope.yaml")
    (tmp_path / "latin1.yaml").write_bytes(b"name: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"cannot read topology file '.*latin1\.yaml'.*UTF-8"):
        load(tmp_path / "latin1.yaml")


# ---- resolve -------------------------------------------------------------------------------------
def test_resolve_presets_and_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Preset names (with *N) and YAML paths (with *N) both resolve; presets win over a same-named file."""
    assert resolve("dgx-v100") == preset("dgx-v100")
    assert resolve("dgx-v100*4") == preset("dgx-v100*4")
    path = tmp_path / "box.yml"
    path.write_text(GOOD)
    assert resolve(str(path)) == loads(GOOD)
    assert resolve(f"{path}*2") == loads(GOOD).replicate(2)
    monkeypatch.chdir(tmp_path)
    Path("4xa10").write_text(GOOD)
    assert resolve("4xa10") == preset("4xa10")
    assert resolve(f".{os.sep}4xa10") == loads(GOOD, "./4xa10")
    assert resolve(str(EXAMPLE)) == preset("dgx-v100")


def test_resolve_rejects_what_is_neither() -> None:
    """An unknown name lists the presets and says no file was found; a bad '*N' is named."""
    with pytest.raises(ConfigError) as info:
        resolve("dgx-v200")
    assert str(info.value).startswith("'dgx-v200' is neither a topology preset nor an existing file; no file"
                                      " 'dgx-v200' was found. Presets: dgx-v100, dgx-a100, 4xa10, h100-x1, cpu-only")
    with pytest.raises(ConfigError, match=r"'missing\.yaml' is neither .* \(a \.yaml/\.yml path\)"):
        resolve("missing.yaml")
    with pytest.raises(ConfigError, match=r"the node count after '\*' must be an integer, e\.g\. .*dgx-v100\.yaml\*4"):
        resolve(f"{EXAMPLE}*two")
