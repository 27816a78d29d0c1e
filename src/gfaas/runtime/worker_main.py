"""Entry point of a worker process: ``python -m gfaas.runtime.worker_main FD`` (see :mod:`.worker`).

Separate from :mod:`.worker` so that module is imported once, under its own name, not again as
``__main__``."""

import sys

from .worker import serve_fd

if __name__ == "__main__":
    sys.exit(serve_fd(int(sys.argv[1])))
