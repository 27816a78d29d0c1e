"""Shared fixtures and tier handling for the gfaas test suite (see tests/README.md).

* Tests under ``tests/integration`` are marked ``integration``, those under ``tests/gpu`` ``gpu`` and
  those under ``tests/security`` ``security`` and ``integration`` automatically, so ``-m 'not integration'`` selects the fast unit tier.
* ``gpu`` tests are skipped, with a reason, on machines without a CUDA GPU; ``netns`` tests are skipped
  unless running as root with ``ip`` available.
* ``run_dir`` is a short per-test directory in /tmp (Unix socket paths must stay under 108 bytes).
* ``node`` is a running daemon process (:class:`~gfaas.dataplane.local.LocalNode`) with an
  :class:`~gfaas.Admin` and an open invocation of the functions ``f``, ``g`` and ``h``; its settings
  can be changed per test with ``@pytest.mark.node_config(capacity_bytes=..., ...)``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import gfaas
from gfaas.config import MiB
from gfaas.dataplane.local import LocalNode

_TESTS = Path(__file__).resolve().parent

# CI runs are reproducible: derandomized Hypothesis, no example database carried between runs.
# Hypothesis is optional here: `make test-gpu` runs on an image that may lack it (no property tests there).
with contextlib.suppress(ImportError):
    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, database=None, deadline=None)
    settings.register_profile("dev", deadline=None)
    settings.load_profile("ci" if os.environ.get("CI") else "dev")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "node_config(**kwargs): NodeConfig overrides for the `node` fixture of this test"
    )
    if not config.pluginmanager.hasplugin("timeout"):  # an image without pytest-timeout (make test-gpu)
        config.addinivalue_line("markers", "timeout(seconds): ignored: pytest-timeout is not installed")


# How `make test` runs the suite (tests/README.md): in parallel on several workers, except
# * EXCLUSIVE files, which measure ratios of times (a busy neighbour would skew them): `serial`, run
#   one at a time after everything else;
# * MACHINE_WIDE files, which use what the whole machine shares (network namespaces, KSM's settings, a
#   Ray cluster on namespaces): the xdist group "machine", one at a time on one worker while the other
#   workers run the rest.
EXCLUSIVE = {
    "browser/test_dashboard_browser.py": "the page's first-paint time",
    "integration/test_bench_autoscale.py": "latency ratios of the scaling policies",
    "integration/test_bench_dataplane.py": "ratios of transfer times",
    "integration/test_bench_overload.py": "goodput and latency ratios under load",
    "integration/test_dataplane_speed_guard.py": "ratios of transfer times",
    "integration/test_polling_guard.py": "ratios of invocation latencies",
}
MACHINE_WIDE = {
    "integration/test_cluster_ray.py": "machines made of network namespaces, a Ray cluster",
    "integration/test_cross_node.py": "network namespaces",
    "integration/test_dedup_ksm_root.py": "KSM's settings",
    "integration/test_dedup_runtime.py": "KSM's settings",
    "integration/test_runtime_netns.py": "network namespaces",
    "integration/test_scaling_netns.py": "network namespaces and their rate limits",
    "security/test_peers_netns.py": "network namespaces",
    "security/test_dedup_seccomp.py": "KSM's settings (a hint starts a burst)",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.fspath)).resolve()
        rel = path.relative_to(_TESTS).as_posix()
        if rel in EXCLUSIVE:
            item.add_marker(pytest.mark.serial)
        elif rel in MACHINE_WIDE or item.get_closest_marker("netns") is not None:
            item.add_marker(pytest.mark.xdist_group("machine"))
        if _TESTS / "integration" in path.parents:
            item.add_marker(pytest.mark.integration)
        if _TESTS / "gpu" in path.parents:
            item.add_marker(pytest.mark.gpu)
        if _TESTS / "security" in path.parents:
            item.add_marker(pytest.mark.security)
            item.add_marker(pytest.mark.integration)


def _has_cuda_gpu() -> bool:
    if os.environ.get("GFAAS_FORCE_NO_GPU"):
        return False
    return any(os.path.exists(p) for p in ("/dev/nvidia0", "/dev/nvidiactl"))


def _netns_capable() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is not None and not _has_cuda_gpu():
        pytest.skip("needs a CUDA GPU (no /dev/nvidia0 on this machine)")
    if item.get_closest_marker("netns") is not None and not _netns_capable():
        pytest.skip("needs root and iproute2 (ip, tc) to create network namespaces and shape their links")
    if item.get_closest_marker("root") is not None and os.geteuid() != 0:
        pytest.skip("needs root (a separate uid per tenant, or files owned by another user)")


# ---- directories and daemons -------------------------------------------------------------------
@pytest.fixture
def run_dir() -> Iterator[str]:
    """A fresh short directory in /tmp for sockets and state; removed afterwards."""
    d = tempfile.mkdtemp(prefix="gft-", dir="/tmp")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


DEFAULT_NODE = {"node_id": "n0", "capacity_bytes": 256 * MiB, "slab_bytes": 1 * MiB}


def node_config(run_dir: str, **overrides: Any) -> gfaas.NodeConfig:
    """A NodeConfig whose socket and state live in ``run_dir`` (test defaults: 256 MiB pool, 1 MiB slabs)."""
    kw: dict[str, Any] = {
        **DEFAULT_NODE,
        "socket_path": os.path.join(run_dir, "node.sock"),
        "state_dir": os.path.join(run_dir, "state"),
    }
    kw.update(overrides)
    return gfaas.NodeConfig(**kw)


@pytest.fixture
def make_config(run_dir: str) -> Any:
    """``make_config(**overrides)``: a NodeConfig in this test's ``run_dir``."""
    return lambda **kw: node_config(run_dir, **kw)


