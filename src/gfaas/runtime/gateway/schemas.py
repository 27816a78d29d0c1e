"""The gateway's request and response models: they make the OpenAPI schema (responses are written directly)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictStr, model_validator

DType = Literal["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                "float16", "float32", "float64", "complex64", "complex128"]


def _json_integer(value: Any) -> Any:
    """An integer as JSON Schema has it: ``3`` and ``3.0`` (a number with no fraction), not ``"3"`` or ``true``
    (row 15 of issue 14: ``1.0`` was schema-valid but refused)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("Input should be a valid integer")
    return value


class ArrayDoc(BaseModel):
    """An n-d array: raw C-order little-endian bytes, base64 (standard alphabet, padded)."""

    model_config = ConfigDict(extra="forbid")
    dtype: DType
    shape: list[Annotated[int, Field(ge=0), BeforeValidator(_json_integer)]] = Field(max_length=32, description="[] for a 0-d array")
    data_b64: StrictStr

    def as_doc(self) -> dict[str, Any]:
        """As :func:`gfaas.runtime.wire.decode_array` takes it."""
        return self.model_dump()


class ArrayDigest(BaseModel):
    """An output summarised (``?outputs=digest``): SHA-256 of the bytes ``data_b64`` would carry."""

    dtype: DType
    shape: list[int]
    sha256: str


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)  # an absent field is not a null one: the schema shows no null default


class InvocationRequest(BaseModel):
    """Exactly one of ``inputs`` (an array per declared input) or ``seed`` (the workflow's own generator).

    The schema says so (``oneOf``), and fields are left out rather than sent as ``null``."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "oneOf": [{"required": ["inputs"]}, {"required": ["seed"]}]})
    # Not Optional: a field is left out, never null (the default None is what "left out" reads as).
    inputs: dict[str, ArrayDoc] = Field(None, json_schema_extra=_no_default)  # type: ignore[arg-type]
    seed: Annotated[int, Field(ge=0, le=2**53 - 1), BeforeValidator(_json_integer)] = Field(  # type: ignore[assignment]
        None, json_schema_extra=_no_default)
    transport: Literal["gfaas", "redis"] = Field(
        None, json_schema_extra=_no_default,  # type: ignore[arg-type]
        description="how data passes between functions for this invocation (default: the runtime's)")

    @model_validator(mode="after")
    def _one_source(self) -> InvocationRequest:
        if (self.inputs is None) == (self.seed is None):
            raise ValueError("give exactly one of `inputs` ({NAME: {dtype, shape, data_b64}}) or `seed` (an "
                             "integer for the workflow's input generator)"
                             + (", not both" if self.inputs is not None else ""))
        return self


class DeployResponse(BaseModel):
    workflow: str


class RollbackRequest(BaseModel):
    version: int = Field(ge=1, description="the version whose spec and code become current again")


class RollbackResponse(BaseModel):
    workflow: str
    version: int = Field(description="the new version made from it")


class UndeployResponse(BaseModel):
    workflow: str
    status: Literal["undeployed"]


class WorkflowList(BaseModel):
    workflows: list[str]


class Health(BaseModel):
    status: Literal["ok"]


class InvocationStatus(BaseModel):
    invocation_id: str
    status: str


class InvocationAccepted(BaseModel):
    """An invocation that has not finished: where to ask about it."""

    invocation_id: str
    status: str
    status_url: str
    result_url: str


class BreakdownDoc(BaseModel):
    queue_s: float
    host_pass_s: float
    fn_pass_s: float
    compute_s: float
    total_s: float
    cold_start_s: float | None = Field(default=None, description="seconds spent starting workers for this "
                                       "invocation (within queue_s); present only when a cold start happened")


class FunctionDoc(BaseModel):
    function: str
    worker: str
    queued_s: float
    get_s: float
    compute_s: float
    put_s: float
    skipped: bool
    cold_start_s: float | None = Field(default=None, description="seconds (within queued_s) this call waited "
                                       "for its worker to start and load its model; absent on a warm worker")


class FailureDoc(BaseModel):
    """The function whose run failed the invocation: its exception type, traceback and last log lines."""

    function: str
    error: str
    trace: str
    logs: list[str]


class ResultDocument(BaseModel):
    """A finished invocation. ``status`` is ``done`` or ``failed`` (then ``error`` says why, and
    ``failure``, when a function's run failed it, holds that function's traceback and last log lines)."""

    invocation_id: str
    workflow: str
    status: Literal["done", "failed"]
    error: str | None
    outputs: dict[str, ArrayDoc | ArrayDigest]
    scalars: dict[str, Any]
    breakdown: BreakdownDoc
    functions: list[FunctionDoc]
    failure: FailureDoc | None = None


class FieldError(BaseModel):
    field: str
    message: str


class ErrorBody(BaseModel):
    """Every error response. Some carry more: ``errors`` (422), ``retry_after_s`` (429), the invocation's
    ``invocation_id``/``status``/``status_url``/``result_url`` (504)."""

    model_config = ConfigDict(extra="allow")
    error: str
    message: str
    errors: list[FieldError] | None = None


def _responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorBody} for code in codes}



def document_security(app: Any, open_paths: frozenset[str]) -> None:
    """Make ``app``'s OpenAPI schema state the guard's rules (:mod:`.guard`): a bearer token on every
    operation but those of ``open_paths``, and the guard's answers (401, 503; 408 and 413 where there is
    a body), so a schema-driven client knows every status it can get."""
    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return dict(app.openapi_schema)
        schema = original()
        error = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}}
        schema.setdefault("components", {}).setdefault("securitySchemes", {})["bearer"] = {
            "type": "http", "scheme": "bearer",
            "description": "the gateway's token (gfaas serve prints the file that holds it)"}
        schema["security"] = [{"bearer": []}]
        for path, ops in schema.get("paths", {}).items():
            for op in ops.values():
                if path in open_paths:
                    op["security"] = []
                    continue
                responses = op.setdefault("responses", {})
                responses.setdefault("401", {"description": "no or a wrong bearer token", **error})
                responses.setdefault("503", {"description": "too many requests in progress; retry", **error})
                if "requestBody" in op:
                    responses.setdefault("408", {"description": "the body did not arrive in time", **error})
                    responses.setdefault("413", {"description": "the body is over the limit", **error})
        app.openapi_schema = schema
        return schema

    app.openapi = openapi
