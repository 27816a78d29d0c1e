"""NodeConfig validation: every rejected value is named in the error."""

import os
import re

import pytest

from gfaas import ConfigError, NodeConfig
from gfaas.config import GiB, KiB, MiB, default_run_dir, default_socket_path


def cfg(**kw: object) -> NodeConfig:
    kw.setdefault("socket_path", "/tmp/gfaas-unit.sock")
    kw.setdefault("state_dir", "/tmp/gfaas-unit.state")
    return NodeConfig(**kw)  # type: ignore[arg-type]


def test_defaults() -> None:
    """Defaults: host backend, 2 GiB pool, 8 MiB slabs, slab-packed objects up to 128 KiB."""
    c = cfg()
    assert (c.backend, c.capacity_bytes, c.slab_bytes, c.ids_per_lease) == ("host", 2 * GiB, 8 * MiB, 64)
    assert c.small_object_max == 128 * KiB
    assert cfg(slab_object_bytes=4 * MiB).small_object_max == 2 * MiB  # at most a quarter slab


def test_default_paths_follow_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without paths, socket and state go under $GFAAS_RUN_DIR named after the node."""
    monkeypatch.setenv("GFAAS_RUN_DIR", "/tmp/gfaas-rd")
    monkeypatch.delenv("GFAAS_SOCKET", raising=False)
    c = NodeConfig(node_id="nx")
    assert c.socket_path == "/tmp/gfaas-rd/nx.sock"
    assert c.state_dir == "/tmp/gfaas-rd/nx.state"
    monkeypatch.setenv("GFAAS_SOCKET", "/tmp/other.sock")
    assert default_socket_path("nx") == "/tmp/other.sock"
    monkeypatch.delenv("GFAAS_RUN_DIR")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/7")
    assert default_run_dir() == f"/run/user/7/gfaas-{os.getuid()}"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert default_run_dir() == "/run/gfaas"  # root: not a name other users can pre-create in /tmp
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert default_run_dir() == f"/tmp/gfaas-{os.getuid()}"  # checked by the daemon before use


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:s3cret@h:6379/0", "redis://:***@h:6379/0"),
        ("rediss://user:p@ss@h/1", "rediss://user:***@h/1"),
        ("redis://h:6379/0", "redis://h:6379/0"),
        ("redis://user@h", "redis://user@h"),
    ],
)
def test_config_repr_hides_redis_passwords(url: str, shown: str) -> None:
    """NodeConfig's repr (what logs and errors print) shows the Redis URL with its password masked."""
    r = repr(cfg(redis_url=url, cluster_key_file="/nonexistent/cluster.key"))  # a path; not read here
    assert f"redis_url={shown!r}" in r and ("***" not in shown or "s3cret" not in r and "p@ss" not in r)


@pytest.mark.parametrize(
    ("kw", "named"),
    [
        ({"max_connections": 0}, "max_connections=0 is invalid"),
        ({"max_connections_per_uid": -1}, "max_connections_per_uid=-1 is invalid"),
        ({"hello_timeout_s": 0}, "hello_timeout_s=0 must be a number of seconds > 0"),
        ({"hello_timeout_s": float("inf")}, "hello_timeout_s=inf must be"),
    ],
)
def test_connection_limits_are_validated(kw: dict[str, object], named: str) -> None:
    """Connection caps are integers >= 1 and the Hello deadline a finite number of seconds > 0."""
    with pytest.raises(ConfigError, match=re.escape(named)):
        NodeConfig(**kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kw", "named"),
    [
        ({"node_id": ""}, "node_id=''"),
        ({"node_id": "a/b"}, "node_id='a/b'"),
        ({"node_id": "n0\n"}, "node_id='n0\\n'"),
        ({"node_id": "n" * 65}, "node_id='" + "n" * 65 + "'"),
        ({"backend": "cuda9"}, "backend='cuda9'"),
        ({"capacity_bytes": 4 * KiB - 1}, "capacity_bytes=4095"),
        ({"capacity_bytes": -1}, "capacity_bytes=-1"),
        ({"capacity_bytes": True}, "capacity_bytes=True"),
        ({"capacity_bytes": 1.5e9}, "capacity_bytes=1500000000.0"),
        ({"slab_bytes": 64 * KiB - 1}, "slab_bytes=65535"),
        ({"slab_bytes": "8MiB"}, "slab_bytes='8MiB'"),
        ({"capacity_bytes": MiB, "slab_bytes": 2 * MiB}, "slab_bytes=2097152 exceeds capacity_bytes=1048576"),
        ({"ids_per_lease": 0}, "ids_per_lease=0"),
        ({"chunk_bytes": 100}, "chunk_bytes=100"),
        ({"tombstones_per_invocation": 0}, "tombstones_per_invocation=0"),
        ({"transfer_port": -1}, "transfer_port=-1"),
        ({"transfer_port": 65536}, "transfer_port=65536"),
        ({"transfer_port": "80"}, "transfer_port='80'"),
        ({"remote_timeout_s": 0}, "remote_timeout_s=0"),
        ({"remote_timeout_s": -2.5}, "remote_timeout_s=-2.5"),
        ({"remote_timeout_s": float("nan")}, "remote_timeout_s=nan"),
        ({"remote_timeout_s": "5"}, "remote_timeout_s='5'"),
    ],
)
def test_invalid_values_raise_config_error_naming_them(kw: dict[str, object], named: str) -> None:
    """Each invalid setting raises ConfigError (a ValueError) whose message names the bad value."""
    with pytest.raises(ConfigError) as ei:
        cfg(**kw)
    assert named in str(ei.value)
    assert isinstance(ei.value, ValueError)


def test_socket_path_longer_than_107_bytes_is_rejected() -> None:
    """A socket path over 107 bytes (the sun_path limit) raises ConfigError naming the path."""
    long = "/tmp/" + "s" * 103  # 108 bytes
    with pytest.raises(ConfigError) as ei:
        cfg(socket_path=long)
    assert repr(long) in str(ei.value) and "107 bytes" in str(ei.value)
    assert cfg(socket_path="/tmp/" + "s" * 102).socket_path.endswith("s")  # 107 bytes is fine


def test_socket_path_length_counts_bytes_not_characters() -> None:
    """Non-ASCII characters count with their UTF-8 length."""
    with pytest.raises(ConfigError):
        cfg(socket_path="/tmp/" + "é" * 52)  # 5 + 104 bytes


def test_smallest_valid_values_are_accepted() -> None:
    """The documented minimums themselves are valid."""
    c = cfg(capacity_bytes=64 * KiB, slab_bytes=64 * KiB, ids_per_lease=1, chunk_bytes=4 * KiB,
            tombstones_per_invocation=1, transfer_port=65535, remote_timeout_s=1e-3, backend="null")
    assert c.small_object_max == 16 * KiB


def test_config_is_frozen() -> None:
    """A NodeConfig cannot be changed after validation."""
    c = cfg()
    with pytest.raises(AttributeError):
        c.capacity_bytes = 1  # type: ignore[misc]
