"""What every CLI command that talks to a running gateway shares: where the gateway is and its token.

One rule for ``deploy``, ``invoke``, ``workflows list|show|status|versions|rollback`` and ``logs``:

* the gateway is ``--url``, else ``$GFAAS_URL``, else ``http://127.0.0.1:8080`` (where ``gfaas serve``
  listens by default);
* its bearer token comes from ``--token-file FILE``, else ``$GFAAS_GATEWAY_TOKEN`` or the file named by
  ``$GFAAS_GATEWAY_TOKEN_FILE``, else the token file ``gfaas serve`` keeps in its default state
  directory (``gfaas serve`` prints its path), so on the machine that serves nothing needs setting.

A token is never taken on the command line: every local user can read another's argv.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8080"
ENV_URL = "GFAAS_URL"


def add_gateway_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default="", help=f"the gateway (default ${ENV_URL}, else {DEFAULT_URL})")
    p.add_argument("--token-file", default="", metavar="FILE",
                   help="the gateway's token file (default $GFAAS_GATEWAY_TOKEN or $GFAAS_GATEWAY_TOKEN_FILE, else "
                        "the file gfaas serve keeps in its state directory, whose path it prints)")


def gateway_url(a: argparse.Namespace) -> str:
    return str(getattr(a, "url", "") or os.environ.get(ENV_URL) or DEFAULT_URL)


def default_token_file() -> Path:
    """Where ``gfaas serve`` keeps its token when given no ``--state-dir`` or ``--token-file``."""
    from .config import default_run_dir
    from .runtime.gateway.auth import TOKEN_FILE

    return Path(default_run_dir()) / "gateway" / TOKEN_FILE


def token_file(a: argparse.Namespace) -> str | None:
    """The token file to read: ``--token-file``; None when the environment names the token (the client
    reads it); else ``gfaas serve``'s default file when it exists (None: no token is sent)."""
    given = getattr(a, "token_file", "") or ""
    if given:
        return str(given)
    if os.environ.get("GFAAS_GATEWAY_TOKEN") or os.environ.get("GFAAS_GATEWAY_TOKEN_FILE"):
        return None
    default = default_token_file()
    return str(default) if default.exists() else None


def client(a: argparse.Namespace, timeout: float = 600.0) -> Any:
    """A :class:`~gfaas.runtime.client_http.GatewayClient` for the gateway these arguments name."""
    from .runtime.client_http import GatewayClient

    return GatewayClient(gateway_url(a), token_file=token_file(a), timeout=timeout)
