"""The node data plane: a daemon per node, a client library for functions, pluggable backends."""

from .client import Admin, Buffer, Client, Credentials, InvocationHandle, connect
from .ids import DataRef

__all__ = ["Admin", "Buffer", "Client", "Credentials", "DataRef", "InvocationHandle", "connect"]
