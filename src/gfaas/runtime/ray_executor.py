"""The Ray executor: each function slot is a Ray actor hosting the same :class:`FunctionHost`.

Ray places and supervises the actors (CPU/GPU resource requests per function kind); data never goes
through Ray's object store: the actors open the gfaas transport with the invocation's credentials,
exactly like local worker processes. On a multi-node Ray cluster every node runs its own gfaas node
daemon at the same socket path (``gfaas node start``), which is what the actors connect to.

Control messages cross as msgspec bytes, so Ray pickles nothing of ours. ``ray`` is an optional extra.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import ConfigError, FunctionFailed, require_extra
from .logs import Capture
from .worker import Done, Failed, FunctionHost, Init, Reply, Task, TaskTimedOut, WorkerDied, _dec, _enc

_ACTOR: Any = None


def _ray() -> Any:
    return require_extra("ray", "ray")


class FunctionActor:
    """The actor body: a function host. Defined at module level so Ray pickles it by reference."""

    def __init__(self, init: bytes) -> None:
        msg = _dec.decode(init)
        assert isinstance(msg, Init)
        # The actor's process serves this function only: its prints and records are the function's log
        # (runtime.logs), carried with each reply as a worker process does; start-up lines go with the first.
        self.cap = Capture()
        self.cap.install()
        self.host = FunctionHost(msg)

    def ready(self) -> tuple[int, float]:
        return os.getpid(), self.host.load_s

    def run(self, task: bytes) -> bytes:
        msg = _dec.decode(task)
        assert isinstance(msg, Task)
        self.cap.begin()
        reply = self.host.run(msg)
        reply.logs = self.cap.take()
        return _enc.encode(reply)


def _actor_class() -> Any:
    global _ACTOR
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
                 resources: dict[str, float] | None = None) -> None:
        ray = _ray()
        self._ray = ray
        self._dead = False
        total = float(ray.cluster_resources().get("CPU", 0.0))
        if num_cpus > total:
            raise ConfigError(f"function {init.function!r} asks Ray for {num_cpus} CPUs but the whole cluster has "
                              f"{total:g}; lower ray_cpus_per_worker or add Ray nodes")
        # A version's code package is read from the runtime's store by path, which holds on this
        # machine only: on a multi-machine cluster, deploy handlers installed on every machine
        # (docs/deploy.md). ``resources`` pins the actor to one gfaas node (runtime.cluster.ray_resource).
        self.actor = _actor_class().options(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=0,
                                            max_task_retries=0, resources=resources or {}).remote(_enc.encode(init))
        try:
            self.pid, self.load_s = ray.get(self.actor.ready.remote(), timeout=start_timeout)
        except Exception as exc:  # noqa: BLE001 - Ray wraps the actor's own error
            self.stop()
            free = ray.available_resources().get("CPU", 0.0)
            raise FunctionFailed(f"Ray actor for function {init.function!r} could not start within {start_timeout:g} s "
                                 f"({type(exc).__name__}: {exc}); Ray has {free:g} CPUs free and each function actor "
                                 f"asks for {num_cpus:g}: lower ray_cpus_per_worker or add Ray nodes") from None
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
