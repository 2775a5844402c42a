"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, and the handlers
that give FastAPI's own errors (validation, unknown route, wrong method) that shape too.

OpenAI clients read these fields: the SDK raises `BadRequestError` (400), `AuthenticationError`
(401), `NotFoundError` (404), `RateLimitError` (429, retried after `Retry-After`) and
`APIStatusError` for the rest, each carrying the message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from openai.types import ErrorObject
from starlette.exceptions import HTTPException

INVALID_REQUEST = "invalid_request_error"


class APIError(Exception):
    """An error answered to the client in OpenAI's shape, with its HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = INVALID_REQUEST,
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message = status, message
        self.error = ErrorObject(message=message, type=type_, code=code, param=param)
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {"error": self.error.model_dump(exclude_unset=True)}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, code=code, param=param)


def param_of(loc: Sequence[Any]) -> str | None:
    """A pydantic error location as a parameter path: ("body", "messages", 0, "role") ->
    `messages[0].role`."""
    path = ""
    for part in loc:
        if part == "body" and not path:
            continue
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path or None


def describe_validation(errors: Sequence[Mapping[str, Any]], prefix: str = "") -> tuple[str, str]:
    """(message, param) of the first pydantic error: `param` is the field's path under
    `prefix`, and the message names it. An error of the whole object (a check across fields)
    has no path: its own message names the fields, and `param` is `prefix`."""
    error = errors[0]
    loc = [*([prefix] if prefix else []), *error.get("loc", ())]
    param = param_of(loc) or "body"
    message = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
    if error.get("loc"):
        message = f"{param}: {message}"
        if error.get("type") != "missing" and "input" in error:
            message += f", got {json.dumps(error['input'], default=str)[:80]}"
    return message, param


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return exc.response()


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's 422 for a malformed body becomes OpenAI's 400, naming the field."""
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    if errors and errors[0].get("type") == "json_invalid":
        detail = errors[0].get("ctx", {}).get("error", "")
        return bad_request(f"the body is not valid JSON: {detail}", code="invalid_json").response()
    if errors and tuple(errors[0].get("loc", ())) == ("body",):
        if not is_json(request.headers.get("content-type", "")):
            # FastAPI parses JSON only when the client says so: a browser page cannot then
            # make a local endpoint run graphs with a CSRF "simple request" (text/plain).
            return APIError(
                415,
                "send the body as JSON with the header Content-Type: application/json",
                code="unsupported_media_type",
            ).response()
        return bad_request("the body must be a JSON object", code="invalid_request").response()
    message, param = describe_validation(errors)
    code = "missing_required_parameter" if errors[0].get("type") == "missing" else "invalid_value"
    return bad_request(message, param, code).response()


def is_json(content_type: str) -> bool:
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or (
        kind.startswith("application/") and kind.endswith("+json")
    )


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's plain errors (404 route, 405 method, 413 body) in OpenAI's shape."""
    assert isinstance(exc, HTTPException)
    codes = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}
    error = APIError(
        exc.status_code,
        str(exc.detail),
        code=codes.get(exc.status_code),
        headers=exc.headers,
    )
    return error.response()


def install_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
