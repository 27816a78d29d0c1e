"""The Ray executor: each function slot is a Ray actor hosting the same :class:`FunctionHost`.

Ray places and supervises the actors (CPU/GPU resource requests per function kind); data never goes
through Ray's object store: the actors open the gfaas transport with the invocation's credentials,
exactly like local worker processes. On a multi-node Ray cluster every node runs its own gfaas node
daemon at the same socket path (``gfaas node start``), which is what the actors connect to.

A ``kind: gpu`` function's actor asks Ray for the GPUs its spec declares (:func:`~.gpus.ray_num_gpus`)
and computes on the one Ray assigns it (:func:`on_assigned_gpu`), which may not be the one the runtime
placed it on.

Control messages cross as msgspec bytes, so Ray pickles nothing of ours. ``ray`` is an optional extra.

A function from a code package (``gfaas deploy --code``) runs in a :class:`SandboxedActor` instead: the
actor receives the package with its start, checks it against its digest, stores it by content on its
machine, and starts the function as a sandboxed worker process there (the process executor's
:class:`~gfaas.runtime.worker.ProcessWorker`: the workflow's uid, an attached daemon connection bound
per task, so the tenant's code never holds a token), relaying each task to it. It needs the machine's
node daemon (``gfaas node start --ray-address`` tells its Ray node where, :data:`NODE_SOCKET_ENV`) and
root, to switch uid.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

import msgspec

from ..errors import ConfigError, FunctionFailed, MachineRefused, require_extra
from .gpus import ray_gpu_ordinal
from .heap import keep_freed
from .logs import Capture
from .worker import Done, Failed, FunctionHost, Init, Reply, Task, TaskTimedOut, WorkerDied, _dec, _enc

_ACTOR: Any = None
_SANDBOXED: Any = None
NODE_SOCKET_ENV, NODE_STATE_ENV = "GFAAS_NODE_SOCKET", "GFAAS_NODE_STATE_DIR"  # set by gfaas node start --ray-address


def _ray() -> Any:
    return require_extra("ray", "ray")


class FunctionActor:
    """The actor body: a function host. Defined at module level so Ray pickles it by reference."""

    def __init__(self, init: bytes) -> None:
        msg = _actor_gpu(_dec.decode(init))
        # The actor's process serves this function only: its prints and records are the function's log
        # (runtime.logs), carried with each reply as a worker process does; start-up lines go with the first.
        self.cap = Capture()
        self.cap.install()
        self.host = FunctionHost(msg)
        if msg.heap == "reuse":  # as a worker process does, once the model is loaded
            keep_freed()
        self.gpu = msg.gpu
        self.transport = msg.transport
        # On a gfaas node's Ray node: one attached connection to the machine's daemon for the actor's
        # life, bound to each task's credentials (no round trip of its own) instead of a connection,
        # Hello and close per task. Elsewhere (or if it breaks): a connection per task, as before.
        self.admin: Any = None
        self.attached: Any = None
        self._lease = False  # the last bound task packed a small put: the next binding leases a slab
        sock_path, state_dir = _node_daemon()
        if sock_path and state_dir and msg.transport.get("socket_path") == sock_path:
            from ..dataplane.client import Admin
            from ..errors import GfaasError

            try:
                self.admin = Admin(sock_path, state_dir=state_dir)
                self.attached = self.admin.attach()
            except (GfaasError, OSError):  # not the daemon's user, or no daemon: per task, as before
                self.admin = self.attached = None

    def ready(self) -> tuple[int, float, str]:
        return os.getpid(), self.host.load_s, self.gpu

    def run(self, task: bytes) -> bytes:
        from .transport import BoundTransport

        msg = _dec.decode(task)
        assert isinstance(msg, Task)
        cfg = msg.transport or self.transport
        t = None
        if self.attached is not None and msg.token and cfg.get("kind", "gfaas") == "gfaas" \
                and cfg.get("socket_path") == self.transport.get("socket_path"):
            # A slab with the task's credentials if the last task packed a small put (ProcessWorker._lease).
            t = BoundTransport(self.attached, msg.token, release=self._released,
                               lease_hint=self._lease and bool(msg.consumers))
        self.cap.begin()
        reply = self.host.run(msg, transport=t)
        if t is not None and isinstance(reply, Done):
            self._lease = reply.slab_used
        reply.logs = self.cap.take()
        return _enc.encode(reply)

    def _released(self, client: Any, healthy: bool) -> None:
        if not healthy:  # a broken connection: the next tasks connect per task
            self.attached = None
            client.close()


class SandboxedActor:
    """The actor body for a code package's function (see the module docstring)."""

    def __init__(self, init: bytes, package: bytes) -> None:
        from pathlib import Path

        from ..dataplane.client import Admin, Binder
        from .codepkg import CodeStore, read_archive
        from .worker import ProcessWorker

        msg = _actor_gpu(_dec.decode(init))  # its worker process inherits the actor's CUDA_VISIBLE_DEVICES
        sock_path, state_dir = _node_daemon()
        if not sock_path or not state_dir:
            raise ConfigError(f"this Ray node was not started by `gfaas node start --ray-address`, which tells its "
                              f"actors where the machine's node daemon is ({NODE_SOCKET_ENV}, {NODE_STATE_ENV}); "
                              "a code package's functions run only there")
        if msg.sandbox_uid < 0 or os.geteuid() != 0:
            raise ConfigError(f"function {msg.function!r} comes from a code package, which runs only sandboxed "
                              "under the workflow's uid: start the machine's `gfaas node start --ray-address` as root")
        digest = Path(msg.code_dir).name
        pkg = read_archive(package)  # checked again here: limits, paths, and that it is the package named
        if pkg.digest != digest:
            raise ConfigError(f"the code package sent for {msg.workflow}/{msg.function} has digest {pkg.digest[:12]}, "
                              f"not {digest[:12]}: refusing to run it")
        stored = CodeStore(code_root()).put(msg.workflow, pkg, group=msg.sandbox_gid)
        init_here = msgspec.structs.replace(msg, code_dir=str(stored.path),
                                            transport={"kind": "gfaas", "socket_path": sock_path})
        self.admin = Admin(sock_path, state_dir=state_dir)
        sock, welcome = self.admin.attach_socket()
        self.worker = ProcessWorker(init_here, binder=Binder(sock, welcome, sock_path))
        self.gpu = msg.gpu

    def ready(self) -> tuple[int, float, str]:
        return int(self.worker.pid), float(getattr(self.worker, "load_s", 0.0)), self.gpu

    def run(self, task: bytes) -> bytes:
        msg = _dec.decode(task)
        assert isinstance(msg, Task)
        # The worker's transport is this machine's daemon, whatever the gateway named (the same socket).
        msg = msgspec.structs.replace(msg, transport={})
        return _enc.encode(self.worker.run(msg))


