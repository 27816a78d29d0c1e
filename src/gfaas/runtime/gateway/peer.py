"""Who is on the other end of a loopback TCP connection: its socket's owner uid, from /proc/net/tcp.

The dashboard's read-only views need no token on loopback, but function code runs on the same
machine (sandboxed under tenant uids, docs/security) and must not read the node's state. So
"loopback" means: a client socket owned by the gateway's own user. The kernel lists every TCP
socket with its owner; the client's is the one whose local end is the request's client address and
whose remote end is the server's. Anything unreadable or unmatched is no one (the token is needed).
"""

from __future__ import annotations

import ipaddress
import os


def _hex_addr(text: str) -> tuple[str, int]:
    """'0100007F:1F90' -> ('127.0.0.1', 8080); IPv6 as four little-endian 32-bit words."""
    ip_hex, port_hex = text.split(":")
    raw = bytes.fromhex(ip_hex)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words)), int(port_hex, 16)


def _norm(host: str) -> str:
    ip = ipaddress.ip_address(host)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(_norm(host)).is_loopback
    except ValueError:
        return False


def peer_uid(client: tuple[str, int], server: tuple[str, int], proc: str = "/proc/net") -> int | None:
    """The uid owning the client end of a loopback connection ``client`` -> ``server``; None if unknown."""
    try:
        want = ((_norm(client[0]), int(client[1])), (_norm(server[0]), int(server[1])))
    except (ValueError, TypeError, IndexError):
        return None
    for name in ("tcp", "tcp6"):
        try:
            with open(os.path.join(proc, name)) as f:
                next(f, None)  # the header
                for line in f:
                    cols = line.split()
                    if len(cols) < 8:
                        continue
                    try:
                        local, remote = _hex_addr(cols[1]), _hex_addr(cols[2])
                        if ((_norm(local[0]), local[1]), (_norm(remote[0]), remote[1])) == want:
                            return int(cols[7])
                    except ValueError:
                        continue
        except OSError:
            continue
    return None


def same_user_on_loopback(client: tuple[str, int] | None, server: tuple[str, int] | None) -> bool:
    """Whether the request comes from this machine, from a socket of the gateway's own user."""
    if not client or not server or not is_loopback(client[0]):
        return False
    return peer_uid(client, server) == os.geteuid()
