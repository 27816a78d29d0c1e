"""The workflow runtime: specs, warm function workers, the invoker, executors and the HTTP gateway."""

from .context import Context, in_process_context
from .result import Breakdown, FunctionRecord, InvocationResult

__all__ = ["Breakdown", "Context", "FunctionRecord", "InvocationResult", "in_process_context"]
