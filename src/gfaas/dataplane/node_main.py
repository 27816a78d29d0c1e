"""Entry point of a daemon process: ``python -m gfaas.dataplane.node_main --config-fd N``.

The configuration arrives as JSON on an inherited descriptor (a pipe, see ``local.start_daemon``),
not in argv: a Redis password in it must not show in ``/proc/PID/cmdline``.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import sys

from ..config import NodeConfig
from ..errors import ConfigError
from ..gcpause import freeze_startup
from ..lifeline import watch
from ..secfiles import replace_file
from .daemon import Daemon

log = logging.getLogger("gfaas.dataplane")


_USAGE = "usage: python -m gfaas.dataplane.node_main --config-fd N [--lifeline-fd M]"


def parse_argv(argv: list[str]) -> tuple[int, int | None]:
    """The descriptors ``--config-fd N`` and, if given, ``--lifeline-fd M``."""
    if len(argv) not in (2, 4) or argv[0] != "--config-fd" or not all(a.isdigit() for a in argv[1::2]) \
            or (len(argv) == 4 and argv[2] != "--lifeline-fd"):
        raise ConfigError(f"{_USAGE} (got {len(argv)} arguments); the configuration is never passed in argv")
    return int(argv[1]), int(argv[3]) if len(argv) == 4 else None


def read_config(argv: list[str]) -> NodeConfig:
    """The configuration named by ``--config-fd N`` (read whole, then closed)."""
    fd, _ = parse_argv(argv)
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return NodeConfig(**json.loads(b"".join(chunks)))


def raise_fd_limit() -> int:
    """Raise this process's soft descriptor limit to the hard one (every client connection and
    segment holds one); returns the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("could not raise the descriptor limit from %d to %d: %s", soft, hard, exc)
    return soft


def main(config: NodeConfig | None = None) -> None:
    logging.basicConfig(level=os.environ.get("GFAAS_LOG", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    lifeline = None
    if config is None:
        _, lifeline = parse_argv(sys.argv[1:])
        config = read_config(sys.argv[1:])
    log.info("node configuration: %r (descriptor limit %d)", config, raise_fd_limit())  # the repr hides passwords
    remote = None
    if config.transfer_host is not None or config.redis_url is not None:
        from .remote import Remote  # cross-node support

        remote = Remote(config)
    daemon = Daemon(config, remote)
    daemon.bind()
    if lifeline is not None:
        watch(lifeline, daemon.stop, what="this node daemon")
    pid_file = os.path.join(config.state_dir, "daemon.pid")
    replace_file(pid_file, str(os.getpid()).encode(), sync=False)  # never written through a symlink
    freeze_startup()
    try:
        daemon.serve_forever()
    finally:
        try:
            os.unlink(pid_file)
        except FileNotFoundError:
            pass


if __name__ == "__main__":
    main()