class NodeHarness:
    """A running daemon process, its admin connection and one open invocation (functions f, g, h)."""

    FUNCTIONS = ("f", "g", "h")

    def __init__(self, config: gfaas.NodeConfig) -> None:
        self.config = config
        self.local = LocalNode(config)
        self._clients: list[gfaas.Client] = []
        self.admin: gfaas.Admin | None = None
        self.inv: gfaas.InvocationHandle | None = None

    # lifecycle
    def start(self) -> NodeHarness:
        self.local.__enter__()
        self.admin = gfaas.Admin(self.config.socket_path, state_dir=self.config.state_dir)
        if self.inv is None:
            self.inv = self.admin.open_invocation("wf", list(self.FUNCTIONS))
        return self

    def kill(self) -> None:
        """SIGKILL the daemon (the admin connection is closed on this side too)."""
        if self.admin is not None:
            self.admin.close()
            self.admin = None
        self.local.kill()

    def restart(self) -> None:
        """Start a new daemon process with the same config (same state_dir) after :meth:`kill`."""
        self.local = LocalNode(self.config)
        self.local.__enter__()
        self.admin = gfaas.Admin(self.config.socket_path, state_dir=self.config.state_dir)

    def stop(self) -> None:
        for c in self._clients:
            c.close()
        self._clients.clear()
        if self.admin is not None:
            self.admin.close()
            self.admin = None
        proc = self.local.proc
        if proc is not None and proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGCONT)  # a test may have stopped it
            except ProcessLookupError:
                pass
        self.local.__exit__(None, None, None)

    # helpers
    @property
    def pid(self) -> int:
        assert self.local.proc is not None
        return self.local.proc.pid

    def credentials(self, function: str = "f", inv: gfaas.InvocationHandle | None = None) -> gfaas.Credentials:
        return (inv or self.inv).credentials(function)  # type: ignore[union-attr]

    def connect(self, function: str = "f", inv: gfaas.InvocationHandle | None = None,
                **kw: Any) -> gfaas.Client:
        c = gfaas.connect(self.credentials(function, inv), **kw)
        self._clients.append(c)
        return c

    def open(self, functions: tuple[str, ...] = FUNCTIONS, workflow: str = "wf") -> gfaas.InvocationHandle:
        assert self.admin is not None
        return self.admin.open_invocation(workflow, list(functions))

    def stats(self) -> dict[str, Any]:
        assert self.admin is not None
        return self.admin.stats()

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))


@pytest.fixture
def node(request: pytest.FixtureRequest, run_dir: str) -> Iterator[NodeHarness]:
    """A running daemon process + Admin + an open invocation; stopped and cleaned up afterwards."""
    marker = request.node.get_closest_marker("node_config")
    overrides = dict(marker.kwargs) if marker is not None else {}
    h = NodeHarness(node_config(run_dir, **overrides))
    try:
        h.start()
        yield h
    finally:
        h.stop()


