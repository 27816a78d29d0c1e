"""The node data plane: a daemon per node, a client library for functions, pluggable backends."""

from .client import Admin, Buffer, Client, Credentials, DeviceBuffer, InvocationHandle, connect
from .device_client import DeviceView
from .ids import DataRef

__all__ = ["Admin", "Buffer", "Client", "Credentials", "DataRef", "DeviceBuffer", "DeviceView", "InvocationHandle",
           "connect"]
