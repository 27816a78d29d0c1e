"""Topology files: YAML in, YAML out, and the ``NAME|FILE`` resolution the CLI uses.

Schema (every rate in GB/s, 10^9 bytes per second, per direction)::

    name: my-box                  # required
    description: two V100s        # optional
    pcie_p2p_gbps: 7.9            # optional (model default 7.9): GPU<->GPU copies without NVLink
    pageable_gbps: 3.0            # optional (model default 3.0): host links from unpinned memory
    nodes: 1                      # optional: replicate into a cluster of this many nodes
    # fabric_gbps: 12.5          # optional, only with nodes > 1: every NIC's link to the fabric
    devices:                      # required, non-empty
      - {name: host, kind: host}
      - {name: pcie0, kind: pcie}
      - {name: gpu0, kind: gpu, model: V100-16GB, memory_gib: 16}
      - {name: gpu3, kind: gpu, model: V100-16GB, memory_gib: 16}
      - {name: nic0, kind: nic}
    links:                        # optional
      - {a: host, b: pcie0, kind: pcie, gbps: 12, gbps_back: 11}
      - {a: pcie0, b: gpu0, kind: pcie, gbps: 12}
      - {a: pcie0, b: gpu3, kind: pcie, gbps: 12}
      - {a: pcie0, b: nic0, kind: nic, gbps: 12.5}
      - {a: gpu0, b: gpu3, kind: nvlink, gbps: 48, bricks: 2}

Device keys: ``name`` and ``kind`` (host, gpu, pcie, nic, nvswitch, fabric) are required;
``model`` (text), ``memory_gib`` *or* ``memory_bytes`` (GPU memory; ``memory_bytes`` exists
because some GPUs, e.g. an 80 GB H100, are not a whole number of GiB) and ``node`` (the node
index in a cluster, default 0) are optional. Link keys: ``a``, ``b``, ``kind`` (pcie, nvlink,
nic, net) and ``gbps`` (a -> b) are required; ``gbps_back`` (b -> a, when asymmetric) and
``bricks`` (NVLink bricks) are optional.

With ``nodes: N`` the file describes one node and the loader returns
``Topology.replicate(N)``. :func:`dump_yaml` never writes ``nodes``: it writes every device of a
cluster, with its ``node``, because that is exact (a file edited after replication may no longer
be N identical copies) and round-trips to an equal :class:`Topology`.

Validation is strict because a typo in a rate silently skews every simulated result: unknown
keys, missing or mistyped fields, non-positive rates and duplicated YAML keys are all
:class:`~gfaas.errors.ConfigError` naming the file, the line and the item. Only safe YAML is
read (``yaml.safe_load``; line numbers come from ``yaml.compose`` with the same safe loader,
which builds no Python objects at all).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError
from ..units import GiB
from .model import Device, Link, Topology
from .presets import PRESETS, preset

TOP_KEYS: tuple[str, ...] = ("name", "description", "pcie_p2p_gbps", "pageable_gbps", "nodes", "fabric_gbps",
                             "devices", "links")
DEVICE_KEYS: tuple[str, ...] = ("name", "kind", "model", "memory_gib", "memory_bytes", "node")
LINK_KEYS: tuple[str, ...] = ("a", "b", "kind", "gbps", "gbps_back", "bricks")

#: A path inside the document: top-level key, then list index, then item key.
_Path = tuple[str | int, ...]


# ---- writing ----------------------------------------------------------------------------------------
def _device_doc(d: Device) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": d.name, "kind": d.kind}
    if d.model:
        doc["model"] = d.model
    if d.memory_bytes:
        # GiB reads better, but only when exact: the round trip must give the same byte count.
        if d.memory_bytes % GiB == 0:
            doc["memory_gib"] = d.memory_bytes // GiB
        else:
            doc["memory_bytes"] = d.memory_bytes
    if d.node:
        doc["node"] = d.node
    return doc


def _link_doc(ln: Link) -> dict[str, Any]:
    doc: dict[str, Any] = {"a": ln.a, "b": ln.b, "kind": ln.kind, "gbps": ln.gbps}
    # None and an explicit equal value are different Link objects; keep exactly what was there.
    if ln.gbps_back is not None:
        doc["gbps_back"] = ln.gbps_back
    if ln.bricks:
        doc["bricks"] = ln.bricks
    return doc


def dump_yaml(topo: Topology) -> str:
    """The topology as a YAML document that :func:`loads` turns back into an equal Topology.

    One device or link per line (flow style) so that files diff well; floats are written with
    ``repr`` precision by PyYAML, so rates such as 19.200000000000003 survive the round trip.
    """
    doc: dict[str, Any] = {"name": topo.name}
    if topo.description:
        doc["description"] = topo.description
    doc["pcie_p2p_gbps"] = topo.pcie_p2p_gbps
    doc["pageable_gbps"] = topo.pageable_gbps
    doc["devices"] = [_device_doc(d) for d in topo.devices]
    doc["links"] = [_link_doc(ln) for ln in topo.links]
    # default_flow_style=None puts collections of scalars (each item) on one line; a wide width
    # stops PyYAML from folding long descriptions onto several lines.
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=1 << 16, allow_unicode=True)


def save(topo: Topology, path: str | os.PathLike[str]) -> None:
    """Write :func:`dump_yaml` of ``topo`` to ``path`` (UTF-8)."""
    try:
        Path(path).write_text(dump_yaml(topo), encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write topology file {os.fspath(path)!r}: {exc}; check the directory exists"
                          " and is writable") from exc


# ---- reading ----------------------------------------------------------------------------------------
def _line_map(node: yaml.Node, path: _Path, lines: dict[_Path, int], source: str) -> None:
    """Record the 1-based line of every value by its path; reject duplicated mapping keys.

    PyYAML keeps the last of two equal keys silently, which would let ``gbps: 12`` written
    twice hide a mistake; the composed node tree still has both, so check here.
    """
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        seen: dict[object, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value
            line = key_node.start_mark.line + 1
            if key in seen:
                where = ".".join(str(p) for p in path) or "the top level"
                raise ConfigError(f"{source}:{line}: key {key!r} appears twice in {where} (first on line"
                                  f" {seen[key]}); keep one")
            seen[key] = line
            _line_map(value_node, (*path, str(key)), lines, source)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _line_map(item, (*path, i), lines, source)


class _Reader:
    """Validation helpers that know the file name and line numbers for error messages."""

    def __init__(self, source: str, lines: Mapping[_Path, int]) -> None:
        self.source = source
        self.lines = lines

    def where(self, path: _Path) -> str:
        line = self.lines.get(path)
        while line is None and path:
            path = path[:-1]
            line = self.lines.get(path)
        return f"{self.source}:{line}" if line is not None else self.source

    def fail(self, path: _Path, message: str) -> ConfigError:
        return ConfigError(f"{self.where(path)}: {_label(path)}{message}")

    def keys(self, item: Mapping[Any, Any], path: _Path, allowed: tuple[str, ...], required: tuple[str, ...]
             ) -> None:
        for k in item:
            if k not in allowed:
                raise self.fail((*path, str(k)), f"unknown key {k!r}; allowed keys are {', '.join(allowed)}")
        for k in required:
            if k not in item:
                raise self.fail(path, f"missing required field {k!r}; add {k}: ...")

    def text(self, item: Mapping[str, Any], key: str, path: _Path, default: str | None = None) -> str:
        if key not in item:
            assert default is not None, key  # required keys were checked by keys()
            return default
        v = item[key]
        if not isinstance(v, str):
            raise self.fail((*path, key), f"{key} must be text, got {v!r} ({type(v).__name__}); quote it,"
                            f' e.g. {key}: "{v}"')
        return v

    def number(self, item: Mapping[str, Any], key: str, path: _Path, *, positive: bool) -> float | None:
        """A finite float (> 0 if ``positive``, else >= 0), or None if the key is absent."""
        if key not in item:
            return None
        v = item[key]
        # bool is an int to Python, but `gbps: yes` is certainly a mistake.
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise self.fail((*path, key), f"{key} must be a number, got {v!r} ({type(v).__name__});"
                            f" write a plain number without quotes or units, e.g. {key}: 12")
        if not math.isfinite(v) or (v <= 0 if positive else v < 0):
            bound = "> 0" if positive else ">= 0"
            raise self.fail((*path, key), f"{key} is {v!r}; it must be a finite number {bound}")
        return float(v)

    def integer(self, item: Mapping[str, Any], key: str, path: _Path, *, minimum: int) -> int | None:
        if key not in item:
            return None
        v = item[key]
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.fail((*path, key), f"{key} must be a whole number, got {v!r} ({type(v).__name__})")
        if v < minimum:
            raise self.fail((*path, key), f"{key} is {v}; it must be >= {minimum}")
        return v

    def items(self, doc: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
        v = doc.get(key)
        if v is None:  # `links:` with nothing under it means no links, not a type error
            return []
        if not isinstance(v, list):
            raise self.fail((key,), f"{key} must be a list of mappings (lines starting with '- '),"
                            f" got {type(v).__name__}")
        for i, item in enumerate(v):
            if not isinstance(item, dict):
                raise self.fail((key, i), f"each entry must be a mapping like {{name: gpu0, kind: gpu}},"
                                f" got {item!r}")
        return v


def _label(path: _Path) -> str:
    """``devices[2].gbps: `` for error messages."""
    if not path:
        return ""
    out = str(path[0])
    for p in path[1:]:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out + ": "


def _device(r: _Reader, item: Mapping[str, Any], path: _Path) -> Device:
    r.keys(item, path, DEVICE_KEYS, ("name", "kind"))
    name = r.text(item, "name", path)
    kind = r.text(item, "kind", path)
    model = r.text(item, "model", path, "")
    if "memory_gib" in item and "memory_bytes" in item:
        raise r.fail(path, "give memory_gib or memory_bytes, not both")
    gib = r.number(item, "memory_gib", path, positive=False)
    mem_bytes = r.integer(item, "memory_bytes", path, minimum=0)
    memory = round(gib * GiB) if gib is not None else (mem_bytes or 0)
    node = r.integer(item, "node", path, minimum=0) or 0
    try:
        return Device(name, kind, node, model, memory)  # type: ignore[arg-type]  # kind checked by Device
    except ConfigError as exc:
        raise r.fail(path, str(exc)) from None


def _link(r: _Reader, item: Mapping[str, Any], path: _Path) -> Link:
    r.keys(item, path, LINK_KEYS, ("a", "b", "kind", "gbps"))
    a, b, kind = r.text(item, "a", path), r.text(item, "b", path), r.text(item, "kind", path)
    gbps = r.number(item, "gbps", path, positive=True)
    assert gbps is not None  # required
    back = r.number(item, "gbps_back", path, positive=True)
    bricks = r.integer(item, "bricks", path, minimum=0) or 0
    try:
        return Link(a, b, kind, gbps, back, bricks)  # type: ignore[arg-type]  # kind checked by Link
    except ConfigError as exc:
        raise r.fail(path, str(exc)) from None


def loads(text: str, source: str = "<string>") -> Topology:
    """Parse and validate a topology document; ``source`` names it in error messages."""
    try:
        data = yaml.safe_load(text)
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: not valid YAML ({problem}); check indentation, colons and brackets"
                          " near that line") from None
    lines: dict[_Path, int] = {}
    if root is not None:
        _line_map(root, (), lines, source)
    r = _Reader(source, lines)
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a topology file must be a mapping with at least name: and devices:,"
                          f" got {type(data).__name__}; see docs/topology.md for the schema")
    r.keys(data, (), TOP_KEYS, ("name", "devices"))
    name = r.text(data, "name", ())
    description = r.text(data, "description", (), "")
    p2p = r.number(data, "pcie_p2p_gbps", (), positive=True)
    pageable = r.number(data, "pageable_gbps", (), positive=True)
    nodes = r.integer(data, "nodes", (), minimum=1) or 1
    fabric = r.number(data, "fabric_gbps", (), positive=True)
    if fabric is not None and nodes == 1:
        raise r.fail(("fabric_gbps",), "fabric_gbps only applies to a cluster; add nodes: N (N > 1) or remove it")
    device_items = r.items(data, "devices")
    if not device_items:
        raise r.fail(("devices",), "devices is empty; list at least {name: host, kind: host}")
    devices = [_device(r, d, ("devices", i)) for i, d in enumerate(device_items)]
    links = [_link(r, ln, ("links", i)) for i, ln in enumerate(r.items(data, "links"))]
    kw: dict[str, float] = {}
    if p2p is not None:
        kw["pcie_p2p_gbps"] = p2p
    if pageable is not None:
        kw["pageable_gbps"] = pageable
    try:
        topo = Topology(name, tuple(devices), tuple(links), description=description, **kw)
        return topo.replicate(nodes, fabric) if nodes > 1 else topo
    except ConfigError as exc:
        # Cross-item problems (duplicate names, links to undeclared devices) have no single line.
        raise ConfigError(f"{source}: {exc}") from None


def load(path: str | os.PathLike[str]) -> Topology:
    """Read and validate a topology file (see the module docstring for the schema)."""
    p = os.fspath(path)
    try:
        text = Path(p).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"topology file {p!r} not found; check the path, or use a preset:"
                          f" {', '.join(PRESETS)}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read topology file {p!r}: {exc}; it must be a readable UTF-8 YAML file") from None
    return loads(text, source=p)


def resolve(spec: str) -> Topology:
    """A preset (``dgx-v100``, ``dgx-v100*4``) or a YAML file (``box.yaml``, ``box.yaml*4``).

    Preset names win over files of the same name; write ``./dgx-v100`` to mean the file.
    """
    base, star, _ = spec.partition("*")
    if base in PRESETS:
        return preset(spec)
    if os.path.isfile(spec):
        return load(spec)
    if star and os.path.isfile(base):
        # The same ``*N`` shorthand as presets, so a file can stand wherever a preset can.
        return _replicated(load(base), spec, base)
    hint = " (a .yaml/.yml path)" if base.endswith((".yaml", ".yml")) else ""
    raise ConfigError(f"{spec!r} is neither a topology preset nor an existing file{hint}; no file {base!r} was"
                      f" found. Presets: {', '.join(PRESETS)} (add *N for an N-node cluster), or give the path"
                      " to a YAML topology file (see docs/topology.md)")


def _replicated(topo: Topology, spec: str, base: str) -> Topology:
    count = spec.partition("*")[2]
    try:
        n = int(count)
    except ValueError:
        raise ConfigError(f"{spec!r}: the node count after '*' must be an integer, e.g. {base}*4") from None
    try:
        return topo.replicate(n)
    except ConfigError as exc:
        raise ConfigError(f"{base}: {exc}") from None