@pytest.fixture(scope="module")
def shared_node() -> Iterator[NodeHarness]:
    """Like ``node`` but one daemon for the whole test module (for tests that only add objects)."""
    d = tempfile.mkdtemp(prefix="gft-", dir="/tmp")
    h = NodeHarness(node_config(d))
    try:
        h.start()
        yield h
    finally:
        h.stop()
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def rt_handlers(monkeypatch: pytest.MonkeyPatch) -> str:
    """Makes ``tests/support/rt_handlers.py`` importable here and in worker processes this test starts."""
    support = str(_TESTS / "support")
    monkeypatch.syspath_prepend(support)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (support, os.environ.get("PYTHONPATH")) if p))
    return "rt_handlers"


@contextlib.contextmanager
def _daemon_in_thread(config: gfaas.NodeConfig) -> Iterator[Any]:
    from gfaas.dataplane.daemon import Daemon

    d = Daemon(config)
    d.bind()
    t = threading.Thread(target=d.serve_forever, daemon=True)
    t.start()
    try:
        yield d
    finally:
        d.stop()
        t.join(10)


@pytest.fixture
def thread_daemon() -> Any:
    """``with thread_daemon(config) as d:`` a node daemon serving on a thread of this process, for
    tests that reach into it (its store, its devices' logs) or patch it; stopped on exit."""
    return _daemon_in_thread


_NOT_BUILT = "gfaas_native is not built here (make setup builds it; needs cargo)"


def _swapped(module: Any, names: tuple[str, ...], values: tuple[Any, ...]) -> Iterator[tuple[Any, ...]]:
    """Rebind ``names`` in the requesting test module to ``values`` while its tests run."""
    g = vars(module)
    saved = [g[n] for n in names]
    g.update(zip(names, values, strict=True))
    try:
        yield values
    finally:
        g.update(zip(names, saved, strict=True))


def _sim_kernel_params() -> list[Any]:
    from gfaas.sim import kernel

    skip = pytest.mark.skipif(kernel.NativeSimulator is None, reason=_NOT_BUILT)
    return [pytest.param(kernel.PySimulator, id="python-kernel"),
            pytest.param(kernel.NativeSimulator, id="native-kernel", marks=skip)]


@pytest.fixture(scope="module", params=_sim_kernel_params())
def sim_kernel(request: pytest.FixtureRequest) -> Iterator[tuple[Any, ...]]:
    """Each implementation of the simulator's kernel in turn, the pure-Python reference and the Rust one
    (gfaas.sim.kernel), bound to the module's name ``Simulator``: a module that uses it
    (``pytestmark = pytest.mark.usefixtures("sim_kernel")``) runs every test on both."""
    yield from _swapped(request.module, ("Simulator",), (request.param,))


def _sim_core_params() -> list[Any]:
    from gfaas.sim import kernel, network

    skip = pytest.mark.skipif(network.NativeNetwork is None, reason=_NOT_BUILT)
    return [pytest.param((kernel.PySimulator, network.PyNetwork), id="python-core"),
            pytest.param((kernel.NativeSimulator, network.NativeNetwork), id="native-core", marks=skip),
            pytest.param((kernel.PySimulator, network.NativeNetwork), id="native-network-python-kernel", marks=skip)]


@pytest.fixture(scope="module", params=_sim_core_params())
def sim_core(request: pytest.FixtureRequest) -> Iterator[tuple[Any, ...]]:
    """(kernel class, network class) of the simulator bound to the module's ``Simulator`` and ``Network``:
    both pure Python (the reference), both native, and the native network on the reference kernel."""
    yield from _swapped(request.module, ("Simulator", "Network"), request.param)


def _router_params() -> list[Any]:
    from gfaas.policy.routing import Router
    from gfaas.policy.routing_native import NativeRouter, native_router_available

    skip = pytest.mark.skipif(not native_router_available(), reason=_NOT_BUILT)
    return [pytest.param(Router, id="python-router"), pytest.param(NativeRouter, id="native-router", marks=skip)]


@pytest.fixture(scope="module", params=_router_params())
def router_class(request: pytest.FixtureRequest) -> Iterator[tuple[Any, ...]]:
    """The reference Router and the native one (gfaas.policy.routing_native) in turn, bound to the
    module's name ``Router``."""
    yield from _swapped(request.module, ("Router",), (request.param,))