def on_assigned_gpu(init: Init, ray_ids: Sequence[int | str], node_visible: Sequence[str] = ()) -> Init:
    """``init`` as the actor runs it: on the GPU Ray assigned it (``ray_ids``, ``ray.get_gpu_ids()``), not
    the one the runtime placed it on, since Ray picks the GPU. ``gpu`` names it as the machine's node
    daemon numbers it (:func:`~gfaas.runtime.gpus.ray_gpu_ordinal`), and a CUDA function computes on
    ``cuda:K`` with that same K: the actor sees the node's GPUs as the daemon does (:func:`_actor_gpu`
    gives it back the node's ``CUDA_VISIBLE_DEVICES`` before CUDA starts), so its inputs arrive in the
    daemon's pool of the GPU it computes on and device passing works on every GPU. Modelled GPUs stay
    placement only (the CPU computes). No GPU assigned: the CPU, no GPU."""
    if not ray_ids:
        if not init.gpu and not init.device.startswith("cuda"):
            return init
        return msgspec.structs.replace(init, device="cpu", gpu="")
    k = ray_gpu_ordinal(ray_ids[0], node_visible)  # a function asks for at most one GPU (gpus.ray_num_gpus)
    if not init.device.startswith("cuda"):
        return msgspec.structs.replace(init, gpu=f"gpu{k}")
    return msgspec.structs.replace(init, device=f"cuda:{k}", gpu=f"gpu{k}")


