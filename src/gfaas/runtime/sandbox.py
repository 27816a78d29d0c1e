"""The function sandbox: a separate uid per tenant (workflow) for worker processes.

Function code is untrusted. When the runtime runs as root, every worker of a workflow runs under a
uid of its own that no account uses, so the kernel's ordinary permission checks keep it out of the
node daemon's state directory (tokens, registry, journal: mode 0700, owned by the node), out of the
daemon's and other tenants' processes (``/proc/PID/{mem,environ,fd}``, signals, ``ptrace``), and out
of shared-memory segments other than those the daemon hands it (a memfd created by the daemon with
mode 0400 cannot be reopened by another uid through ``/proc/self/fd``).

Why a uid and not a container tool: the isolation needed is the one between local users, which the
kernel already enforces, with no extra package and no namespace setup per worker (which costs tens
of milliseconds at every cold start); bubblewrap or user namespaces would add mount isolation, but
hiding paths is not what protects the node: their owners and modes are.

A worker starts as root, imports its handler and loads its model (the interpreter and the model
cache may live where only root can read, such as ``/root/.pyenv``), and only then drops to the
tenant uid, before it receives any task; it was started with no descriptor but stdio and its
control socket. Since it can no longer
reach the daemon's socket, the runtime connects for it and passes the connected socket with each
task. Without root (a developer machine) there is no uid to drop to: functions run as the user who
started the runtime and can read that user's files, including the node's state; the runtime logs a
warning, and ``sandbox="uid"`` refuses to start instead.
"""

from __future__ import annotations

import ctypes
import logging
import os
import pwd
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..errors import ConfigError
from .seccomp import deny_merging  # imported as root: after the drop the package may be unreadable

log = logging.getLogger("gfaas.runtime")

SANDBOX_MODES = ("auto", "uid", "none")
_PR_SET_DUMPABLE = 4
_PR_SET_NO_NEW_PRIVS = 38
# Environment a sandboxed worker keeps; anything else (credentials of the operator's shell, cloud
# keys, Redis URLs with passwords) is not the function's business.
_ENV_KEEP = frozenset({
    "PATH", "PYTHONPATH", "PYTHONHASHSEED", "LANG", "LANGUAGE", "TZ", "TMPDIR", "VIRTUAL_ENV",
    "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES",
    "GFAAS_CACHE_DIR", "GFAAS_LOG", "GFAAS_COPY_THREADS", "GFAAS_FORCE_NO_GPU", "HOME",
})

# Set in every worker's environment: bundled libraries' telemetry off (onnxruntime's opens a database
# under HOME at import, which a worker started as root would keep open after its uid drop).
WORKER_ENV = {"ORT_DISABLE_TELEMETRY": "1", "ORT_TELEMETRY_DISABLED": "1"}


@dataclass(frozen=True)
class Identity:
    """The uid and gid a tenant's workers run under."""

    uid: int
    gid: int


def sandbox_enabled(mode: str, executor: str, euid: int | None = None) -> bool:
    """Whether workers get a tenant uid: ``auto`` when root and the executor starts processes."""
    if mode not in SANDBOX_MODES:
        raise ConfigError(f"sandbox={mode!r} is unknown; choose one of {', '.join(SANDBOX_MODES)}")
    root = (os.geteuid() if euid is None else euid) == 0
    if mode == "none":
        return False
    if executor != "process":
        if mode == "uid":
            raise ConfigError(f"sandbox='uid' needs executor='process'; the {executor!r} executor runs "
                              "functions in processes the runtime does not start")
        return False
    if not root:
        if mode == "uid":
            raise ConfigError("sandbox='uid' needs the runtime to run as root (it starts each tenant's "
                              "workers under a uid of their own); run as root or use sandbox='auto'")
        return False
    return True


