"""Entry point of a spawned worker process (see :mod:`.worker`):
``gfaas.pyexec.module_argv("gfaas.runtime.worker_main", FD)``, an isolated interpreter.

Separate from :mod:`.worker` so that module is imported once, under its own name, not again as
``__main__``."""

import sys


def main(argv: list[str]) -> int:
    from .worker import serve_fd

    return serve_fd(int(argv[0]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
