"""The Ray node beside a gfaas node (gfaas.deploy.ray_node) and the CLI's cluster flags."""

from __future__ import annotations

import json
import os

import pytest

from gfaas.cli import build_parser, main
from gfaas.dataplane.peer_auth import PeerKey, generate_key_file
from gfaas.deploy.ray_node import NODE_UNITS, ray_env, start_argv
from gfaas.errors import ConfigError


def test_start_argv_marks_the_node_and_stays_in_the_foreground() -> None:
    """Joining: --block, the gfaas_node_<id> resource, the node's address and CPUs; a head: port and no
    dashboard; never both."""
    argv = start_argv("m1", address="10.0.0.1:6379", node_ip="10.0.0.2", num_cpus=4)
    assert argv[1:3] == ["start", "--block"]
    assert json.loads(argv[argv.index("--resources") + 1]) == {"gfaas_node_m1": NODE_UNITS}
    assert argv[argv.index("--address") + 1] == "10.0.0.1:6379" and "--head" not in argv
    assert argv[argv.index("--node-ip-address") + 1] == "10.0.0.2" and argv[argv.index("--num-cpus") + 1] == "4"
    head = start_argv("h", head_port=6379, num_cpus=0)
    assert "--head" in head and head[head.index("--port") + 1] == "6379" and head[head.index("--num-cpus") + 1] == "0"
    with pytest.raises(ConfigError):
        start_argv("m1", address="a:1", head_port=6379)
    with pytest.raises(ConfigError):
        start_argv("m1")


def test_ray_env_turns_token_auth_on_with_the_keys_token() -> None:
    env = ray_env(PeerKey(b"k" * 32), {"PATH": "/bin"})
    assert env == {"PATH": "/bin", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": PeerKey(b"k" * 32).ray_token(),
                   "RAY_USAGE_STATS_ENABLED": "0"}


def test_cli_ray_token_and_serve_flags(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    """`gfaas cluster ray-token KEY` prints the key's Ray token; serve and node start take the cluster flags."""
    key = os.path.join(str(tmp_path), "cluster.key")
    generate_key_file(key)
    assert main(["cluster", "ray-token", key]) == 0
    assert capsys.readouterr().out.strip() == PeerKey.from_file(key).ray_token()
    a = build_parser().parse_args(["serve", "--executor", "ray", "--ray-address", "h:6379", "--join", "redis://h/0",
                                   "--cluster-key-file", key, "--transfer-host", "10.0.0.1"])
    assert (a.ray_address, a.join, a.cluster_key_file, a.transfer_host) == ("h:6379", "redis://h/0", key, "10.0.0.1")
    n = build_parser().parse_args(["node", "start", "--join", "redis://h/0", "--ray-address", "h:6379"])
    assert n.join == "redis://h/0" and n.ray_address == "h:6379"
    with pytest.raises(SystemExit):  # a machine joins a head or is one
        build_parser().parse_args(["node", "start", "--ray-address", "h:6379", "--ray-head", "6379"])
