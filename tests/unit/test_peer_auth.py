"""The pure pieces of peer authentication: secret files, handshake proofs, directory-entry MACs, config."""

from __future__ import annotations

import os

import pytest

from gfaas.config import NodeConfig
from gfaas.dataplane.directory import redis_client
from gfaas.dataplane.peer_auth import PeerKey, generate_key_file, read_secret_file
from gfaas.errors import ConfigError


def test_secret_files_must_be_private_regular_files(tmp_path: object) -> None:
    """A key file others can read, a symlink to one, or a short key is refused with the fix."""
    d = str(tmp_path)
    path = os.path.join(d, "k")
    generate_key_file(path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    key = read_secret_file(path, "cluster key file", 32)
    assert len(key) == 64 and bytes.fromhex(key.decode())
    with pytest.raises(FileExistsError):
        generate_key_file(path)  # never overwritten
    os.chmod(path, 0o640)
    with pytest.raises(ConfigError, match="mode 0640.*chmod 600"):
        read_secret_file(path, "cluster key file")
    os.chmod(path, 0o600)
    link = os.path.join(d, "link")
    os.symlink(path, link)
    with pytest.raises(ConfigError, match=rf"cluster key file {link} is a symlink \(to '{path}'\); it is never followed"):
        PeerKey.from_file(link)
    short = os.path.join(d, "short")
    with open(short, "w", opener=lambda p, f: os.open(p, f, 0o600)) as f:
        f.write("too short\n")
    with pytest.raises(ConfigError, match="holds 9 bytes; it needs at least 32"):
        PeerKey.from_file(short)


def test_proofs_bind_role_nodes_and_nonces() -> None:
    """A proof verifies only for the same key, role, node IDs and both nonces."""
    k, other = PeerKey(b"k" * 32), PeerKey(b"o" * 32)
    n1, n2 = b"1" * 32, b"2" * 32
    p = k.proof("server", "b", "a", n1, n2)
    assert PeerKey.check(k.proof("server", "b", "a", n1, n2), p)
    for q in (k.proof("client", "b", "a", n1, n2), k.proof("server", "c", "a", n1, n2),
              k.proof("server", "b", "a", n2, n1), other.proof("server", "b", "a", n1, n2)):
        assert not PeerKey.check(q, p)
    assert not PeerKey.check(p, "not bytes")


def test_entry_macs_cover_every_field() -> None:
    """Changing, adding or dropping any field of a directory entry, or moving it to another key, breaks its MAC."""
    k = PeerKey(os.urandom(32))
    fields = {"node": "a", "invocation": "i", "producer": "p", "consumers": "null", "nbytes": "8"}
    signed = {**fields, "mac": k.entry_mac("obj", "ab" * 16, fields)}
    assert k.entry_ok("obj", "ab" * 16, signed)
    assert not k.entry_ok("obj", "cd" * 16, signed)
    assert not k.entry_ok("node", "ab" * 16, signed)
    assert not k.entry_ok("obj", "ab" * 16, {**signed, "node": "evil"})
    assert not k.entry_ok("obj", "ab" * 16, {**signed, "freed": "x"})
    assert not k.entry_ok("obj", "ab" * 16, {k: v for k, v in signed.items() if k != "nbytes"})
    assert not k.entry_ok("obj", "ab" * 16, {**signed, "mac": "é" * 64})
    assert not k.entry_ok("obj", "ab" * 16, fields)
    assert not PeerKey(os.urandom(32)).entry_ok("obj", "ab" * 16, signed)


def test_config_needs_a_cluster_key_for_cross_node(tmp_path: object) -> None:
    """transfer_host or redis_url without cluster_key_file is refused, naming the fix."""
    d = str(tmp_path)
    base = {"socket_path": os.path.join(d, "s"), "state_dir": os.path.join(d, "st")}
    for extra in ({"transfer_host": "127.0.0.1"}, {"redis_url": "redis://127.0.0.1:1/0"}):
        with pytest.raises(ConfigError, match="need cluster_key_file.*gfaas cluster keygen"):
            NodeConfig(**base, **extra)  # type: ignore[arg-type]
    NodeConfig(**base)  # single-node needs none
    with pytest.raises(ConfigError, match="peer_handshake_timeout_s=0"):
        NodeConfig(**base, peer_handshake_timeout_s=0)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="peer_max_pending_per_ip=0"):
        NodeConfig(**base, peer_max_pending_per_ip=0)  # type: ignore[arg-type]


def test_redis_options_read_password_file_and_tls_ca(tmp_path: object) -> None:
    """The directory's password comes from its file (over one in the URL); a CA file needs rediss://."""
    d = str(tmp_path)
    key, pw = os.path.join(d, "k"), os.path.join(d, "pw")
    generate_key_file(key)
    with open(pw, "w", opener=lambda p, f: os.open(p, f, 0o600)) as f:
        f.write("s3cret\n")
    base = {"socket_path": os.path.join(d, "s"), "state_dir": os.path.join(d, "st"), "cluster_key_file": key}
    cfg = NodeConfig(**base, redis_url="rediss://u:url-pw@h:6380/0", redis_password_file=pw,  # type: ignore[arg-type]
                     redis_ca_file="/etc/ssl/ca.pem")
    r = redis_client(cfg, 2.0)
    ck = r.connection_pool.connection_kwargs
    assert (ck["username"], ck["password"], ck["ssl_ca_certs"]) == ("u", "s3cret", "/etc/ssl/ca.pem")
    assert ck["socket_timeout"] == 2.0
    assert r.connection_pool.connection_class.__name__ == "SSLConnection"
    plain = NodeConfig(**base, redis_url="redis://h:1/0", redis_ca_file="/etc/ssl/ca.pem")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="needs a TLS directory URL"):
        redis_client(plain, 2.0)


def test_derived_secrets_are_per_key_invocation_and_function() -> None:
    """Every holder of a key derives the same function tokens (32 hex, distinct per function and per
    invocation); another key derives others; the Ray token differs from all of them."""
    from gfaas.dataplane.peer_auth import PeerKey

    k1, k2 = PeerKey(b"k" * 32), PeerKey(b"j" * 32)
    t = k1.function_tokens("ab" * 16, ["a", "b", "gateway"])
    assert t == PeerKey(b"k" * 32).function_tokens("ab" * 16, ["a", "b", "gateway"])
    assert all(len(v) == 32 and int(v, 16) >= 0 for v in t.values()) and len(set(t.values())) == 3
    assert t["a"] != k1.function_tokens("cd" * 16, ["a"])["a"]
    assert t["a"] != k2.function_tokens("ab" * 16, ["a"])["a"]
    assert k1.ray_token() != k2.ray_token() and k1.ray_token() not in t.values() and len(k1.ray_token()) == 64
