"""The pure parts of the function sandbox (gfaas.runtime.sandbox)."""

from __future__ import annotations

import pytest

from gfaas.errors import ConfigError
from gfaas.runtime.sandbox import Identity, TenantIds, sandbox_enabled, worker_env


def test_tenants_get_distinct_uids_that_skip_accounts_and_stay_theirs() -> None:
    """Each workflow gets the next free uid from the base; a uid of an account is never given."""
    ids = TenantIds(5000, count=4, taken={5001})
    assert ids("a") == Identity(5000, 5000)
    assert ids("b") == Identity(5002, 5002)
    assert ids("a") == Identity(5000, 5000)  # stable for the runtime's life
    assert ids("c") == Identity(5003, 5003)
    with pytest.raises(ConfigError, match=r"no free tenant uid left in \[5000, 5004\)"):
        ids("d")


def test_a_low_uid_base_is_refused() -> None:
    with pytest.raises(ConfigError, match="sandbox_uid_base=10 is invalid"):
        TenantIds(10)


@pytest.mark.parametrize(("mode", "executor", "euid", "expect"), [
    ("auto", "process", 0, True), ("auto", "process", 1000, False), ("auto", "ray", 0, False),
    ("none", "process", 0, False), ("uid", "process", 0, True),
])
def test_when_the_sandbox_is_on(mode: str, executor: str, euid: int, expect: bool) -> None:
    assert sandbox_enabled(mode, executor, euid) is expect


@pytest.mark.parametrize(("mode", "executor", "euid", "msg"), [
    ("uid", "process", 1000, "needs the runtime to run as root"),
    ("uid", "inproc", 0, "needs executor='process'"),
    ("strict", "process", 0, "sandbox='strict' is unknown"),
])
def test_a_sandbox_that_cannot_be_had_is_refused(mode: str, executor: str, euid: int, msg: str) -> None:
    with pytest.raises(ConfigError, match=msg):
        sandbox_enabled(mode, executor, euid)


def test_a_sandboxed_worker_inherits_no_secrets_from_the_environment() -> None:
    """Only listed variables pass (the operator's credentials do not); without a sandbox all do."""
    env = {"PATH": "/bin", "PYTHONPATH": "/x", "LC_ALL": "C", "AWS_SECRET_ACCESS_KEY": "s",
           "GFAAS_TOKEN": "t", "REDIS_URL": "redis://:pw@h"}
    assert worker_env(env, Identity(5000, 5000)) == {"PATH": "/bin", "PYTHONPATH": "/x", "LC_ALL": "C"}
    assert worker_env(env, None) == env