def node_numbering(environ: dict[str, str] | Any, node_visible: Sequence[str]) -> None:
    """Give a CUDA actor the node's GPU numbering (the daemon's): Ray narrowed its
    ``CUDA_VISIBLE_DEVICES`` to the assigned GPU, which makes that GPU ``cuda:0`` in the actor while
    the daemon's pool for it, which the actor's inputs and outputs pass through, is GPU K. Ray's
    accounting still reserves that GPU for the actor; the actor computes on it alone (``cuda:K``).
    Must run before CUDA starts in the process (the actor's first act)."""
    if node_visible:
        environ["CUDA_VISIBLE_DEVICES"] = ",".join(node_visible)
    else:
        environ.pop("CUDA_VISIBLE_DEVICES", None)


def _actor_gpu(msg: Any) -> Init:
    """The decoded ``Init`` of an actor, on the GPU Ray assigned it; as it came outside a Ray worker
    (tests run the actor bodies as plain objects)."""
    assert isinstance(msg, Init)
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return msg
    # The CUDA_VISIBLE_DEVICES the actor's Ray node started with: Ray replaced the actor's own with the
    # GPUs it assigned and keeps the original only on its worker (no public API has it).
    try:
        original = ray._private.worker.global_worker.original_visible_accelerator_ids or {}
    except AttributeError:  # another Ray: the ids are then taken as the daemon's ordinals
        original = {}
    visible = [str(v) for v in original.get("GPU") or ()]
    out = on_assigned_gpu(msg, ray.get_gpu_ids(), visible)
    if out.device.startswith("cuda"):
        node_numbering(os.environ, visible)
    return out


def _node_daemon() -> tuple[str, str]:
    """This machine's node daemon (socket, state directory), as its Ray node was told; "" if not."""
    return os.environ.get(NODE_SOCKET_ENV, ""), os.environ.get(NODE_STATE_ENV, "")


def code_root() -> str:
    """This machine's store of code packages for sandboxed actors: a directory of the actor's user in
    the temporary directory, refused if someone else made it (its packages would be theirs to swap)."""
    import stat
    import tempfile

    root = os.path.join(tempfile.gettempdir(), f"gfaas-code-{os.geteuid()}")
    os.makedirs(root, mode=0o711, exist_ok=True)
    st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise ConfigError(f"{root} is not a directory of uid {os.geteuid()}: remove it (code packages are stored there)")
    return root


def _actor_class(sandboxed: bool = False) -> Any:
    global _ACTOR, _SANDBOXED
    if sandboxed:
        if _SANDBOXED is None:
            _SANDBOXED = _ray().remote(SandboxedActor)
        return _SANDBOXED
    if _ACTOR is None:
        _ACTOR = _ray().remote(FunctionActor)
    return _ACTOR


def ensure_ray(address: str = "", num_cpus: int | None = None) -> bool:
    """Connect to (or start) Ray; True when this call started it (and so should shut it down)."""
    ray = _ray()
    if ray.is_initialized():
        return False
    kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "ignore_reinit_error": True}
    if address:
        kw["address"] = address
    elif num_cpus is not None:
        kw["num_cpus"] = num_cpus
    env = {k: os.environ[k] for k in ("PYTHONPATH",) if os.environ.get(k)}
    if env:  # handler modules must import inside the actors too
        kw["runtime_env"] = {"env_vars": env}
    ray.init(**kw)
    return True


