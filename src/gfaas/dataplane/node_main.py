"""Entry point of a daemon process: ``python -m gfaas.dataplane.node_main '<config json>'``."""

from __future__ import annotations

import json
import logging
import os
import sys

from ..config import NodeConfig
from .daemon import Daemon


def main() -> None:
    logging.basicConfig(level=os.environ.get("GFAAS_LOG", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = NodeConfig(**json.loads(sys.argv[1]))
    remote = None
    if config.transfer_host is not None or config.redis_url is not None:
        from .remote import Remote  # cross-node support

        remote = Remote(config)
    daemon = Daemon(config, remote)
    daemon.bind()
    pid_file = os.path.join(config.state_dir, "daemon.pid")
    with open(pid_file, "w") as f:
        f.write(str(os.getpid()))
    try:
        daemon.serve_forever()
    finally:
        try:
            os.unlink(pid_file)
        except FileNotFoundError:
            pass


if __name__ == "__main__":
    main()