class TenantIds:
    """Gives each tenant (workflow) a uid of its own from ``base`` upward, skipping uids of accounts.

    The uid is the tenant's for as long as this runtime lives, also across undeploy and redeploy, so a
    file a tenant left behind is never readable by the next tenant that would get its uid.
    """

    def __init__(self, base: int, count: int = 65536, taken: Iterable[int] | None = None) -> None:
        if not isinstance(base, int) or base < 1000 or base + count > 2**31 - 2:
            raise ConfigError(f"sandbox_uid_base={base!r} is invalid: give an integer >= 1000 so that "
                              f"base + {count} stays below 2**31")
        self.base, self.count = base, count
        self._taken = set(taken) if taken is not None else {p.pw_uid for p in pwd.getpwall()}
        self._by_tenant: dict[str, Identity] = {}
        self._next = base

    def __call__(self, tenant: str) -> Identity:
        ident = self._by_tenant.get(tenant)
        if ident is None:
            while self._next in self._taken:
                self._next += 1
            if self._next >= self.base + self.count:
                raise ConfigError(f"no free tenant uid left in [{self.base}, {self.base + self.count}); "
                                  "choose another sandbox_uid_base")
            ident = Identity(self._next, self._next)
            self._next += 1
            self._by_tenant[tenant] = ident
        return ident


def worker_env(env: Mapping[str, str], identity: Identity | None) -> dict[str, str]:
    """The environment of a worker: everything without a sandbox, the allowed names with one."""
    if identity is None:
        return dict(env)
    kept = {k: v for k, v in env.items() if k in _ENV_KEEP or k.startswith("LC_")}
    kept.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    return kept


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}, {value}): {os.strerror(err)}")


def _private_home() -> str:
    """A fresh HOME only this worker's tenant can read, removed when the worker exits.

    HOME served the model cache while loading and is root's. Libraries that run tasks write caches
    under HOME (torch and Triton compile kernels on a GPU's first call): an unwritable HOME fails the
    task, and a HOME shared across workers would let one tenant's files reach another that gets its
    uid later. So each worker gets its own (mode 0700 from mkdtemp, made after the uid drop)."""
    import atexit
    import shutil
    import tempfile

    home = tempfile.mkdtemp(prefix=f"gfaas-home-{os.getuid()}-")
    os.environ["HOME"] = home
    os.environ["XDG_CACHE_HOME"] = os.path.join(home, ".cache")
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    return home


def drop_privileges(identity: Identity, *, merge_hints: bool = False) -> int | None:
    """Become ``identity`` for good (in the worker, before it serves any task), under the seccomp
    filter that keeps page merging the runtime's (:mod:`.seccomp`). ``merge_hints``: the runtime
    hints pages for ``ctx.merge``, so ``madvise(MADV_MERGEABLE)`` is supervised, not refused; the
    listener descriptor for the runtime's supervisor is returned then (None otherwise).

    The worker was started with no descriptor but stdio and its control socket (``close_fds``);
    what it opened since is its libraries' own (thread pools' event descriptors, model files), and
    closing those under them would hang or corrupt them. Raises ``OSError`` if the kernel refuses
    any step, so a worker never runs a task with more rights than intended.
    """
    os.setgroups([])
    os.setresgid(identity.gid, identity.gid, identity.gid)
    os.setresuid(identity.uid, identity.uid, identity.uid)
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)  # no setuid binary gives root back
    listener = deny_merging(madvise_mergeable="notify" if merge_hints else "deny")
    # A uid change makes the process non-dumpable, which hands its /proc entries to root; the tenant
    # may see its own process (libraries read /proc/self), other uids still may not.
    _prctl(_PR_SET_DUMPABLE, 1)
    os.umask(0o077)
    _private_home()
    try:
        os.chdir("/")
    except OSError:
        pass
    if os.getuid() != identity.uid or os.geteuid() != identity.uid:
        raise OSError(f"the uid drop to {identity.uid} did not take (uid {os.getuid()}, euid {os.geteuid()})")
    try:
        os.setuid(0)
    except PermissionError:
        return listener
    raise OSError("the worker could become root again after dropping its privileges")
