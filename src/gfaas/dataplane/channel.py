"""The client end of a daemon connection: one request, one reply, file descriptors alongside."""

from __future__ import annotations

import array
import fcntl
import os
import select
import socket
import struct

from ..errors import DaemonUnavailable, error_from_code
from . import protocol as P

_FD_SPACE = socket.CMSG_SPACE(4 * 4)


class Channel:
    def __init__(self, socket_path: str, timeout: float | None = 60.0, sock: socket.socket | None = None) -> None:
        """Connect to the daemon at ``socket_path``, or adopt ``sock``, a connection to it that a more
        privileged process opened (a sandboxed function cannot reach the socket's directory)."""
        self.path = socket_path
        connected = sock is not None
        if sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.timeout = timeout
        if timeout is not None:
            # Kernel-side timeouts keep the socket in blocking mode: Python's own timeout mode would
            # add a poll() system call before every send and recv.
            tv = struct.pack("ll", int(timeout), int((timeout % 1) * 1e6))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
        try:
            if not connected:
                sock.connect(socket_path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            raise DaemonUnavailable(
                f"no node daemon at {socket_path} ({exc.strerror}); start one with 'gfaas node start'"
            ) from None
        except OSError as exc:
            sock.close()
            raise DaemonUnavailable(f"cannot connect to the node daemon at {socket_path}: {exc}") from None
        self.sock: socket.socket | None = sock
        self._poll = select.poll()
        self._poll.register(sock.fileno(), select.POLLIN | select.POLLHUP | select.POLLERR)

    def check(self) -> None:
        """Raise DaemonUnavailable if the daemon has gone (one non-blocking ``poll``, no message: for
        the calls that otherwise talk to the daemon only through shared memory)."""
        if self.sock is None:
            raise DaemonUnavailable(f"connection to {self.path} is closed")
        if self._poll.poll(0):  # nothing is ever unread on a live connection: readable means closed
            try:
                data = self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError as exc:
                self._broken(exc)
            if not data:
                self._broken(None)

    def handshake(self, hello: P._Msg) -> P.Reply:
        """Present credentials as the first request; the channel is closed if they are refused."""
        try:
            reply, _ = self.call(hello)
        except Exception:
            self.close()
            raise
        return reply

    def send(self, msg: P._Msg) -> None:
        """Send without waiting for a reply (asynchronous requests)."""
        if self.sock is None:
            raise DaemonUnavailable(f"connection to {self.path} is closed")
        try:
            self.sock.send(P.encode(msg))
        except OSError as exc:
            self._broken(exc)

    def call(self, msg: P._Msg) -> tuple[P.Reply, list[int]]:
        """Send a request, wait for its reply; raise the daemon's error as its own class."""
        return self.recv(P.encode(msg))

    def recv(self, request: bytes = b"") -> tuple[P.Reply, list[int]]:
        """Wait for the next reply (after sending ``request``, if given): the answer to a request sent
        before, perhaps by another process on this connection (the platform's ``Bind``)."""
        if self.sock is None:
            raise DaemonUnavailable(f"connection to {self.path} is closed")
        try:
            while True:
                try:
                    if request:
                        self.sock.send(request)
                        request = b""
                    data, anc, _flags, _ = self.sock.recvmsg(P.MAX_FRAME, _FD_SPACE)
                    break
                except BlockingIOError:
                    if not self._made_blocking():
                        raise
        except (BrokenPipeError, ConnectionResetError) as exc:
            self._refused(exc)
        except (TimeoutError, BlockingIOError):
            waited = self.timeout
            self.close()
            raise DaemonUnavailable(
                f"the node daemon at {self.path} did not answer within {waited} s; it may be hung or overloaded"
            ) from None
        except OSError as exc:
            self._broken(exc)
        fds: list[int] = []
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                a = array.array("i")
                a.frombytes(payload[: len(payload) - len(payload) % a.itemsize])
                fds.extend(a)
        if not data:
            for fd in fds:
                os.close(fd)
            self._broken(None)
        reply = P.decode_reply(data)
        if isinstance(reply, P.Error):
            raise error_from_code(reply.code, reply.message)
        return reply, fds

    def _made_blocking(self) -> bool:
        """Clear O_NONBLOCK if another holder of this connection set it (it is the connection's, not this
        descriptor's: a function holding a copy of its worker's connection can); False if it was clear,
        so the wait timed out (SO_RCVTIMEO)."""
        assert self.sock is not None
        flags = fcntl.fcntl(self.sock.fileno(), fcntl.F_GETFL)
        if not flags & os.O_NONBLOCK:
            return False
        fcntl.fcntl(self.sock.fileno(), fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
        return True

    def _refused(self, exc: OSError) -> None:
        """The daemon closed the connection; raise the error it left first (a refused connection:
        too many, no Hello in time, out of descriptors) if there is one."""
        try:
            data = self.sock.recv(P.MAX_FRAME, socket.MSG_DONTWAIT) if self.sock is not None else b""
        except OSError:
            data = b""
        if data:
            try:
                reply = P.decode_reply(data)
            except Exception:
                reply = None
            if isinstance(reply, P.Error):
                self.close()
                raise error_from_code(reply.code, reply.message)
        self._broken(exc)

    def _broken(self, exc: BaseException | None) -> None:
        self.close()
        why = f": {exc}" if exc else ""
        raise DaemonUnavailable(
            f"lost the connection to the node daemon at {self.path}{why}; objects it held may be lost"
        )

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
