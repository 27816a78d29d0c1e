"""The on-disk cache of built models: ``<cache>/<name>-<scale>-<seed>-<version>.onnx``.

Each file has a ``.sha256`` sidecar written after it; a file whose digest does not match (truncated by
a crash, overwritten, or from a half-copied cache) is rebuilt rather than handed to onnxruntime,
whose error for a damaged protobuf does not say which file to delete. Both are written to a temporary
name and renamed, so concurrent builders never expose a partial file; they build identical bytes, so
whichever rename lands last is as good as the first.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path

from ..errors import ConfigError
from . import zoo

log = logging.getLogger("gfaas.models")

ENV = "GFAAS_CACHE_DIR"
# The protobuf limit: one serialized ModelProto cannot exceed 2 GiB. The largest full model here
# (GPT-2 small, fp32) is ~0.5 GB, so weights are stored inline.
_PROTOBUF_LIMIT = 2**31 - 1


def resolve_cache_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """``cache_dir`` if given, else ``$GFAAS_CACHE_DIR``, else ``~/.cache/gfaas/models``."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get(ENV)
    return Path(env) if env else Path.home() / ".cache" / "gfaas" / "models"


def file_name(name: str, scale: str, seed: int) -> str:
    return f"{name}-{scale}-{seed}-{zoo.VERSION}.onnx"


def _digest_file(p: Path) -> str:
    with p.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _write_atomic(target: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp makes 0600 files; a model cache is meant to be shared read-only like any download.
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _valid(p: Path, sidecar: Path) -> bool:
    try:
        want = sidecar.read_text(encoding="ascii").split()[0]
    except (OSError, IndexError, UnicodeDecodeError):
        return False
    try:
        return _digest_file(p) == want
    except OSError:
        return False


def path(name: str, scale: str = "small", seed: int = 0, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The cached ONNX file of ``build(name, scale, seed)``, built and saved on first use."""
    name, scale, seed = zoo.check_name(name), zoo.check_scale(scale), zoo.check_seed(seed)
    d = resolve_cache_dir(cache_dir)
    target = d / file_name(name, scale, seed)
    sidecar = target.with_name(target.name + ".sha256")
    if target.exists():
        if _valid(target, sidecar):
            log.debug("cache hit %s", target)
            return target
        log.warning("cached model %s is damaged or unverified (no matching %s); rebuilding it",
                    target, sidecar.name)
    d.mkdir(parents=True, exist_ok=True)
    data = zoo.build(name, scale, seed).SerializeToString()
    if len(data) > _PROTOBUF_LIMIT:  # pragma: no cover - no model in the zoo is this large
        raise ConfigError(f"model {name!r} at scale {scale!r} serializes to {len(data)} bytes, over the 2 GiB "
                              "protobuf limit; it needs external-data storage")
    digest = hashlib.sha256(data).hexdigest()
    _write_atomic(target, data)
    _write_atomic(sidecar, f"{digest}  {target.name}\n".encode("ascii"))
    log.info("built %s (%d bytes) into %s", target.name, len(data), d)
    return target