def shutdown_ray() -> None:
    _ray().shutdown()


class RayWorker:
    """A function slot backed by one Ray actor."""

    def __init__(self, init: Init, *, num_cpus: float, num_gpus: float = 0.0, start_timeout: float = 300.0,
                 resources: dict[str, float] | None = None, package: bytes | None = None) -> None:
        """``package``: the archive of ``init``'s code package (its digest is ``init.code_dir``'s name):
        the function runs sandboxed on its machine (:class:`SandboxedActor`)."""
        ray = _ray()
        self._ray = ray
        self._dead = False
        cluster = ray.cluster_resources()
        total = float(cluster.get("CPU", 0.0))
        if num_cpus > total:
            raise ConfigError(f"function {init.function!r} asks Ray for {num_cpus} CPUs but the whole cluster has "
                              f"{total:g}; lower ray_cpus_per_worker or add Ray nodes")
        gpus = float(cluster.get("GPU", 0.0))
        if num_gpus > gpus:
            raise ConfigError(f"function {init.function!r} asks Ray for {num_gpus:g} GPUs but the whole cluster has "
                              f"{gpus:g}; add Ray nodes with GPUs (`ray start --num-gpus N` models them on a "
                              "CPU-only machine) or lower the function's resources.gpus")
        # ``resources`` pins the actor to one gfaas node (runtime.cluster.ray_resource). A code package
        # travels with the actor's start (Ray's object store carries it to the machine).
        cls = _actor_class(sandboxed=package is not None).options(
            num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=0, max_task_retries=0, resources=resources or {})
        self.actor = cls.remote(_enc.encode(init)) if package is None else cls.remote(_enc.encode(init), package)
        try:
            self.pid, self.load_s, self.gpu = ray.get(self.actor.ready.remote(), timeout=start_timeout)
        except Exception as exc:  # noqa: BLE001 - Ray wraps the actor's own error
            self.stop()
            cause = getattr(exc, "cause", None) or exc
            # (Ray hands the actor's own exception back as ``cause``, or only in its text)
            if isinstance(cause, ConfigError) or "ConfigError" in str(exc):
                raise MachineRefused(f"Ray actor for function {init.function!r} could not start: "
                                     f"{str(cause).strip().splitlines()[-1]}") from None
            free = ray.available_resources()
            asks = f"{num_cpus:g} CPUs" + (f" and {num_gpus:g} GPUs" if num_gpus else "")
            raise FunctionFailed(f"Ray actor for function {init.function!r} could not start within {start_timeout:g} s "
                                 f"({type(exc).__name__}: {exc}); Ray has {free.get('CPU', 0.0):g} CPUs and "
                                 f"{free.get('GPU', 0.0):g} GPUs free and this actor asks for {asks}: lower "
                                 "ray_cpus_per_worker (or its resources.gpus) or add Ray nodes") from None
        self.name = f"{init.function}@ray:{self.pid}"
        self.function = init.function

    def run(self, task: Task, timeout_s: float | None = None) -> Reply:
        """Run ``task`` on the actor; past ``timeout_s`` the actor is killed (:class:`TaskTimedOut`)."""
        try:
            out = self._ray.get(self.actor.run.remote(_enc.encode(task)), timeout=timeout_s)
        except self._ray.exceptions.GetTimeoutError:
            self.stop()
            raise TaskTimedOut(self.function, self.name, float(timeout_s or 0.0)) from None
        except self._ray.exceptions.RayActorError as exc:
            self._dead = True
            raise WorkerDied(f"Ray actor {self.name} died while it held a task: {type(exc).__name__}") from None
        reply = _dec.decode(out)
        assert isinstance(reply, Done | Failed)
        return reply

    def alive(self) -> bool:
        return not self._dead

    def stop(self) -> None:
        self._dead = True
        try:
            self._ray.kill(self.actor)
        except Exception:  # noqa: BLE001, S110 - already gone
            pass
